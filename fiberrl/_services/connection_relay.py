"""Stdlib connections relayed to jobs on other hosts.

A stdlib ``Connection`` (an OS pipe or socket end of this host) sent to a job of a
backend that does not share this host cannot travel as a descriptor
(:mod:`fiberrl._services.fd_sharing` lends descriptors on one host only). It is
relayed instead: this process keeps a duplicate of the descriptor under a one-time
ticket, and the job gets a :class:`RelayedConnection`, which has the stdlib
``Connection``'s methods and forwards each call over an authenticated stream. This is
what lets the stdlib's own ``multiprocessing.queues.Queue`` (built on an OS pipe), and
so ``concurrent.futures.ProcessPoolExecutor``, run with their workers on a cluster.

Data flow (one stream per relayed end, label ``relay:<ticket>``)::

    job                                    this process (one thread per relayed end)
    recv_bytes()  -- b"R" -------------->  wait for a message, checking the job is
                                           still there; recv_bytes() on the duplicate
                  <-- b"D" + message ----  (b"E" at end of file, b"X" + why on error)
    poll(t)       -- b"P" + t ---------->  poll the duplicate for up to t s
                  <-- b"B" + 1 or 0 -----
    send_bytes(m) -- b"S" + m ---------->  send_bytes(m) on the duplicate
                  <-- b"K" (or b"X") ----

Everything on the stream is signed with the run's secret; the relay never unpickles
anything (it moves bytes). A relay thread reads the pipe only while its job waits for
a message, and stops reading when the job's stream ends, so a job that dies loses no
message it did not ask for. Tickets lent while pickling a job's process are closed if
that job ends without taking them.
"""
from __future__ import annotations

import logging
import os
import socket
import threading
import time
from multiprocessing import connection as mp_connection
from multiprocessing.reduction import ForkingPickler
from typing import Any, Optional, Tuple

from .._runtime.runtime import Runtime, service
from .._wire.buffers import receive_target, send_slice
from .._wire.sockets import Address
from .._wire.stream import Stream, open_stream
from .tickets import Tickets

logger = logging.getLogger(__name__)

__all__ = ["relay", "RelayedConnection", "ConnectionRelay"]

_SLICE = 0.2    # seconds between checks that the job is still there, while waiting


class ConnectionRelay:
    """Service "connection-relay": duplicated stdlib connections waiting for their job."""

    def __init__(self, rt: Runtime) -> None:
        self.runtime = rt
        self._waiting: Tickets[mp_connection.Connection] = Tickets(lambda conn: conn.close())
        rt.acceptor.route("relay", self._take)

    def register(self, conn: mp_connection.Connection, token: Optional[str]) -> str:
        """Keep a duplicate of ``conn`` for one job; returns its ticket."""
        duplicate = mp_connection.Connection(os.dup(conn.fileno()), conn.readable, conn.writable)
        return self._waiting.keep(duplicate, token)

    def _take(self, label: str, sock: socket.socket, send_key: bytes, recv_key: bytes,
              leftover: bytes) -> bool:
        """On the loop: the authenticated stream of the job that took ``relay:<ticket>``."""
        conn = self._waiting.take(label.partition(":")[2])
        if conn is None:
            return False   # unknown or already taken: "not here"
        stream = Stream(sock, send_key, recv_key, leftover)
        threading.Thread(target=_serve, args=(conn, stream), daemon=True,
                         name="fiberrl-relay").start()
        return True


def _serve(conn: mp_connection.Connection, stream: Stream) -> None:
    """Answer one job's calls on ``conn`` until its stream ends."""
    try:
        while True:
            try:
                kind, frames = stream.recv()
            except EOFError:
                return
            try:
                if kind == b"R":
                    reply = _receive(conn, stream)
                elif kind == b"P":
                    timeout = None if not frames[0] else float(frames[0])
                    reply = (b"B", [b"1" if _wait(conn, stream, timeout) else b"0"])
                elif kind == b"S":
                    conn.send_bytes(frames[0])
                    reply = (b"K", [])
                else:
                    logger.warning("a relayed connection got an unknown request %r", kind)
                    return
            except EOFError:
                reply = (b"E", [])
            except _JobGone:
                return
            except OSError as exc:
                reply = (b"X", [f"{type(exc).__name__}: {exc}".encode()])
            try:
                stream.send(*reply)
            except OSError:
                return
    finally:
        conn.close()
        stream.close()


class _JobGone(Exception):
    """The job at the other end of a relay stream hung up."""


def _wait(conn: mp_connection.Connection, stream: Stream, timeout: Optional[float]) -> bool:
    """Whether ``conn`` has something to read within ``timeout`` s (None: any time),
    checking between slices that the job still waits for it."""
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        left = _SLICE if deadline is None else min(_SLICE, deadline - time.monotonic())
        if conn.poll(max(0.0, left)):
            return True
        if stream.peer_hung_up():
            raise _JobGone()
        if deadline is not None and time.monotonic() >= deadline:
            return False


def _receive(conn: mp_connection.Connection, stream: Stream) -> Tuple[bytes, list]:
    _wait(conn, stream, None)
    return b"D", [conn.recv_bytes()]


def relay(conn: mp_connection.Connection, token: Optional[str]) -> Tuple[Address, str]:
    """Relay ``conn`` to the job of ``token``: ``(this process's address, ticket)``."""
    own: ConnectionRelay = service("connection-relay", ConnectionRelay)
    return own.runtime.address, own.register(conn, token)


class RelayedConnection:
    """A stdlib ``Connection`` of another host, used through its owner's relay.

    It has the stdlib ``Connection``'s methods (``send``/``recv`` pickle with the
    stdlib's ``ForkingPickler``, as a stdlib connection does); each call is a round trip
    to the process that sent it. It has no descriptor of this host.
    """

    def __init__(self, address: Address, ticket: str, readable: bool, writable: bool) -> None:
        self._stream: Optional[Stream] = open_stream(tuple(address), f"relay:{ticket}")
        self._readable, self._writable = readable, writable
        self._lock = threading.Lock()
        self._address = tuple(address)

    # -- the stdlib's Connection API --------------------------------------------------
    @property
    def closed(self) -> bool:
        """True once closed."""
        return self._stream is None

    @property
    def readable(self) -> bool:
        """True if this end can receive."""
        return self._readable

    @property
    def writable(self) -> bool:
        """True if this end can send."""
        return self._writable

    def fileno(self) -> int:
        """Raises ``OSError``: a relayed connection has no descriptor on this host."""
        self._check_open()
        raise OSError("a stdlib Connection relayed from another host has no file descriptor "
                      "here; poll() it instead")

    def close(self) -> None:
        """Close this end (the owner's duplicate closes too)."""
        stream, self._stream = self._stream, None
        if stream is not None:
            stream.close()

    def send_bytes(self, buf: Any, offset: int = 0, size: Optional[int] = None) -> None:
        """Send the bytes of ``buf[offset:offset + size]`` as one message."""
        self._check_open()
        self._check_writable()
        self._call(b"S", [send_slice(buf, offset, size)])

    def send(self, obj: Any) -> None:
        """Send a picklable object."""
        self._check_open()
        self._check_writable()
        self.send_bytes(ForkingPickler.dumps(obj))

    def recv_bytes(self, maxlength: Optional[int] = None) -> bytes:
        """Receive one message's bytes (``EOFError`` when the other end closed)."""
        self._check_open()
        self._check_readable()
        if maxlength is not None and maxlength < 0:
            raise ValueError("negative maxlength")
        data = self._call(b"R", [])
        if maxlength is not None and len(data) > maxlength:
            self.close()
            raise OSError("bad message length")
        return data

    def recv_bytes_into(self, buf: Any, offset: int = 0) -> int:
        """Receive one message into ``buf`` at ``offset``; returns its size."""
        view = receive_target(buf, offset)   # checked before a message is taken
        data = self.recv_bytes()
        if offset + len(data) > view.nbytes:
            raise mp_connection.BufferTooShort(data)
        view[offset:offset + len(data)] = data
        return len(data)

    def recv(self) -> Any:
        """Receive one pickled object."""
        return ForkingPickler.loads(self.recv_bytes())

    def poll(self, timeout: Optional[float] = 0.0) -> bool:
        """Whether a message can be read within ``timeout`` seconds (None: wait)."""
        self._check_open()
        self._check_readable()
        return self._call(b"P", [b"" if timeout is None else repr(float(timeout)).encode()]) \
            == b"1"

    def __enter__(self) -> "RelayedConnection":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __del__(self) -> None:
        stream = getattr(self, "_stream", None)
        if stream is not None:
            stream.close()

    def __reduce__(self) -> Any:
        raise TypeError("a relayed stdlib Connection cannot be sent on again")

    # -- internals ----------------------------------------------------------------------
    def _call(self, kind: bytes, frames: list) -> Any:
        with self._lock:
            stream = self._stream
            if stream is None:
                raise OSError("handle is closed")
            try:
                stream.send(kind, frames)
                answer, reply = stream.recv()
            except (OSError, EOFError) as exc:
                raise EOFError(f"the relay of this stdlib Connection at "
                               f"{self._address[0]}:{self._address[1]} is gone: {exc}") from None
        if answer == b"D" or answer == b"B":
            return reply[0]
        if answer == b"K":
            return None
        if answer == b"E":
            raise EOFError("the other end of the stdlib Connection closed")
        raise OSError(reply[0].decode(errors="replace") if reply else "relay error")

    def _check_open(self) -> None:
        if self._stream is None:
            raise OSError("handle is closed")

    def _check_readable(self) -> None:
        if not self._readable:
            raise OSError("connection is write-only")

    def _check_writable(self) -> None:
        if not self._writable:
            raise OSError("connection is read-only")


def rebuild(address: Address, ticket: str, readable: bool, writable: bool) -> RelayedConnection:
    """Unpickling in the job: connect to the relay under ``ticket``."""
    return RelayedConnection(address, ticket, readable, writable)

