"""Authenticated message streams over TCP, for the pool's hot path.

ZeroMQ hands every message to its own I/O thread on both sides, so a request/reply
between two processes costs six thread wake-ups; on a small VM each is tens of
microseconds. The pool's task traffic (many small messages, latency-bound
``apply_async().get()``) instead runs over a plain TCP stream that the thread using
it reads and writes directly: four wake-ups per round trip, as the stdlib's pool.

Connection set-up (the connector proves it holds the run's secret)::

    acceptor  -> connector : nonce_a (16 bytes)
    connector -> acceptor  : nonce_c (16 bytes) + HMAC(secret, "connect" + nonce_a + nonce_c)

Both sides then sign every message with ``key = HMAC(secret, "session" + nonce_a +
nonce_c)``, so a message cannot be replayed on another connection and a peer without
the secret gets nothing unpickled, in either direction. A message is::

    [u32 header length][u32 buffer count][u64 length of each buffer][32-byte MAC]
    [header: a pickled tuple][buffer 0][buffer 1]...

The MAC covers the lengths and the header. Buffers (large numpy data, pickle
streams' out-of-band frames) are length-checked but not hashed, as in
:mod:`fiberrl._wire.framing`: they are only ever used as buffers by an authenticated
pickle stream, never unpickled on their own.
"""
from __future__ import annotations

import hmac
import os
import pickle
import select
import socket
import struct
import sys
import threading
import time
from hashlib import sha256
from typing import Any, Iterator, List, Optional, Sequence, Tuple

from ._wire.auth import run_secret
from .errors import ForgedMessageError

__all__ = ["Listener", "Channel", "StreamConnection", "Message"]

_PREFIX = struct.Struct("!II")
_LENGTH = struct.Struct("!Q")
_MAC_BYTES = 32
_NONCE_BYTES = 16
_HELLO_BYTES = _NONCE_BYTES + _MAC_BYTES
_READ_CHUNK = 1 << 18
_MAX_BUFFERS = 1 << 20
_IOV_MAX = 64   # pieces handed to one sendmsg call
_BIG_MESSAGE = 1 << 20   # received straight into its own buffer
UNIX = "unix"   # Listener host meaning "a Unix socket"; addresses "unix:<name>"

Message = Tuple[tuple, List[memoryview]]


def _proof(nonce_a: bytes, nonce_c: bytes) -> bytes:
    return hmac.new(run_secret(), b"connect" + nonce_a + nonce_c, sha256).digest()


def _session_key(nonce_a: bytes, nonce_c: bytes) -> bytes:
    return hmac.new(run_secret(), b"session" + nonce_a + nonce_c, sha256).digest()


def _encode(key: bytes, header: tuple, buffers: Sequence[Any]) -> List[memoryview]:
    """Frame one message; returns byte views of the pieces to write, buffers uncopied."""
    head = pickle.dumps(header, protocol=5)
    views = [memoryview(b).cast("B") for b in buffers]
    lengths = b"".join(_LENGTH.pack(v.nbytes) for v in views)
    prefix = _PREFIX.pack(len(head), len(views)) + lengths
    mac = hmac.new(key, prefix, sha256)
    mac.update(head)
    return [memoryview(prefix + mac.digest() + head), *views]


def _drop_sent(views: List[memoryview], sent: int) -> None:
    """Remove the first ``sent`` bytes from a list of pieces being written."""
    while sent and views:
        if sent >= views[0].nbytes:
            sent -= views[0].nbytes
            views.pop(0)
        else:
            views[0] = views[0][sent:]
            sent = 0


def _tune(sock: socket.socket) -> None:
    if sock.family in (socket.AF_INET, socket.AF_INET6):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)


class _Scratch:
    """A reusable receive buffer: ``sock.recv(256 KiB)`` would map and unmap fresh
    memory on every call, which costs more than the message it reads."""

    def __init__(self) -> None:
        self._buf = bytearray(_READ_CHUNK)
        self._view = memoryview(self._buf)

    def recv(self, sock: socket.socket) -> bytes:
        n = sock.recv_into(self._buf)
        return bytes(self._view[:n])


class _Parser:
    """Turns a byte stream into verified messages (used by both connection kinds)."""

    def __init__(self, key: bytes) -> None:
        self._key = key
        self._buf = bytearray()
        self._big: Optional[list] = None   # [header, lengths, body, view, filled]

    def feed(self, data: bytes) -> None:
        self._buf += data

    def receive(self, sock: socket.socket, scratch: "_Scratch") -> int:
        """Read from ``sock`` (straight into a large message's own buffer while one is
        arriving); returns the bytes read, 0 when the peer closed the stream."""
        big = self._big
        if big is None:
            data = scratch.recv(sock)
            self._buf += data
            return len(data)
        n = sock.recv_into(big[3][big[4]:])
        big[4] += n
        return n

    def messages(self) -> Iterator[Message]:
        """Yield every complete message in the buffer; raise on a forged one."""
        big = self._big
        if big is not None:
            if big[4] < len(big[2]):
                return
            self._big = None
            header, lengths, view, offset = big[0], big[1], big[3], 0
            buffers = []
            for length in lengths:
                buffers.append(view[offset:offset + length])
                offset += length
            yield header, buffers
        buf = self._buf
        pos = 0
        while True:
            if len(buf) - pos < _PREFIX.size:
                break
            head_len, count = _PREFIX.unpack_from(buf, pos)
            if count > _MAX_BUFFERS:
                raise ForgedMessageError("malformed message (too many buffers)")
            meta = _PREFIX.size + count * _LENGTH.size
            if len(buf) - pos < meta + _MAC_BYTES:
                break
            lengths = [_LENGTH.unpack_from(buf, pos + _PREFIX.size + i * _LENGTH.size)[0]
                       for i in range(count)]
            total = meta + _MAC_BYTES + head_len + sum(lengths)
            if len(buf) - pos < total:
                if total >= _BIG_MESSAGE and len(buf) - pos >= meta + _MAC_BYTES + head_len:
                    self._start_big(pos, meta, head_len, lengths)
                    pos = len(buf)
                break
            view = memoryview(buf)
            header = self._verified_header(view, pos, meta, head_len)
            start = pos + meta + _MAC_BYTES
            offset = start + head_len
            buffers = []
            for length in lengths:  # writable copies, as numpy users expect
                buffers.append(memoryview(bytearray(view[offset:offset + length])))
                offset += length
            view.release()
            pos += total
            yield header, buffers
        if pos:
            del buf[:pos]

    def _verified_header(self, view: memoryview, pos: int, meta: int, head_len: int) -> tuple:
        start = pos + meta + _MAC_BYTES
        mac = hmac.new(self._key, view[pos:pos + meta], sha256)
        mac.update(view[start:start + head_len])
        if not hmac.compare_digest(mac.digest(), bytes(view[pos + meta:start])):
            view.release()
            raise ForgedMessageError("message failed authentication")
        return pickle.loads(view[start:start + head_len])

    def _start_big(self, pos: int, meta: int, head_len: int, lengths: List[int]) -> None:
        """A large message whose header is here: check it now, then receive the
        buffers straight into one writable buffer of their size (no re-copying)."""
        view = memoryview(self._buf)
        header = self._verified_header(view, pos, meta, head_len)
        start = pos + meta + _MAC_BYTES + head_len
        body = bytearray(sum(lengths))
        have = len(self._buf) - start
        body[:have] = view[start:]
        view.release()
        self._big = [header, lengths, body, memoryview(body), have]


class Channel:
    """The non-blocking, accepting end of a stream, driven by a selector loop.

    Call :meth:`on_readable` when the socket is readable: it returns the messages
    that arrived (after the handshake) and raises ``ConnectionError`` when the peer
    is gone or failed authentication. :meth:`send` queues a message and writes what
    the socket takes; :meth:`on_writable` writes the rest.
    """

    def __init__(self, sock: socket.socket) -> None:
        sock.setblocking(False)
        _tune(sock)
        self.sock = sock
        self.authenticated = False
        self._nonce = os.urandom(_NONCE_BYTES)
        self._hello = bytearray()
        self._parser: Optional[_Parser] = None
        self._key = b""
        self._out: List[memoryview] = []
        self._scratch = _Scratch()
        sock.send(self._nonce)  # 16 bytes on a fresh socket never block

    def fileno(self) -> int:
        return self.sock.fileno()

    @property
    def wants_write(self) -> bool:
        """True while queued bytes wait for the socket to accept them."""
        return bool(self._out)

    def on_readable(self) -> List[Message]:
        try:
            if self.authenticated:
                if not self._parser.receive(self.sock, self._scratch):
                    raise ConnectionError("peer closed the connection")
                return list(self._parser.messages())
            data = self._scratch.recv(self.sock)
        except (BlockingIOError, InterruptedError):
            return []
        except OSError as exc:
            raise ConnectionError(str(exc)) from None
        if not data:
            raise ConnectionError("peer closed the connection")
        if not self.authenticated:
            self._hello += data
            if len(self._hello) < _HELLO_BYTES:
                return []
            nonce_c = bytes(self._hello[:_NONCE_BYTES])
            proof = bytes(self._hello[_NONCE_BYTES:_HELLO_BYTES])
            if not hmac.compare_digest(proof, _proof(self._nonce, nonce_c)):
                raise ForgedMessageError("peer failed authentication")
            self.authenticated = True
            self._key = _session_key(self._nonce, nonce_c)
            self._parser = _Parser(self._key)
            data = bytes(self._hello[_HELLO_BYTES:])
            self._hello = bytearray()
        self._parser.feed(data)
        return list(self._parser.messages())

    def send(self, header: tuple, buffers: Sequence[Any] = ()) -> None:
        """Queue one message and write as much as the socket takes now."""
        self._out.extend(_encode(self._key, header, buffers))
        self.on_writable()

    def on_writable(self) -> None:
        out = self._out
        while out:
            try:
                sent = self.sock.sendmsg(out[:_IOV_MAX])
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                raise ConnectionError(str(exc)) from None
            _drop_sent(out, sent)

    def close(self) -> None:
        self._out.clear()
        try:
            self.sock.close()
        except OSError:
            pass


class Listener:
    """A listening socket whose connections become :class:`Channel` objects: TCP on
    ``host`` (any free port), or, for ``host == "unix"``, a Unix socket with a fresh
    abstract name (Linux; for peers on this host, and cheaper than TCP loopback)."""

    def __init__(self, host: str) -> None:
        if host == UNIX:
            self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            name = f"\0fiberrl-stream-{os.getpid()}-{os.urandom(6).hex()}"
            self.sock.bind(name)
            self.address = f"{UNIX}:{name}"
        else:
            family = socket.AF_INET6 if ":" in host else socket.AF_INET
            self.sock = socket.socket(family, socket.SOCK_STREAM)
            self.sock.bind((host, 0))
            port = self.sock.getsockname()[1]
            self.address = f"[{host}]:{port}" if family == socket.AF_INET6 else f"{host}:{port}"
        self.sock.listen(512)
        self.sock.setblocking(False)

    def fileno(self) -> int:
        return self.sock.fileno()

    def accept(self) -> Optional[Channel]:
        """Accept one pending connection (None if there is none)."""
        try:
            sock, _ = self.sock.accept()
        except (BlockingIOError, InterruptedError):
            return None
        try:
            return Channel(sock)
        except OSError:
            sock.close()
            return None

    def close(self) -> None:
        self.sock.close()


def _open(address: str, timeout: float) -> socket.socket:
    if address.startswith(UNIX + ":"):
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(timeout)
        try:
            sock.connect(address[len(UNIX) + 1:])
        except BaseException:
            sock.close()
            raise
        return sock
    return socket.create_connection(_split_address(address), timeout=timeout)


def unix_supported() -> bool:
    """Whether this platform has abstract Unix socket names (Linux)."""
    return hasattr(socket, "AF_UNIX") and sys.platform.startswith("linux")


def _split_address(address: str) -> Tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host.strip("[]"), int(port)


class StreamConnection:
    """The blocking, connecting end of a stream (a pool worker's link to its master).

    ``address`` is ``"host:port"`` (TCP) or ``"unix:<name>"`` (a :class:`Listener`'s).
    ``send`` may be called from several threads; ``recv`` from one.
    """

    def __init__(self, address: str, timeout: float = 30.0) -> None:
        self.sock = _open(address, timeout)
        _tune(self.sock)
        nonce_a = self._recv_exact(_NONCE_BYTES, time.monotonic() + timeout)
        nonce_c = os.urandom(_NONCE_BYTES)
        self.sock.sendall(nonce_c + _proof(nonce_a, nonce_c))
        self.sock.settimeout(None)
        self._key = _session_key(nonce_a, nonce_c)
        self._parser = _Parser(self._key)
        self._pending: List[Message] = []
        self._send_lock = threading.Lock()
        self._scratch = _Scratch()

    def _recv_exact(self, n: int, deadline: float) -> bytes:
        data = b""
        while len(data) < n:
            self.sock.settimeout(max(0.01, deadline - time.monotonic()))
            chunk = self.sock.recv(n - len(data))
            if not chunk:
                raise ConnectionError("peer closed the connection during set-up")
            data += chunk
        return data

    def send(self, header: tuple, buffers: Sequence[Any] = ()) -> None:
        """Sign and send one message (blocks until the kernel has taken it)."""
        pieces = _encode(self._key, header, buffers)
        with self._send_lock:
            if len(pieces) == 1:
                self.sock.sendall(pieces[0])
                return
            while pieces:
                _drop_sent(pieces, self.sock.sendmsg(pieces[:_IOV_MAX]))

    def recv(self, timeout: Optional[float] = None) -> Optional[Message]:
        """The next message, or None after ``timeout`` seconds; EOFError when closed."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self._pending:
            wait = None if deadline is None else max(0.0, deadline - time.monotonic())
            if wait is not None:
                ready, _, _ = select.select([self.sock], [], [], wait)
                if not ready:
                    return None
            try:
                got = self._parser.receive(self.sock, self._scratch)
            except OSError as exc:
                raise EOFError(str(exc)) from None
            if not got:
                raise EOFError("the other side closed the connection")
            self._pending.extend(self._parser.messages())
        return self._pending.pop(0)

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass

    def __del__(self) -> None:  # a thread's connection, dropped with its thread-local
        sock = getattr(self, "sock", None)
        if sock is not None:
            self.close()
