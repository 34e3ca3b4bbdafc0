"""The wire under ``Pipe``: an authenticated byte stream from a sender to one end's inbox.

ZeroMQ hands every message to an I/O thread on each side; for a ping-pong between two
processes that is four extra thread wake-ups per round trip, several times the cost
of the message itself. A pipe's data therefore goes over a plain stream socket (a
Unix socket between processes of one host, TCP between hosts) that the sending thread
writes and the receiving thread reads directly, as the stdlib's pipes do.

Connection set-up (the connector proves it holds the run's secret; the acceptor is
the receiving process's :class:`fiberrl.pipe_inbox.Acceptor` thread)::

    acceptor  -> connector : nonce_a (16 bytes)
    connector -> acceptor  : nonce_c (16) + proof (32) + len (1) + "pipe_id:end"
                             proof = HMAC-SHA256(secret, "fiberrl-pipe" + nonce_a + nonce_c + attach)
    acceptor  -> connector : 0x01 once the stream is attached to that end's inbox
                             (the socket is closed instead if the end is not active there)

After that the stream only flows from connector to acceptor. Each message is::

    [kind: 1 byte][frame count: u32][length of each frame: u64...][frame 0][MAC: 16 bytes]
    [frame 1][frame 2]...

with ``MAC = BLAKE2b(key=session key, everything before it)``, the session
key being derived from the secret and both nonces. Frame 0 is the pickle stream (or
empty for raw bytes); it is covered by the MAC, so nothing is unpickled that a holder
of the secret did not send on this very connection. Later frames (out-of-band numpy
buffers, the payload of ``send_bytes``) are length-checked but not hashed, as in
:mod:`fiberrl.transport`: they are never unpickled on their own, and hashing them
would halve the throughput of large arrays.
"""
from __future__ import annotations

import hashlib
import hmac
import os
import socket
import struct
import threading
import time
from typing import Any, List, Optional, Sequence, Tuple

from . import transport
from .errors import ForgedMessageError

NONCE_BYTES = 16
PROOF_BYTES = 32
ACK = b"\x01"
_MAC_BYTES = 16
_HEAD = struct.Struct("!cI")
_LEN = struct.Struct("!Q")
_HEAD_ONE = struct.Struct("!cIQ")
_MAX_FRAMES = 1 << 16
_ONE_PIECE = 1 << 16          # messages below this are joined into one write
_BIG = 1 << 20                # bodies above this are received straight into their buffer
_SCRATCH_BYTES = 1 << 18
_IOV_MAX = 64

Message = Tuple[bytes, List[Any]]   # (kind, frames)


def proof(nonce_a: bytes, nonce_c: bytes, attach: bytes) -> bytes:
    """What a connector sends to show it holds the run's secret."""
    return hmac.digest(transport.secret(), b"fiberrl-pipe" + nonce_a + nonce_c + attach, "sha256")


def session_key(nonce_a: bytes, nonce_c: bytes) -> bytes:
    """The per-connection key that signs every message on the stream."""
    return hmac.digest(transport.secret(), b"fiberrl-pipe-session" + nonce_a + nonce_c, "sha256")


def attach_label(pipe_id: str, end: int) -> bytes:
    """Names the inbox a stream is for, inside the set-up message."""
    return f"{pipe_id}:{end}".encode()


def _mac_state(key: bytes) -> "hashlib._Hash":
    return hashlib.blake2b(key=key, digest_size=_MAC_BYTES)


def encode(mac_state: Any, kind: bytes, frames: Sequence[Any]) -> List[Any]:
    """Frame one message; returns the pieces to write (large frames are not copied)."""
    if len(frames) == 1 and type(frames[0]) is bytes and len(frames[0]) < _ONE_PIECE:
        head = _HEAD_ONE.pack(kind, 1, len(frames[0]))   # the common small message
        mac = mac_state.copy()
        mac.update(head)
        mac.update(frames[0])
        return [head + frames[0] + mac.digest()]
    views = [f if isinstance(f, bytes) else memoryview(f).cast("B") for f in frames]
    sizes = [len(v) if isinstance(v, bytes) else v.nbytes for v in views]
    signed = [_HEAD.pack(kind, len(views)) + b"".join([_LEN.pack(n) for n in sizes])]
    if views:
        signed.append(views[0])
    mac = mac_state.copy()
    for part in signed:
        mac.update(part)
    if sum(sizes) < _ONE_PIECE:
        return [b"".join([*signed, mac.digest(), *views[1:]])]
    return [*signed, mac.digest(), *views[1:]]


def _drop_written(pieces: List[Any], written: int) -> None:
    while written and pieces:
        size = len(pieces[0]) if isinstance(pieces[0], bytes) else pieces[0].nbytes
        if written >= size:
            written -= size
            pieces.pop(0)
        else:
            pieces[0] = memoryview(pieces[0])[written:]
            written = 0


def write_all(sock: socket.socket, pieces: List[Any]) -> None:
    """Write every piece (blocking)."""
    if len(pieces) == 1:
        sock.sendall(pieces[0])
        return
    while pieces:
        _drop_written(pieces, sock.sendmsg(pieces[:_IOV_MAX]))


_scratch = threading.local()


def _scratch_buffer() -> Tuple[bytearray, memoryview]:
    """A receive buffer per thread: ``recv`` of 256 KiB would map fresh memory each call."""
    pair = getattr(_scratch, "pair", None)
    if pair is None:
        buf = bytearray(_SCRATCH_BYTES)
        pair = _scratch.pair = (buf, memoryview(buf))
    return pair


def _receive(sock: socket.socket, into: Any) -> int:
    """``recv_into`` on a non-blocking stream: 0 if nothing is there yet; ``EOFError``
    when the stream ended or broke."""
    try:
        n = sock.recv_into(into)
    except (BlockingIOError, InterruptedError):
        return 0
    except OSError as exc:
        raise EOFError(str(exc)) from None
    if not n:
        raise EOFError("stream closed")
    return n


class FrameReader:
    """Reads signed messages from the receiving side of one stream (non-blocking)."""

    def __init__(self, sock: socket.socket, key: bytes, initial: bytes = b"") -> None:
        self.sock = sock
        self._mac = _mac_state(key)
        self._buf = bytearray(initial)
        self._big: Optional[list] = None   # [kind, sizes, meta, body, view, filled]

    def read(self) -> List[Message]:
        """Read what the socket has; return the complete messages.

        Raises ``EOFError`` when the stream ended (:class:`ForgedMessageError`, an
        ``EOFError``, when it carried a forged or malformed message).
        """
        if self._big is not None:
            return self._read_big()
        scratch, view = _scratch_buffer()
        n = _receive(self.sock, scratch)
        if not n:
            return []
        if self._buf:
            self._buf += view[:n]
            out, used = self._parse(self._buf, len(self._buf))
            del self._buf[:used]
        else:  # the usual case: parse straight from the scratch buffer
            out, used = self._parse(view, n)
            if used < n:
                self._buf = bytearray(view[used:n])
        return out

    def _parse(self, data: Any, end: int) -> Tuple[List[Message], int]:
        """Complete messages in ``data[:end]`` and how many bytes they used."""
        pos, out = 0, []
        while end - pos >= _HEAD.size:
            kind, count = _HEAD.unpack_from(data, pos)
            if count == 1 and end - pos >= _HEAD_ONE.size:   # the common small message
                size = _LEN.unpack_from(data, pos + _HEAD.size)[0]
                signed_end = pos + _HEAD_ONE.size + size
                if end >= signed_end + _MAC_BYTES:
                    self._check(data[pos:signed_end], data[signed_end:signed_end + _MAC_BYTES])
                    out.append((kind, [bytes(data[pos + _HEAD_ONE.size:signed_end])]))
                    pos = signed_end + _MAC_BYTES
                    continue
            if count > _MAX_FRAMES:
                raise ForgedMessageError("malformed message")
            meta = pos + _HEAD.size + count * _LEN.size
            if end < meta:
                break
            sizes = _sizes(data, pos, count)
            total = meta + sum(sizes) + _MAC_BYTES
            if end < total:
                if total - pos >= _BIG:
                    self._start_big(data, pos, end, kind, sizes, meta)
                    pos = end
                break
            signed_end = meta + (sizes[0] if count else 0)
            self._check(data[pos:signed_end], data[signed_end:signed_end + _MAC_BYTES])
            frames = [bytes(data[meta:signed_end])] if count else []
            offset = signed_end + _MAC_BYTES
            for size in sizes[1:]:
                frames.append(bytes(data[offset:offset + size]))
                offset += size
            out.append((kind, frames))
            pos = total
        return out, pos

    def _check(self, signed: Any, digest: Any) -> None:
        mac = self._mac.copy()
        mac.update(signed)
        if not hmac.compare_digest(mac.digest(), bytes(digest)):
            raise ForgedMessageError("message failed authentication")

    def _start_big(self, data: Any, pos: int, end: int, kind: bytes, sizes: List[int],
                   meta: int) -> None:
        """A large message: receive the rest straight into one buffer of its size."""
        body = bytearray(sum(sizes) + _MAC_BYTES)
        body[:end - meta] = data[meta:end]
        self._big = [kind, sizes, bytes(data[pos:meta]), body, memoryview(body), end - meta]
        self._buf = bytearray()

    def _read_big(self) -> List[Message]:
        kind, sizes, meta, body, view, filled = self._big
        n = _receive(self.sock, view[filled:])
        if not n:
            return []
        self._big[5] = filled = filled + n
        if filled < len(body):
            return []
        self._big = None
        first = sizes[0] if sizes else 0
        self._check(meta + view[:first], view[first:first + _MAC_BYTES])
        frames = [view[:first]] if sizes else []
        offset = first + _MAC_BYTES
        for size in sizes[1:]:
            frames.append(view[offset:offset + size])
            offset += size
        return [(kind, frames)]


def _sizes(data: Any, pos: int, count: int) -> List[int]:
    if count == 1:
        return [_LEN.unpack_from(data, pos + _HEAD.size)[0]]
    return list(struct.unpack_from(f"!{count}Q", data, pos + _HEAD.size))


def _recv_exact(sock: socket.socket, n: int, deadline: float) -> bytes:
    data = b""
    while len(data) < n:
        sock.settimeout(max(0.01, deadline - time.monotonic()))
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise ConnectionError("the pipe's peer closed the connection during set-up")
        data += chunk
    return data


class Outbox:
    """The sending side of a stream to another process's inbox for one pipe end."""

    def __init__(self, sock: socket.socket, key: bytes) -> None:
        self.sock = sock
        self._mac = _mac_state(key)

    @classmethod
    def open(cls, loc: dict, pipe_id: str, end: int, timeout: float = 10.0) -> "Outbox":
        """Connect to the inbox at ``loc`` (Unix socket on this host, else TCP) and
        prove the secret; raises ``OSError`` when that end is not reachable there."""
        deadline = time.monotonic() + timeout
        sock = _connect(loc, timeout)
        try:
            nonce_a = _recv_exact(sock, NONCE_BYTES, deadline)
            nonce_c = os.urandom(NONCE_BYTES)
            attach = attach_label(pipe_id, end)
            sock.sendall(nonce_c + proof(nonce_a, nonce_c, attach) + bytes([len(attach)]) + attach)
            if _recv_exact(sock, 1, deadline) != ACK:
                raise ConnectionRefusedError("the pipe end is not active there")
            sock.settimeout(None)
        except BaseException:
            sock.close()
            raise
        return cls(sock, session_key(nonce_a, nonce_c))

    def fileno(self) -> int:
        """Readable when the stream broke (the acceptor never writes after set-up)."""
        return self.sock.fileno()

    def send(self, kind: bytes, frames: Sequence[Any]) -> None:
        """Write one message; ``OSError`` if the stream is broken."""
        write_all(self.sock, encode(self._mac, kind, frames))

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass


def _connect(loc: dict, timeout: float) -> socket.socket:
    if loc.get("unix") and loc.get("host") == transport.local_hostname():
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(timeout)
        try:
            sock.connect(loc["unix"])
            return sock
        except OSError:
            sock.close()  # another network namespace (a container): use TCP
    host, _, port = loc["tcp"].rpartition(":")
    sock = socket.create_connection((host.strip("[]"), int(port)), timeout=timeout)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    return sock


class LocalOutbox:
    """Sending to an end active in this same process: straight into its inbox."""

    def __init__(self, inbox: Any) -> None:
        self.inbox = inbox

    def fileno(self) -> Optional[int]:
        return None

    def send(self, kind: bytes, frames: Sequence[Any]) -> None:
        """Deliver a copy of the message (the sender may change its buffers after)."""
        self.inbox.deliver_local(kind, [f if isinstance(f, bytes) else bytes(f) for f in frames])

    def close(self) -> None:
        self.inbox = None
