"""One message format for every stream: encode, and read from a non-blocking socket.

A message is a *kind* byte and a list of frames::

    [kind: 1][frame count: u32][length of each frame: u64...][frame 0][MAC: 16][frame 1]...

The MAC (:class:`~fiberrl._wire.auth.Signer`) covers everything before it and frame 0,
the one frame that may be unpickled (a pickle stream, a header), after the same of
every earlier message on the stream (so it signs the message's place too). Later
frames are out-of-band buffers (numpy data, the payload of ``send_bytes``): their
lengths are signed, their bytes are not hashed, because they are only ever used as
buffers by an authenticated pickle stream and hashing them would halve the
throughput of large arrays.

Small messages are written in one piece; a large one is received straight into
buffers of its frames' sizes (one copy from the kernel, none after; each out-of-band
frame in a buffer of its own, so it starts aligned), so a 16 MiB array costs one
``recvmsg_into`` loop.
"""
from __future__ import annotations

import collections
import itertools
import socket
import struct
import threading
from typing import Any, Deque, List, Optional, Sequence, Tuple

from ..errors import ForgedMessageError
from .auth import MAC_BYTES, Signer, Verifier
from .sockets import wait_for

Message = Tuple[bytes, List[Any]]   # (kind, frames)

_HEAD = struct.Struct("!cI")
_LEN = struct.Struct("!Q")
#: the head of a message of one frame: kind, frame count (1), the frame's length
ONE_HEAD_FORMAT = "!cIQ"
_HEAD_ONE = struct.Struct(ONE_HEAD_FORMAT)
_HEAD_ONE_BYTES = _HEAD_ONE.size
_unpack_head_one = _HEAD_ONE.unpack_from
_MAX_FRAMES = 1 << 16
_ONE_PIECE = 1 << 16          # messages below this are joined into one write
_BIG = 1 << 20                # messages above this are received into their own buffer
_SCRATCH_BYTES = 1 << 18
IOV_MAX = 64                  # pieces handed to one sendmsg call
SMALL = _ONE_PIECE            # a frame below this may be sent with ``encode_one``


def encode_one(signer: Signer, kind: bytes, frame: bytes) -> bytes:
    """Frame and sign a message of one ``bytes`` frame under 64 KiB (the common small
    message): one piece."""
    signed = _HEAD_ONE.pack(kind, 1, len(frame)) + frame
    return signed + signer.sign_one(signed)


def write_signed(sock: socket.socket, signer: Signer, signed: bytes) -> None:
    """Write a message of one frame whose head (packed as :data:`ONE_HEAD_FORMAT`) and
    frame are ``signed``, its MAC appended: one system call unless the socket's buffer
    is full (a pipe's small message, framed by its sender in one ``pack``)."""
    message = signed + signer.sign_one(signed)
    try:
        sent = sock.send(message)
    except (BlockingIOError, InterruptedError):
        sent = 0
    if sent != len(message):
        write_all(sock, [memoryview(message)[sent:]])


def encode(signer: Signer, kind: bytes, frames: Sequence[Any]) -> List[Any]:
    """Frame and sign one message; returns the pieces to write (large frames uncopied)."""
    if len(frames) == 1 and type(frames[0]) is bytes and len(frames[0]) < _ONE_PIECE:
        return [encode_one(signer, kind, frames[0])]
    views = [f if type(f) is bytes else memoryview(f).cast("B") for f in frames]
    sizes = [len(v) if type(v) is bytes else v.nbytes for v in views]
    head = _HEAD.pack(kind, len(views)) + b"".join([_LEN.pack(n) for n in sizes])
    digest = signer.sign(head, views[0]) if views else signer.sign(head)
    if sum(sizes) < _ONE_PIECE:
        return [b"".join([head, *views[:1], digest, *views[1:]])]
    return [head, *views[:1], digest, *views[1:]]


def drop_written(pieces: Deque[Any], written: int) -> None:
    """Remove the first ``written`` bytes from a queue of pieces being written (or
    buffers being filled): each step is O(1), so a message of many frames costs time
    in proportion to its frames."""
    while written and pieces:
        size = len(pieces[0]) if type(pieces[0]) is bytes else pieces[0].nbytes
        if written >= size:
            written -= size
            pieces.popleft()
        else:
            pieces[0] = memoryview(pieces[0])[written:]
            written = 0


def first_pieces(pieces: Deque[Any]) -> List[Any]:
    """The pieces one ``sendmsg``/``recvmsg_into`` call takes (at most ``IOV_MAX``)."""
    return list(itertools.islice(pieces, IOV_MAX))


def write_all(sock: socket.socket, pieces: List[Any]) -> None:
    """Write every piece on a non-blocking socket, waiting while its buffer is full
    (the socket stays non-blocking, so a thread reading it is never stalled)."""
    if len(pieces) == 1 and type(pieces[0]) is bytes:   # the common small message
        try:
            sent = sock.send(pieces[0])
        except (BlockingIOError, InterruptedError):
            sent = 0
        if sent == len(pieces[0]):
            return
        queue = collections.deque([memoryview(pieces[0])[sent:]])
    else:
        queue = collections.deque(pieces)
    while queue:
        try:
            if len(queue) == 1:
                drop_written(queue, sock.send(queue[0]))
            else:
                drop_written(queue, sock.sendmsg(first_pieces(queue)))
        except (BlockingIOError, InterruptedError):
            wait_for(sock.fileno(), writable=True)


_scratch = threading.local()


def scratch_buffer() -> Tuple[bytearray, memoryview]:
    """This thread's receive buffer, and a view of it: ``recv`` of 256 KiB would map
    fresh memory each call. What is read into it must be used (or copied) before the
    thread reads again."""
    try:
        return _scratch.pair
    except AttributeError:   # this thread's first read
        buf = bytearray(_SCRATCH_BYTES)
        pair = _scratch.pair = (buf, memoryview(buf))
        return pair


def _receive(sock: socket.socket, into: Any) -> int:
    """``recv_into`` on a non-blocking socket (``recvmsg_into`` when ``into`` is a deque
    of buffers to fill in turn): 0 if nothing is there yet; ``EOFError`` when the
    stream ended or broke."""
    try:
        n = (sock.recvmsg_into(first_pieces(into))[0] if type(into) is collections.deque
             else sock.recv_into(into))
    except (BlockingIOError, InterruptedError):
        return 0
    except OSError as exc:
        raise EOFError(str(exc)) from None
    if not n:
        raise EOFError("the peer closed the stream")
    return n


class FrameReader:
    """Reads verified messages from the receiving side of one stream (non-blocking).

    Its state is public for a reader that reads the socket itself when no message is
    begun (the pipe's hot path, :meth:`fiberrl._services.pipe_inbox.Inbox.take`):
    ``partial`` holds the bytes of a message begun, ``big`` a large message being
    received into its own buffers, and ``verifier`` checks each message's MAC, in
    order; bytes such a reader cannot use go to :meth:`absorb`.
    """

    __slots__ = ("sock", "verifier", "partial", "big")

    def __init__(self, sock: socket.socket, verifier: Verifier, initial: bytes = b"") -> None:
        self.sock = sock
        self.verifier = verifier
        self.partial = bytearray(initial)
        self.big: Optional[list] = None   # [kind, sizes, head, parts, empty]

    def pending(self) -> List[Message]:
        """Complete messages among bytes already received (none read from the socket)."""
        if not self.partial or self.big is not None:
            return []
        out, used = self._parse(self.partial, len(self.partial))
        del self.partial[:used]
        return out

    def read(self) -> List[Message]:
        """Read what the socket has; return the complete messages.

        Raises ``EOFError`` when the stream ended (:class:`ForgedMessageError`, an
        ``EOFError``, when it carried a forged or malformed message).
        """
        if self.big is not None:
            return self._read_big()
        scratch, view = scratch_buffer()
        try:
            n = self.sock.recv_into(scratch)
        except (BlockingIOError, InterruptedError):
            return []
        except OSError as exc:
            raise EOFError(str(exc)) from None
        if not n:
            raise EOFError("the peer closed the stream")
        return self.absorb(scratch, view, n)

    def absorb(self, scratch: bytearray, view: memoryview, n: int) -> List[Message]:
        """The complete messages among ``n`` bytes just read into :func:`scratch_buffer`
        (``scratch``, and ``view`` of it) after what came before; the rest is kept
        for the next read. ``ForgedMessageError`` as :meth:`read` raises it."""
        if n > _HEAD_ONE_BYTES and not self.partial:   # the usual case: one small message
            kind, count, size = _unpack_head_one(scratch)
            signed_end = _HEAD_ONE_BYTES + size
            if n == signed_end + MAC_BYTES and count == 1:
                self.verifier.check_one(view[signed_end:n], view[:signed_end])
                return [(kind, [bytes(view[_HEAD_ONE_BYTES:signed_end])])]
        if self.partial:
            self.partial += view[:n]
            out, used = self._parse(self.partial, len(self.partial))
            del self.partial[:used]
        else:  # the usual case: parse straight from the scratch buffer
            out, used = self._parse(view, n)
            if used < n:
                self.partial = bytearray(view[used:n])
        return out

    def _parse(self, data: Any, end: int) -> Tuple[List[Message], int]:
        """Complete messages in ``data[:end]`` and how many bytes they used."""
        pos, out = 0, []
        while end - pos >= _HEAD.size:
            kind, count = _HEAD.unpack_from(data, pos)
            if count == 1 and end - pos >= _HEAD_ONE.size:   # the common small message
                size = _LEN.unpack_from(data, pos + _HEAD.size)[0]
                signed_end = pos + _HEAD_ONE.size + size
                if end >= signed_end + MAC_BYTES:
                    # (one update over header and frame: the same digest as two)
                    self.verifier.check(data[signed_end:signed_end + MAC_BYTES],
                                        data[pos:signed_end])
                    out.append((kind, [bytes(data[pos + _HEAD_ONE.size:signed_end])]))
                    pos = signed_end + MAC_BYTES
                    continue
            if count > _MAX_FRAMES:
                raise ForgedMessageError("malformed message (too many frames)")
            meta = pos + _HEAD.size + count * _LEN.size
            if end < meta:
                break
            sizes = _sizes(data, pos, count)
            total = meta + sum(sizes) + MAC_BYTES
            if end < total:
                if total - pos >= _BIG:
                    self._start_big(data, pos, end, kind, sizes, meta)
                    pos = end
                break
            signed_end = meta + (sizes[0] if count else 0)
            self.verifier.check(data[signed_end:signed_end + MAC_BYTES], data[pos:meta],
                                data[meta:signed_end])
            frames = [bytes(data[meta:signed_end])] if count else []
            offset = signed_end + MAC_BYTES
            for size in sizes[1:]:   # writable copies, as numpy users expect
                frames.append(memoryview(bytearray(data[offset:offset + size])))
                offset += size
            out.append((kind, frames))
            pos = total
        return out, pos

    def _start_big(self, data: Any, pos: int, end: int, kind: bytes, sizes: List[int],
                   meta: int) -> None:
        """A large message: receive the rest straight into buffers of their frames' sizes.

        Frame 0 and its MAC share one buffer; every later frame gets its own, so that
        it starts where the allocator aligns memory (a tensor or an array built on it
        needs no copy to be aligned)."""
        first = sizes[0] if sizes else 0
        parts = [bytearray(first + MAC_BYTES), *[bytearray(n) for n in sizes[1:]]]
        empty = collections.deque(memoryview(part) for part in parts if part)
        received = memoryview(data)[meta:end]
        while received.nbytes:   # what came with the message's head
            n = min(received.nbytes, empty[0].nbytes)
            empty[0][:n] = received[:n]
            drop_written(empty, n)
            received = received[n:]
        self.big = [kind, sizes, bytes(data[pos:meta]), parts, empty]
        self.partial = bytearray()

    def _read_big(self) -> List[Message]:
        kind, sizes, head, parts, empty = self.big
        if empty:
            n = _receive(self.sock, empty)
            if not n:
                return []
            drop_written(empty, n)
            if empty:
                return []
        self.big = None
        first = sizes[0] if sizes else 0
        view = memoryview(parts[0])
        self.verifier.check(view[first:first + MAC_BYTES], head, view[:first])
        frames = [bytes(view[:first])] if sizes else []
        frames.extend(memoryview(part) for part in parts[1:])
        return [(kind, frames)]


def _sizes(data: Any, pos: int, count: int) -> List[int]:
    if count == 1:
        return [_LEN.unpack_from(data, pos + _HEAD.size)[0]]
    return list(struct.unpack_from(f"!{count}Q", data, pos + _HEAD.size))
