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

Two ends in one process talk over ``inproc://`` (a message sent is at once
readable); ends in different processes over TCP.

End of file, as with file descriptors, comes when the *last* copy of the other end
is closed: a closing copy hands its unread messages back to the rendezvous (so a
copy that peeked with ``poll`` loses nothing) and learns how many copies remain; the
last one sends the close marker. A copy that was sent to another process and never
used here does not count. A peer whose process dies is noticed through its inbox
connection dropping; the rendezvous then confirms the job is gone, and ``recv``
raises ``EOFError`` instead of hanging.

Sending an end that is active here to another process hands it over: unread
messages go back to the rendezvous and the arriving copy receives what is sent next.
Limitation: a peer in a third process that is already connected to the old copy may
deliver a message to it in the moment of the hand-over; and when several processes
use copies of one end at once, senders deliver to the copy that became active last.
"""
from __future__ import annotations

import collections
import logging
import os
import secrets
import time
import weakref
from multiprocessing import BufferTooShort
from typing import Any, Deque, List, Optional, Tuple

import zmq

from . import reduction, transport
from .rendezvous import pipe_registry

logger = logging.getLogger(__name__)

_OBJECT, _BYTES, _CLOSE = "o", "b", "c"
_LOOKUP_INTERVAL = 0.2


_live: "weakref.WeakSet[Connection]" = weakref.WeakSet()
_proc = {"pid": None, "id": None}


def _process_id() -> str:
    """A name for this process that no other process anywhere shares."""
    if _proc["pid"] != os.getpid():
        _proc["pid"], _proc["id"] = os.getpid(), f"{transport.local_hostname()}:{os.getpid()}:{secrets.token_hex(4)}"
    return _proc["id"]


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
    registry = pipe_registry()
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
        self._dormant_pid: Optional[int] = None  # process that handed it on, still holding it
        self._inbox: Optional[zmq.Socket] = None
        self._outbox: Optional[zmq.Socket] = None
        self._monitor: Optional[zmq.Socket] = None
        self._peer_loc: Optional[dict] = None
        self._peer_gone = False
        self._suspect = False
        self._eof = False
        self._pending: Deque[Tuple[str, List[Any]]] = collections.deque()
        self._poller: Optional[zmq.Poller] = None
        self._last_lookup = 0.0

    # -- pickling: an end sent to another process becomes active there -------------
    def __reduce__(self):
        self._check_open()
        self._shipped = True
        transport.client_for(self._registry).cast("pipe", "ship", self._pipe_id, self._end)
        if self._pid == os.getpid():
            self._hand_over()
        return (_rebuild, (self._pipe_id, self._end, self._registry, self._readable,
                           self._writable))

    def __repr__(self) -> str:
        state = "closed" if self._closed else ("active" if self._pid == os.getpid() else "idle")
        return f"<fiberrl.Connection pipe={self._pipe_id} end={self._end} {state}>"

    # -- activation ------------------------------------------------------------------
    def _activate(self, arrived: bool = False) -> None:
        if self._pid == os.getpid():
            return
        ctx = transport.context()
        inbox = ctx.socket(zmq.PULL)
        inbox.setsockopt(zmq.LINGER, 0)
        from .backends import default_backend
        from .popen import current_job_token
        loc = {"tcp": transport.bind_random(inbox, default_backend().listen_host()),
               "inproc": f"inproc://fiberrl-pipe-{self._pipe_id}-{self._end}-{secrets.token_hex(4)}",
               "proc": _process_id()}
        inbox.bind(loc["inproc"])
        client = transport.client_for(self._registry)
        (kinds, counts, peer), body = client.call("pipe", "register", self._pipe_id, self._end,
                                                  loc, loc["proc"], current_job_token(), arrived)
        self._inbox, self._pid = inbox, os.getpid()
        self._outbox = self._monitor = self._peer_loc = None
        self._poller = zmq.Poller()
        self._poller.register(inbox, zmq.POLLIN)
        position = 0
        for kind, count in zip(kinds, counts):
            self._pending.append((kind, body[position:position + count]))
            position += count
        if peer is not None:
            self._connect(peer)
        _live.add(self)

    def _disconnect(self) -> None:
        if self._monitor is not None:
            self._poller.unregister(self._monitor)
        if self._outbox is not None:
            transport.close_monitored(self._outbox, self._monitor, 2000)
        self._outbox = self._monitor = self._peer_loc = None

    def _connect(self, loc: dict) -> None:
        self._disconnect()
        outbox = transport.context().socket(zmq.PUSH)
        transport.configure_peer_socket(outbox)
        same_process = loc["proc"] == _process_id()
        if same_process:
            outbox.connect(loc["inproc"])  # same process: delivered at once
        else:
            self._monitor = transport.monitor_socket(outbox, zmq.EVENT_CONNECTED | zmq.EVENT_DISCONNECTED)
            self._poller.register(self._monitor, zmq.POLLIN)
            outbox.connect(loc["tcp"])
        # until the connection is confirmed, keep asking the rendezvous about the peer
        self._outbox, self._peer_loc, self._suspect = outbox, loc, not same_process

    def _lookup_peer(self) -> None:
        """Find (or re-find) the other end; decide EOF if its last holder is gone."""
        now = time.monotonic()
        if now - self._last_lookup < _LOOKUP_INTERVAL:
            return
        self._last_lookup = now
        (loc, holders), _ = transport.client_for(self._registry).call(
            "pipe", "lookup", self._pipe_id, 1 - self._end)
        if loc is not None and loc != self._peer_loc:
            self._connect(loc)
        elif self._suspect and holders == 0:
            self._peer_gone = True

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
        self._activate()
        if self._pending or self._eof:
            return True
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
            if self._peer_loc is None or self._suspect:
                self._lookup_peer()
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                return False
            slice_ms = 1000 * (_LOOKUP_INTERVAL if self._peer_loc is None or self._suspect else 1.0)
            if remaining is not None:
                slice_ms = min(slice_ms, remaining * 1000)
            events = dict(self._poller.poll(slice_ms))
            if self._monitor is not None and self._monitor in events:
                # connected: the peer is there; dropped: ask whether any copy is left
                self._suspect = transport.monitor_event(self._monitor) != zmq.EVENT_CONNECTED

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
        """Close this copy; when it is the last copy, the other end gets ``EOFError``."""
        if self._closed:
            return
        try:
            if self._pid == os.getpid() or self._dormant_pid == os.getpid():
                self._release()
            elif not self._shipped:
                self._close_unused()
        except Exception:
            logger.debug("could not tell the peer of %r that it closed", self, exc_info=True)
        finally:
            self._closed = True
            if self._pid == os.getpid():
                self._disconnect()
                self._inbox.close()
            _live.discard(self)
            self._inbox = self._poller = None
            self._pending.clear()

    def _hand_over(self) -> None:
        """This copy is being sent to another process: give up being the active copy
        here (unread messages go back to the rendezvous), so the copy that arrives
        there receives what is sent from now on. A peer end in this same process
        is told at once; peers elsewhere notice when they next look the end up."""
        self._release(keep=True)
        self._disconnect()
        self._inbox.close()
        self._inbox = self._poller = None
        self._pid, self._dormant_pid = None, os.getpid()
        self._pending.clear()
        for other in list(_live):
            if (other._pipe_id == self._pipe_id and other._end != self._end
                    and other._pid == os.getpid()):
                other._disconnect()

    def _release(self, keep: bool = False) -> None:
        """Hand unread messages back to the rendezvous; the last copy sends EOF.

        With ``keep`` this process still holds the end (it was handed on): no EOF.
        """
        while self._pid == os.getpid():
            try:
                got = transport.recv(self._inbox, flags=zmq.NOBLOCK)
            except zmq.Again:
                break
            if got:
                self._pending.append((got[0][0], got[1]))
        unread = list(self._pending)
        (remaining,), _ = transport.client_for(self._registry).call(
            "pipe", "release", self._pipe_id, self._end, _process_id(),
            [kind for kind, _ in unread], [len(body) for _, body in unread],
            keep, body=[frame for _, body in unread for frame in body], timeout=10.0)
        if not keep and remaining == 0 and not self._eof:
            if self._pid == os.getpid():
                self._send_frames(_CLOSE, [])
            else:
                self._close_unused()

    def _close_unused(self) -> None:
        """Closing a copy never used nor sent anywhere: the peer gets EOF."""
        client = transport.client_for(self._registry)
        (answer, loc), _ = client.call("pipe", "mail", self._pipe_id, 1 - self._end, _CLOSE,
                                       timeout=10.0)
        if answer == "peer":
            sock = transport.context().socket(zmq.PUSH)
            sock.setsockopt(zmq.LINGER, 2000)
            sock.connect(loc["tcp"])
            transport.send(sock, (_CLOSE,))
            sock.close()

    def __enter__(self) -> "Connection":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __del__(self) -> None:
        if not getattr(self, "_closed", True) and self._pid == os.getpid():
            try:
                self._disconnect()
                self._inbox.close()
            except Exception:
                pass


def _rebuild(pipe_id: str, end: int, registry: str, readable: bool, writable: bool) -> Connection:
    conn = Connection(pipe_id, end, registry, readable, writable)
    conn._activate(arrived=True)
    return conn
