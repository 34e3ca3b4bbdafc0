"""Where a pipe end receives: its :class:`Inbox`, and the process's :class:`Acceptor`.

Data flow::

    sender in another process --stream--> [Acceptor thread: set-up, proof] --attach--> Inbox
    sender in this process ----------------------- deliver_local ----------------------> Inbox
                                                                        recv() reads it here

One acceptor thread per process listens on a Unix socket (abstract name, for peers on
this host) and on TCP (for the rest), checks each new stream's proof of the run's
secret and hands it to the inbox of the pipe end it names. From then on the thread
that calls ``recv`` reads the stream itself: the acceptor only ever sees set-ups, so a
busy receiver never stalls a connecting sender.

An inbox waits on one epoll set (its streams, a wake-up pipe for senders in this
process, and optionally the end's own outbox, whose stream breaking is news too), so
``fileno()`` of a ``Connection`` is an honest, pollable descriptor.

Waiting spins a little before it sleeps. Waking a process that sleeps on another
core costs ~40 us on a VM (the core's idle exit and an inter-processor interrupt),
several times a short message's whole round trip. So a receiver first polls the set
without blocking for up to ``spin_wait_us``, yielding its core between polls (a peer
on the same core then runs at once), and sleeps only if nothing came. The spin is
adaptive: after a wait that took longer than twice the spin, the next wait sleeps at
once, so a slow peer (an environment step, a long computation) costs no polling.
"""
from __future__ import annotations

import collections
import functools
import hmac
import logging
import os
import secrets
import select
import socket
import threading
import time
from typing import Any, Deque, Dict, List, Optional, Tuple

from . import transport
from .errors import ForgedMessageError
from .pipe_wire import (ACK, NONCE_BYTES, PROOF_BYTES, FrameReader, Message, proof,
                        session_key)

logger = logging.getLogger(__name__)

_SETUP_TIMEOUT = 10.0
_HELLO_FIXED = NONCE_BYTES + PROOF_BYTES + 1


def _spin_budget() -> float:
    """Seconds a waiting receiver polls before it sleeps (0 on a single CPU)."""
    from .config import get_config
    return get_config().spin_wait_us * 1e-6 if _several_cpus() else 0.0


@functools.lru_cache(maxsize=None)
def _several_cpus() -> bool:
    """Whether this process may run on more than one CPU (else spinning only delays
    the peer it waits for)."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return (cpus or 1) > 1


class Inbox:
    """The receiving side of one active pipe end: streams, local deliveries, wake-ups."""

    def __init__(self) -> None:
        self._spin = _spin_budget()
        self._last_wait = 0.0   # seconds the last wait that brought messages took
        self._epoll = select.epoll()
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        self._epoll.register(self._wake_r, select.EPOLLIN)
        self._lock = threading.Lock()
        self._local: Deque[Message] = collections.deque()
        self._readers: Dict[int, FrameReader] = {}
        self._watched: Optional[int] = None
        self.closed = False

    def fileno(self) -> int:
        """Readable when something arrived for this end (the epoll set's descriptor)."""
        return self._epoll.fileno()

    # -- called from other threads ---------------------------------------------------
    def attach(self, sock: socket.socket, key: bytes, initial: bytes) -> bool:
        """Take a new authenticated stream (acceptor thread); False if closed."""
        with self._lock:
            if self.closed:
                return False
            sock.setblocking(False)
            reader = FrameReader(sock, key, initial)
            self._readers[sock.fileno()] = reader
            self._epoll.register(sock.fileno(), select.EPOLLIN)
            if initial:
                self._poke()
            return True

    def deliver_local(self, kind: bytes, frames: List[Any]) -> None:
        """A message from a sender in this process (any thread)."""
        with self._lock:
            if self.closed:
                raise BrokenPipeError("that pipe end is no longer active in this process")
            if not self._local:
                self._poke()
            self._local.append((kind, frames))

    def wake(self) -> None:
        """Make :meth:`fileno` readable now (until the next :meth:`receive`)."""
        with self._lock:
            self._poke()

    def _poke(self) -> None:
        try:
            os.write(self._wake_w, b"\0")
        except BlockingIOError:
            pass  # already readable

    # -- called by the receiving thread ----------------------------------------------
    def watch(self, fd: Optional[int]) -> None:
        """Also wake up when ``fd`` becomes readable (the end's outbox breaking)."""
        self.unwatch()
        if fd is not None:
            self._epoll.register(fd, select.EPOLLIN)
            self._watched = fd

    def unwatch(self) -> None:
        """Stop watching the outbox (call before closing it)."""
        if self._watched is not None:
            try:
                self._epoll.unregister(self._watched)
            except OSError:
                pass
            self._watched = None

    def receive(self, into: Deque[Message], timeout: float) -> Tuple[bool, bool]:
        """Wait up to ``timeout`` s; append arrived messages to ``into``.

        Returns ``(stream_dropped, outbox_broke)``: a sender's stream ended, or the
        watched outbox did (either may mean the peer is gone: ask the rendezvous).
        """
        dropped = broke = False
        started = time.perf_counter()
        before = len(into)
        for fd, _ in self._poll(timeout, started):
            if fd == self._wake_r:
                self._take_local(into)
            elif fd == self._watched:
                broke = True
            else:
                reader = self._readers.get(fd)
                if reader is None:
                    continue
                try:
                    into.extend(reader.read())
                except EOFError as exc:
                    if isinstance(exc, ForgedMessageError):
                        logger.warning("dropped a pipe stream: %s", exc)
                    self._drop(fd)
                    dropped = True
        if len(into) > before:
            self._last_wait = time.perf_counter() - started
        return dropped, broke

    def _poll(self, timeout: float, started: float) -> List[Tuple[int, int]]:
        """The epoll set's events within ``timeout`` s, spinning first (module doc)."""
        if timeout <= 0 or not self._spin or self._last_wait > 2 * self._spin:
            return self._epoll.poll(timeout)
        spin_until = started + min(self._spin, timeout)
        while True:
            events = self._epoll.poll(0)
            if events:
                return events
            now = time.perf_counter()
            if now >= spin_until:
                return self._epoll.poll(max(0.0, timeout - (now - started)))
            os.sched_yield()

    def drain(self, into: Deque[Message]) -> None:
        """Take everything that already arrived, without waiting."""
        for _ in range(10_000):
            before = len(into)
            dropped, _ = self.receive(into, 0)
            if len(into) == before and not dropped:
                return

    def _take_local(self, into: Deque[Message]) -> None:
        with self._lock:
            try:
                os.read(self._wake_r, 4096)
            except BlockingIOError:
                pass
            into.extend(self._local)
            self._local.clear()

    def _drop(self, fd: int) -> None:
        with self._lock:
            reader = self._readers.pop(fd, None)
            try:
                self._epoll.unregister(fd)
            except OSError:
                pass
        if reader is not None:
            reader.sock.close()

    def close(self) -> None:
        """Close every stream and the wake-up pipe (the receiving thread)."""
        with self._lock:
            self.closed = True
            readers, self._readers = list(self._readers.values()), {}
            self._local.clear()
        self.unwatch()
        for reader in readers:
            reader.sock.close()
        self._epoll.close()
        os.close(self._wake_r)
        os.close(self._wake_w)


class _Hello:
    """A stream in set-up: the acceptor's nonce sent, the connector's answer awaited."""

    __slots__ = ("sock", "nonce", "data", "deadline")

    def __init__(self, sock: socket.socket) -> None:
        self.sock, self.nonce, self.data = sock, os.urandom(NONCE_BYTES), b""
        self.deadline = time.monotonic() + _SETUP_TIMEOUT


class Acceptor:
    """This process's listening sockets for pipe streams, served by one thread."""

    def __init__(self, host: str) -> None:
        self.pid = os.getpid()
        self._inboxes: Dict[Tuple[str, int], Inbox] = {}
        self._lock = threading.Lock()
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self._tcp = socket.socket(family, socket.SOCK_STREAM)
        self._tcp.bind((host, 0))
        port = self._tcp.getsockname()[1]
        self._listeners = [self._tcp]
        self.location = {"tcp": f"[{host}]:{port}" if family == socket.AF_INET6 else f"{host}:{port}",
                         "unix": None, "host": transport.local_hostname()}
        if hasattr(socket, "AF_UNIX") and os.uname().sysname == "Linux":
            unix = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            name = f"\0fiberrl-pipes-{os.getpid()}-{secrets.token_hex(6)}"
            unix.bind(name)
            self._listeners.append(unix)
            self.location["unix"] = name
        for sock in self._listeners:
            sock.listen(512)
            sock.setblocking(False)
        self._thread = threading.Thread(target=self._run, name="fiberrl-pipe-acceptor", daemon=True)
        self._thread.start()

    def add(self, pipe_id: str, end: int, inbox: Inbox) -> None:
        """Route streams for ``(pipe_id, end)`` to ``inbox`` from now on."""
        with self._lock:
            self._inboxes[(pipe_id, end)] = inbox

    def remove(self, pipe_id: str, end: int, inbox: Inbox) -> None:
        """Stop routing to ``inbox`` (it is being closed)."""
        with self._lock:
            if self._inboxes.get((pipe_id, end)) is inbox:
                del self._inboxes[(pipe_id, end)]

    def inbox(self, pipe_id: str, end: int) -> Optional[Inbox]:
        """The inbox of an end active in this process, if any."""
        with self._lock:
            return self._inboxes.get((pipe_id, end))

    def _run(self) -> None:
        poller = select.epoll()
        pending: Dict[int, _Hello] = {}
        for sock in self._listeners:
            poller.register(sock.fileno(), select.EPOLLIN)
        listening = {sock.fileno(): sock for sock in self._listeners}
        while True:
            wait = 1.0 if pending else -1
            for fd, _ in poller.poll(wait):
                if fd in listening:
                    self._accept(listening[fd], poller, pending)
                elif fd in pending:
                    self._answer(pending, fd, poller)
            now = time.monotonic()
            for fd, hello in list(pending.items()):
                if hello.deadline < now:
                    self._discard(pending, fd, poller)

    def _accept(self, listener: socket.socket, poller: Any, pending: Dict[int, _Hello]) -> None:
        while True:
            try:
                sock, _ = listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                logger.warning("pipe acceptor: accept failed: %s", exc)
                return
            hello = _Hello(sock)
            try:
                sock.setblocking(False)
                if sock.family != socket.AF_UNIX:
                    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                sock.send(hello.nonce)  # 16 bytes on a fresh socket: never blocks
            except OSError:
                sock.close()
                continue
            pending[sock.fileno()] = hello
            poller.register(sock.fileno(), select.EPOLLIN)

    def _answer(self, pending: Dict[int, _Hello], fd: int, poller: Any) -> None:
        hello = pending[fd]
        try:
            chunk = hello.sock.recv(4096)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            chunk = b""
        if not chunk:
            self._discard(pending, fd, poller)
            return
        hello.data += chunk
        if len(hello.data) < _HELLO_FIXED:
            return
        size = hello.data[_HELLO_FIXED - 1]
        if len(hello.data) < _HELLO_FIXED + size:
            return
        nonce_c = hello.data[:NONCE_BYTES]
        given = hello.data[NONCE_BYTES:NONCE_BYTES + PROOF_BYTES]
        attach = hello.data[_HELLO_FIXED:_HELLO_FIXED + size]
        rest = hello.data[_HELLO_FIXED + size:]
        poller.unregister(fd)
        del pending[fd]
        if not hmac.compare_digest(given, proof(hello.nonce, nonce_c, attach)):
            logger.warning("dropped a pipe connection that failed authentication")
            hello.sock.close()
            return
        self._route(hello.sock, attach, session_key(hello.nonce, nonce_c), rest)

    def _route(self, sock: socket.socket, attach: bytes, key: bytes, rest: bytes) -> None:
        pipe_id, _, end = attach.decode("ascii", "replace").rpartition(":")
        inbox = self.inbox(pipe_id, int(end)) if end.isdigit() else None
        try:
            if inbox is not None and inbox.attach(sock, key, rest):
                sock.send(ACK)
                return
        except OSError:
            pass
        sock.close()  # not active here (handed on or closed): the sender looks again

    @staticmethod
    def _discard(pending: Dict[int, _Hello], fd: int, poller: Any) -> None:
        hello = pending.pop(fd)
        try:
            poller.unregister(fd)
        except OSError:
            pass
        hello.sock.close()


_acceptor_lock = threading.Lock()
_acceptor: Optional[Acceptor] = None


def acceptor() -> Acceptor:
    """This process's acceptor, started on first use on the backend's listen address."""
    global _acceptor
    with _acceptor_lock:
        if _acceptor is None or _acceptor.pid != os.getpid():
            from .backends import default_backend
            _acceptor = Acceptor(default_backend().listen_host())
        return _acceptor


def current_acceptor() -> Optional[Acceptor]:
    """This process's acceptor if one was started (starts nothing)."""
    return _acceptor if _acceptor is not None and _acceptor.pid == os.getpid() else None
