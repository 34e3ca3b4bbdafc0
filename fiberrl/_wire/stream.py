"""Authenticated streams: the set-up on both sides, and the two ways to use one.

* :func:`open_stream` connects, proves the key for a *label* (the service the stream
  is for, such as ``"rpc"`` or ``"pipe:<id>:1"``) and checks the acceptor's proof;
  it returns a blocking :class:`Stream`.
* :class:`Hello` is the acceptor's side of the set-up, fed bytes by an event loop.
* :class:`Stream` is used by the thread that owns it: ``send`` from any thread,
  ``recv`` reading the socket itself (no other thread in between).
* :class:`Channel` is driven by an event loop: ``on_readable`` returns the messages
  that arrived, ``send`` writes what the socket takes and queues the rest.

The set-up and the message format are described in :mod:`fiberrl._wire.auth` and
:mod:`fiberrl._wire.framing`.
"""
from __future__ import annotations

import collections
import hmac
import select
import socket
import threading
import time
from typing import Any, Deque, List, Optional, Sequence

from ..errors import AuthenticationError, ForgedMessageError, NotHereError
from .auth import (NONCE_BYTES, PROOF_BYTES, Signer, Verifier, fresh_nonce, proofs, run_secret,
                   session_keys)
from .framing import FrameReader, Message, drop_written, encode, first_pieces, write_all
from .sockets import Address, connect, recv_exact, tune
from .spin import SpinGate, spin_for

OK, REFUSED, NOT_HERE = b"\x01", b"\x02", b"\x03"
SETUP_TIMEOUT = 10.0
_MAX_LABEL = 255


def open_stream(address: Address, label: str, key: Optional[bytes] = None,
                timeout: float = SETUP_TIMEOUT, stream_class: Optional[type] = None) -> "Stream":
    """Connect to the listener at ``address`` for ``label``, proving ``key`` (the run's
    secret by default); the stream is a ``stream_class`` (:class:`Stream` by default, or
    a subclass).

    Raises ``OSError`` when nothing listens there, :class:`NotHereError` when the
    service is not there, and ``AuthenticationError`` when either side's proof fails.
    """
    key = run_secret() if key is None else key
    encoded = label.encode()
    if len(encoded) > _MAX_LABEL:
        raise ValueError(f"stream label too long: {label!r}")
    deadline = time.monotonic() + timeout
    sock = connect(address, timeout)
    try:
        nonce_a = recv_exact(sock, NONCE_BYTES, deadline)
        nonce_c = fresh_nonce()
        mine, theirs = proofs(key, nonce_a, nonce_c, encoded)
        sock.sendall(nonce_c + bytes([len(encoded)]) + encoded + mine)
        answer = recv_exact(sock, 1, deadline)
        if answer == NOT_HERE:
            raise NotHereError(f"no {label!r} at {address[0]}:{address[1]}")
        if answer != OK:
            raise AuthenticationError(f"{address[0]}:{address[1]} refused the key for {label!r}")
        if not hmac.compare_digest(recv_exact(sock, PROOF_BYTES, deadline), theirs):
            raise AuthenticationError(f"{address[0]}:{address[1]} does not hold the key "
                                      f"for {label!r}")
        sock.settimeout(None)
    except socket.timeout:
        sock.close()
        raise TimeoutError(f"{address[0]}:{address[1]} did not complete the set-up of "
                           f"{label!r} within {timeout:.0f} s") from None
    except BaseException:
        sock.close()
        raise
    send_key, recv_key = session_keys(key, nonce_a, nonce_c, encoded)
    return (stream_class or Stream)(sock, send_key, recv_key)


class Hello:
    """The acceptor's side of one set-up: its nonce is sent at once; :meth:`feed` the
    connector's bytes until :meth:`label` is known, then :meth:`finish` with the key."""

    __slots__ = ("sock", "nonce", "data", "deadline")

    def __init__(self, sock: socket.socket) -> None:
        self.sock, self.nonce, self.data = sock, fresh_nonce(), b""
        self.deadline = time.monotonic() + SETUP_TIMEOUT
        sock.setblocking(False)
        tune(sock)
        sock.send(self.nonce)  # 16 bytes on a fresh socket never block

    def feed(self) -> bool:
        """Read what arrived; True once the whole hello is here. ``EOFError`` if the
        connector hung up."""
        try:
            chunk = self.sock.recv(4096)
        except (BlockingIOError, InterruptedError):
            return False
        except OSError as exc:
            raise EOFError(str(exc)) from None
        if not chunk:
            raise EOFError("the connector hung up during set-up")
        self.data += chunk
        return self._size() is not None and len(self.data) >= self._size()

    def _size(self) -> Optional[int]:
        if len(self.data) <= NONCE_BYTES:
            return None
        return NONCE_BYTES + 1 + self.data[NONCE_BYTES] + PROOF_BYTES

    def label(self) -> str:
        """The label the connector asked for (not yet authenticated)."""
        size = self.data[NONCE_BYTES]
        return self.data[NONCE_BYTES + 1:NONCE_BYTES + 1 + size].decode("utf-8", "replace")

    def verify(self, key: bytes) -> Optional[tuple]:
        """Check the connector's proof with ``key``: ``(send_key, recv_key, accept_proof,
        leftover)`` if it holds, else None."""
        size = self.data[NONCE_BYTES]
        nonce_c = self.data[:NONCE_BYTES]
        label = self.data[NONCE_BYTES + 1:NONCE_BYTES + 1 + size]
        end = NONCE_BYTES + 1 + size + PROOF_BYTES
        theirs, mine = proofs(key, self.nonce, nonce_c, label)
        if not hmac.compare_digest(self.data[end - PROOF_BYTES:end], theirs):
            return None
        c2a, a2c = session_keys(key, self.nonce, nonce_c, label)
        return a2c, c2a, mine, self.data[end:]

    def answer(self, reply: bytes) -> None:
        """Send the set-up's answer (a handful of bytes: never blocks)."""
        self.sock.send(reply)


class _Authenticated:
    """What both ends of a set-up stream hold: the non-blocking socket, the signer of
    what this side sends and the reader (and verifier) of what it receives."""

    def __init__(self, sock: socket.socket, send_key: bytes, recv_key: bytes,
                 initial: bytes) -> None:
        sock.setblocking(False)
        self.sock = sock
        self._signer = Signer(send_key)
        self._reader = FrameReader(sock, Verifier(recv_key), initial)
        self.closed = False

    def fileno(self) -> int:
        """The socket's descriptor."""
        return self.sock.fileno()


class Stream(_Authenticated):
    """A blocking, authenticated stream: ``send`` from any thread, ``recv`` from one.

    ``spin`` seconds (0 by default): how long ``recv`` polls before it sleeps, for a
    conversation of requests and prompt replies (:mod:`fiberrl._wire.spin`).
    """

    def __init__(self, sock: socket.socket, send_key: bytes, recv_key: bytes,
                 initial: bytes = b"", spin: float = 0.0) -> None:
        super().__init__(sock, send_key, recv_key, initial)
        self.spin = spin
        self._spin_gate = SpinGate()
        self._pending: List[Message] = self._reader.pending()
        self._send_lock = threading.Lock()
        # made once: a poll object per wait would cost more than the wait's syscall
        self._readable = select.poll()
        self._readable.register(sock.fileno(), select.POLLIN)
        self._hangup = select.poll()
        self._hangup.register(sock.fileno(), select.POLLRDHUP)

    def send(self, kind: bytes, frames: Sequence[Any] = ()) -> None:
        """Sign and write one message (blocks until the kernel has taken it);
        ``OSError`` if the stream is broken."""
        with self._send_lock:
            write_all(self.sock, encode(self._signer, kind, frames))

    def poll(self, timeout: Optional[float] = 0.0) -> bool:
        """Whether a message (or end of file) can be read within ``timeout`` seconds;
        ``OSError`` once this end is closed."""
        if self._pending:
            return True
        if self.closed:
            raise OSError("the stream is closed")
        return self._wait(timeout)

    def _wait(self, timeout: Optional[float]) -> bool:
        wait = None if timeout is None else max(0, int(timeout * 1000 + 0.999))
        return bool(self._readable.poll(wait))

    def recv(self, timeout: Optional[float] = None) -> Optional[Message]:
        """The next message, or None after ``timeout`` seconds.

        ``EOFError`` when the stream ended (``ForgedMessageError`` when the peer sent
        something that failed authentication; the stream is then useless).
        """
        if self._pending:
            return self._pending.pop(0)
        if timeout != 0 and self._spin_gate.should_spin(self.spin):
            self._spin_gate.record(spin_for(
                self._spin_read, self.spin if timeout is None else min(self.spin, timeout)))
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self._pending:
            wait = None if deadline is None else max(0.0, deadline - time.monotonic())
            if not self._wait(wait):
                return None
            self._pending.extend(self._reader.read())
        return self._pending.pop(0)

    def _spin_read(self) -> bool:
        """Read what arrived, without waiting; whether a message is pending now."""
        if self._readable.poll(0):   # a poll costs less than a read that finds nothing
            self._pending.extend(self._reader.read())
        return bool(self._pending)

    def peer_hung_up(self) -> bool:
        """True once the peer closed its end; ignores messages it sent ahead, so a
        thread busy on a long call may ask without consuming anything."""
        if self.closed:
            return True
        return any(events & (select.POLLRDHUP | select.POLLHUP | select.POLLERR)
                   for _fd, events in self._hangup.poll(0))

    def close(self) -> None:
        """Close the stream (the peer reads end of file)."""
        self.closed = True
        try:
            self.sock.close()
        except OSError:
            pass

    def __del__(self) -> None:  # a thread's stream, dropped with its thread-local
        if not getattr(self, "closed", True):
            self.close()


class Channel(_Authenticated):
    """The event-loop side of an authenticated stream (non-blocking).

    :meth:`on_readable` returns the messages that arrived and raises ``EOFError``
    when the stream ended (:class:`ForgedMessageError` for a forged message);
    :meth:`send` queues a message and writes what the socket takes now; the loop
    calls :meth:`on_writable` while :attr:`wants_write`. ``send`` is thread-safe.
    """

    def __init__(self, sock: socket.socket, send_key: bytes, recv_key: bytes,
                 initial: bytes = b"") -> None:
        super().__init__(sock, send_key, recv_key, initial)
        self._early = self._reader.pending()
        self._out: Deque[Any] = collections.deque()
        self._lock = threading.Lock()

    @property
    def wants_write(self) -> bool:
        """True while queued bytes wait for the socket to take them."""
        return bool(self._out)

    def on_readable(self) -> List[Message]:
        """Messages that arrived (``EOFError`` when the stream ended)."""
        if self._early:
            early, self._early = self._early, []
            return early + self._reader.read()
        return self._reader.read()

    def send(self, kind: bytes, frames: Sequence[Any] = ()) -> None:
        """Queue one message and write what the socket takes now (any thread);
        ``EOFError`` if the stream is broken."""
        with self._lock:
            if self.closed:
                raise EOFError("the stream is closed")
            self._out.extend(encode(self._signer, kind, frames))
            self._write()

    def on_writable(self) -> None:
        """Write queued bytes (``EOFError`` if the stream broke)."""
        with self._lock:
            self._write()

    def _write(self) -> None:
        out = self._out
        while out:
            try:
                sent = self.sock.sendmsg(first_pieces(out))
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                out.clear()
                raise EOFError(str(exc)) from None
            drop_written(out, sent)

    def close(self) -> None:
        """Close the stream; queued bytes are dropped."""
        with self._lock:
            self.closed = True
            self._out.clear()
        try:
            self.sock.close()
        except OSError:
            pass


__all__ = ["open_stream", "Hello", "Stream", "Channel", "NotHereError", "ForgedMessageError",
           "OK", "REFUSED", "NOT_HERE"]
