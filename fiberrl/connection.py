"""``Pipe()`` and ``Connection``: two ends that talk directly, from any two machines.

Data flow::

    end A (process P)                                   end B (process C)
    PUSH ------------------- direct, ordered -------------> PULL inbox
    PULL inbox <------------ direct, ordered --------------- PUSH
            \\___ rendezvous: "pipe" service on the hub of the creating process ___/
                 (where does each end live? mailbox for messages sent before it knew)

An end becomes *active* in a process when it is first used there, or at once when it
is unpickled in another process: it binds a PULL inbox on this host and registers the
inbox's address with the creator's hub, receiving any messages that were left in its
mailbox. A sender whose peer is not active yet leaves messages in the peer's mailbox
(the hub answers "stored" or "the peer is now at X"), so order is kept: mailbox
messages are handed over at registration, before any direct message can arrive.

End of file: ``close()`` sends a close marker to the peer; a peer whose process dies
is noticed through the connection to its inbox dropping, so ``recv`` raises
``EOFError`` instead of hanging. Closing a copy of an end that was sent to another
process and never used here does not signal EOF (the other process holds the end),
which mirrors how closing a duplicated file descriptor behaves.

Limitation: an end is read by the process that activated it last; passing an end on
again after it has been used is not supported.
"""
from __future__ import annotations

import collections
import itertools
import logging
import os
import secrets
import threading
import time
import weakref
from multiprocessing import BufferTooShort
from typing import Any, Deque, Dict, List, Optional, Tuple

import zmq
from zmq.utils.monitor import recv_monitor_message

from . import reduction, transport
from .hub import Hub, Request, get_hub

logger = logging.getLogger(__name__)

_OBJECT, _BYTES, _CLOSE = "o", "b", "c"
_LOOKUP_INTERVAL = 0.2


class _PipeRegistry:
    """Hub service "pipe": where each end lives, and mailboxes for ends not yet active."""

    def __init__(self, hub: Hub) -> None:
        self.hub = hub
        self.pipes: Dict[str, dict] = {}
        hub.register("pipe", self)

    def create(self) -> str:
        pipe_id = secrets.token_hex(8)
        self.hub.call_soon(lambda: self.pipes.setdefault(pipe_id, self._entry()))
        return pipe_id

    @staticmethod
    def _entry() -> dict:
        return {"loc": [None, None], "mail": [[], []], "closed": [False, False]}

    def __call__(self, op: str, request: Request) -> None:
        pipe_id, end = request.args[0], request.args[1]
        entry = self.pipes.get(pipe_id)
        if entry is None:
            if op == "closed":
                return
            entry = self.pipes[pipe_id] = self._entry()
        if op == "register":
            entry["loc"][end] = request.args[2]
            mail, entry["mail"][end] = entry["mail"][end], []
            counts = [len(frames) for _, frames in mail]
            kinds = [kind for kind, _ in mail]
            flat = [frame for _, frames in mail for frame in frames]
            request.reply(kinds, counts, entry["loc"][1 - end], body=flat)
        elif op == "mail":
            peer = entry["loc"][end]
            if peer is not None:
                request.reply("peer", peer)
            else:
                entry["mail"][end].append((request.args[2], [bytes(f) for f in request.body]))
                request.reply("stored", None)
        elif op == "lookup":
            request.reply(entry["loc"][end])
        elif op == "closed":
            entry["closed"][end] = True
            if all(entry["closed"]):
                del self.pipes[pipe_id]
        else:
            request.fail(ValueError(f"unknown pipe op {op!r}"))


_registry_lock = threading.Lock()
_registry: Optional[_PipeRegistry] = None
_live: "weakref.WeakSet[Connection]" = weakref.WeakSet()


def _pipe_registry() -> _PipeRegistry:
    global _registry
    hub = get_hub()
    with _registry_lock:
        if _registry is None or _registry.hub is not hub:
            _registry = _PipeRegistry(hub)
        return _registry


def close_all() -> None:
    """Close every active connection of this process (at job exit: peers see EOF)."""
    for conn in list(_live):
        try:
            conn.close()
        except Exception:
            logger.debug("closing %r at exit failed", conn, exc_info=True)


def Pipe(duplex: bool = True) -> Tuple["Connection", "Connection"]:
    """Return two connected :class:`Connection` objects, like ``multiprocessing.Pipe``.

    With ``duplex=False`` the first can only receive and the second only send.
    """
    registry = _pipe_registry()
    pipe_id = registry.create()
    address = registry.hub.address
    first = Connection(pipe_id, 0, address, readable=True, writable=duplex)
    second = Connection(pipe_id, 1, address, readable=duplex, writable=True)
    return first, second


class Connection:
    """One end of a :func:`Pipe`: ``send``/``recv`` objects, ``send_bytes``/``recv_bytes``."""

    def __init__(self, pipe_id: str, end: int, registry: str, readable: bool = True,
                 writable: bool = True) -> None:
        self._pipe_id, self._end, self._registry = pipe_id, end, registry
        self._readable, self._writable = readable, writable
        self._closed = False
        self._shipped = False
        self._pid: Optional[int] = None  # process in which this end is active
        self._inbox: Optional[zmq.Socket] = None
        self._outbox: Optional[zmq.Socket] = None
        self._monitor: Optional[zmq.Socket] = None
        self._peer_addr: Optional[str] = None
        self._peer_gone = False
        self._eof = False
        self._pending: Deque[Tuple[str, List[Any]]] = collections.deque()
        self._poller: Optional[zmq.Poller] = None
        self._last_lookup = 0.0

    # -- pickling: an end sent to another process becomes active there -------------
    def __reduce__(self):
        self._check_open()
        self._shipped = True
        return (_rebuild, (self._pipe_id, self._end, self._registry, self._readable,
                           self._writable))

    def __repr__(self) -> str:
        state = "closed" if self._closed else ("active" if self._pid == os.getpid() else "idle")
        return f"<fiberrl.Connection pipe={self._pipe_id} end={self._end} {state}>"

    # -- activation ------------------------------------------------------------------
    def _activate(self) -> None:
        if self._pid == os.getpid():
            return
        ctx = transport.context()
        inbox = ctx.socket(zmq.PULL)
        inbox.setsockopt(zmq.LINGER, 0)
        from .backends import default_backend
        address = transport.bind_random(inbox, default_backend().listen_host())
        client = transport.client_for(self._registry)
        (kinds, counts, peer), body = client.call("pipe", "register", self._pipe_id,
                                                  self._end, address)
        self._inbox, self._pid = inbox, os.getpid()
        self._outbox = self._monitor = None
        self._poller = zmq.Poller()
        self._poller.register(inbox, zmq.POLLIN)
        position = 0
        for kind, count in zip(kinds, counts):
            self._pending.append((kind, body[position:position + count]))
            position += count
        if peer is not None:
            self._connect(peer)
        _live.add(self)

    def _connect(self, address: str) -> None:
        outbox = transport.context().socket(zmq.PUSH)
        transport.configure_peer_socket(outbox)
        self._monitor = outbox.get_monitor_socket(zmq.EVENT_DISCONNECTED)
        outbox.connect(address)
        self._outbox, self._peer_addr = outbox, address
        self._poller.register(self._monitor, zmq.POLLIN)

    def _lookup_peer(self) -> None:
        now = time.monotonic()
        if self._peer_addr is None and now - self._last_lookup >= _LOOKUP_INTERVAL:
            self._last_lookup = now
            (peer,), _ = transport.client_for(self._registry).call(
                "pipe", "lookup", self._pipe_id, 1 - self._end)
            if peer is not None:
                self._connect(peer)

    # -- checks ----------------------------------------------------------------------
    def _check_open(self) -> None:
        if self._closed:
            raise OSError("handle is closed")

    def _check_readable(self) -> None:
        self._check_open()
        if not self._readable:
            raise OSError("connection is write-only")

    def _check_writable(self) -> None:
        self._check_open()
        if not self._writable:
            raise OSError("connection is read-only")

    @property
    def closed(self) -> bool:
        """True once :meth:`close` was called."""
        return self._closed

    @property
    def readable(self) -> bool:
        """True if this end can receive."""
        return self._readable

    @property
    def writable(self) -> bool:
        """True if this end can send."""
        return self._writable

    def fileno(self) -> int:
        """A file descriptor that becomes readable when ZeroMQ has events for this end."""
        self._check_open()
        self._activate()
        return self._inbox.getsockopt(zmq.FD)

    # -- sending ---------------------------------------------------------------------
    def _send_frames(self, kind: str, frames: List[Any]) -> None:
        self._activate()
        if self._outbox is None:
            (answer, peer), _ = transport.client_for(self._registry).call(
                "pipe", "mail", self._pipe_id, 1 - self._end, kind, body=frames)
            if answer == "stored":
                return
            self._connect(peer)
        transport.send(self._outbox, (kind,), frames)

    def send(self, obj: Any) -> None:
        """Send a picklable object to the other end."""
        self._check_writable()
        self._send_frames(_OBJECT, reduction.dumps(obj))

    def send_bytes(self, buf: Any, offset: int = 0, size: Optional[int] = None) -> None:
        """Send bytes from a bytes-like object (optionally a slice ``[offset:offset+size]``)."""
        self._check_writable()
        view = memoryview(buf)
        if view.itemsize > 1:
            view = view.cast("B")
        n = view.nbytes
        if offset < 0:
            raise ValueError("offset is negative")
        if n < offset:
            raise ValueError("buffer length < offset")
        if size is None:
            size = n - offset
        elif size < 0:
            raise ValueError("size is negative")
        elif offset + size > n:
            raise ValueError("buffer length < offset + size")
        self._send_frames(_BYTES, [bytes(view[offset:offset + size])])

    # -- receiving -------------------------------------------------------------------
    def _wait(self, timeout: Optional[float]) -> bool:
        """Wait until a message (or EOF) is pending; False on timeout."""
        if self._pending or self._eof:
            return True
        self._activate()
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            try:
                got = transport.recv(self._inbox, flags=zmq.NOBLOCK)
            except zmq.Again:
                got = False
            if got:
                header, body = got
                self._pending.append((header[0], body))
                return True
            if got is None:
                continue  # unauthenticated message dropped
            if self._peer_gone:
                self._eof = True
                return True
            self._lookup_peer()
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                return False
            slice_ms = 1000 * (_LOOKUP_INTERVAL if self._peer_addr is None else 1.0)
            if remaining is not None:
                slice_ms = min(slice_ms, remaining * 1000)
            events = dict(self._poller.poll(slice_ms))
            if self._monitor is not None and self._monitor in events:
                recv_monitor_message(self._monitor)
                self._peer_gone = True  # drain what arrived, then EOF

    def _next(self) -> Tuple[str, List[Any]]:
        self._wait(None)
        if self._pending:
            kind, body = self._pending.popleft()
            if kind == _CLOSE:
                self._eof = True
                self._pending.clear()
                raise EOFError("the other end of the pipe was closed")
            return kind, body
        raise EOFError("the process holding the other end of the pipe is gone")

    def poll(self, timeout: Optional[float] = 0.0) -> bool:
        """Whether there is data to read, waiting up to ``timeout`` s (None: forever)."""
        self._check_readable()
        if timeout is not None and timeout < 0:
            timeout = 0.0
        return self._wait(timeout)

    def recv(self) -> Any:
        """Receive an object sent with :meth:`send` (``EOFError`` when the peer is gone)."""
        self._check_readable()
        kind, body = self._next()
        return reduction.loads(body)

    def recv_bytes(self, maxlength: Optional[int] = None) -> bytes:
        """Receive a message sent with :meth:`send_bytes` as ``bytes``."""
        self._check_readable()
        if maxlength is not None and maxlength < 0:
            raise ValueError("negative maxlength")
        kind, body = self._next()
        data = bytes(body[0]) if body else b""
        if maxlength is not None and len(data) > maxlength:
            self.close()
            raise OSError("bad message length")
        return data

    def recv_bytes_into(self, buf: Any, offset: int = 0) -> int:
        """Receive a message into ``buf`` at byte ``offset``; return its length.

        Raises ``BufferTooShort`` (carrying the message) when it does not fit.
        """
        self._check_readable()
        view = memoryview(buf)
        if view.itemsize > 1:
            view = view.cast("B")
        if offset < 0 or offset > view.nbytes:
            raise ValueError("offset out of bounds")
        kind, body = self._next()
        data = body[0] if body else b""
        size = memoryview(data).nbytes
        if size > view.nbytes - offset:
            raise BufferTooShort(bytes(data))
        view[offset:offset + size] = data
        return size

    # -- closing ---------------------------------------------------------------------
    def close(self) -> None:
        """Close this end; the other end then gets ``EOFError`` (see the module doc)."""
        if self._closed:
            return
        active_here = self._pid == os.getpid()
        try:
            if active_here or not self._shipped:
                if self._writable or self._readable:
                    self._send_close()
        except Exception:
            logger.debug("could not tell the peer of %r that it closed", self, exc_info=True)
        finally:
            self._closed = True
            if active_here:
                for sock in (self._monitor, self._outbox, self._inbox):
                    if sock is not None:
                        sock.close()
                _live.discard(self)
            self._inbox = self._outbox = self._monitor = self._poller = None

    def _send_close(self) -> None:
        if self._pid != os.getpid():
            # never used here: leave the marker in the peer's mailbox, or send it directly
            (answer, peer), _ = transport.client_for(self._registry).call(
                "pipe", "mail", self._pipe_id, 1 - self._end, _CLOSE, timeout=5.0)
            if answer == "stored":
                transport.client_for(self._registry).cast("pipe", "closed", self._pipe_id, self._end)
                return
            sock = transport.context().socket(zmq.PUSH)
            sock.setsockopt(zmq.LINGER, 2000)
            sock.connect(peer)
            transport.send(sock, (_CLOSE,))
            sock.close()
        else:
            self._send_frames(_CLOSE, [])
        transport.client_for(self._registry).cast("pipe", "closed", self._pipe_id, self._end)

    def __enter__(self) -> "Connection":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __del__(self) -> None:
        if not getattr(self, "_closed", True) and self._pid == os.getpid():
            try:
                for sock in (self._monitor, self._outbox, self._inbox):
                    if sock is not None:
                        sock.close(linger=1000)
            except Exception:
                pass


def _rebuild(pipe_id: str, end: int, registry: str, readable: bool, writable: bool) -> Connection:
    conn = Connection(pipe_id, end, registry, readable, writable)
    conn._activate()
    return conn
