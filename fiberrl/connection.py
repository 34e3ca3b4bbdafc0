"""``Pipe()`` and ``Connection``: two ends that talk directly, from any two machines.

Data flow::

    end A (process P)                                      end B (process C)
    Outbox ----- stream (Unix socket on one host, TCP) -----> Inbox
    Inbox  <---------------------- stream -------------------- Outbox
            \\___ rendezvous: "pipe" service of the creating process    ___/
                 (where does each end live? mailbox for messages sent before it knew)

An end becomes *active* in a process when it is first used there, or at once when it
is unpickled in another process: it opens an :class:`~fiberrl._services.pipe_inbox.Inbox` behind
this process's acceptor and registers the acceptor's addresses with the creator's
registry, receiving any messages that were left in its mailbox. A sender whose peer is not
active yet leaves messages in the peer's mailbox (the registry answers "stored" or "the
peer is now at X"), so order is kept: mailbox messages are handed over at
registration, before any direct message can arrive. Activation and the stream
to the peer are :mod:`fiberrl._services.pipe_peer`'s part of an end, closing and handing
on :mod:`fiberrl._services.pipe_closing`'s. The streams themselves are described in
:mod:`fiberrl._services.pipe_inbox` (receiving) and :mod:`fiberrl._services.pipe_outbox`
(sending), their format and authentication in :mod:`fiberrl._wire.framing`; the
rendezvous and the mailbox are calls to the creating process's "pipe" service
(:mod:`fiberrl._services.pipe_registry`).

Two ends in one process hand messages over in memory (a message sent is at once
readable, and sending never blocks on a reader that is the sender's own thread).

End of file, as with file descriptors, comes when the *last* copy of the other end
is closed: a closing copy hands its unread messages back to the rendezvous (so a
copy that peeked with ``poll`` loses nothing) and learns how many copies remain; the
last one sends the close marker. A copy that was sent to another process and never
used here does not count, except against a copy closed without being used (a job
given an end only to close it): the sender's copy then keeps the pipe open until it
is closed too, as a descriptor would. A peer whose process dies is noticed through its streams
ending; the rendezvous then confirms the job is gone, and ``recv`` raises
``EOFError`` instead of hanging (``send`` raises ``BrokenPipeError``).

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
import time
from multiprocessing import BufferTooShort
from typing import Any, Deque, List, Optional, Tuple

from . import reduction
from ._runtime import dropped, jobenv
from ._runtime.rpc import client_for
from ._wire.buffers import receive_target, send_slice
from ._services.pipe_closing import live_ends, process_id
from ._services.pipe_inbox import STREAM_DROPPED, Inbox
from ._services.pipe_peer import LOOKUP_INTERVAL, PROBE_SECONDS, TAKEN_AWAY, PipeEndPeer
from ._services.pipe_registry import CLOSE, pipe_registry
from .connection_wait import wait
from .listener import CHALLENGE, Client, Listener, answer_challenge, deliver_challenge, families

logger = logging.getLogger(__name__)

__all__ = ["Client", "Listener", "Pipe", "wait", "Connection", "answer_challenge",
           "deliver_challenge"]

_OBJECT, _BYTES, _CLOSE = b"o", b"b", CLOSE
_SIGNED_BYTES = 1 << 16   # send_bytes payloads below this are covered by the MAC
_QUICK_BYTES = 1 << 15    # send_bytes payloads below this take the short path
_SEND_ATTEMPTS = 3   # tried at once; then as _Retry says
_MOVE_SECONDS = 5.0   # how long a sender waits for a moving peer end to arrive


def close_all() -> None:
    """Close every active connection of this process, and those dropped unclosed whose
    close is still queued (at job exit: peers see EOF)."""
    dropped.run_queued()
    for conn in list(live_ends):
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
    address = registry.runtime.address
    first = Connection(pipe_id, 0, address, readable=True, writable=duplex)
    second = Connection(pipe_id, 1, address, readable=duplex, writable=True)
    return first, second


class _Retry:
    """The attempts of one send whose stream to the peer end failed. The first retries
    are at once; then the rendezvous still names a copy that no longer receives there: it
    is moving to another process (or closing), which the rendezvous learns in a moment, so
    later attempts wait a little, for up to :data:`_MOVE_SECONDS` in all."""

    __slots__ = ("attempts", "deadline", "pause", "connects")

    def __init__(self) -> None:
        self.attempts, self.deadline, self.pause, self.connects = 0, 0.0, 0.001, 0

    def connect_timeout(self) -> Optional[float]:
        """How long the next connect may wait: the first only a moment (the peer may
        have just died with its address, where a connect waits out ARP or SYN
        timeouts: the rendezvous knows better a moment later); then the usual limit."""
        self.connects += 1
        return PROBE_SECONDS if self.connects == 1 else None

    def again(self, conn: "Connection") -> bool:
        """Whether to try (again); ``BrokenPipeError`` once the time is up."""
        self.attempts += 1
        if self.attempts <= _SEND_ATTEMPTS:
            if self.attempts == 1:
                self.deadline = time.monotonic() + _MOVE_SECONDS
            return True
        if time.monotonic() > self.deadline:
            raise BrokenPipeError(f"cannot reach the other end of {conn!r}")
        time.sleep(self.pause)
        self.pause = min(self.pause * 2, 0.05)
        return True


class Connection(PipeEndPeer):
    """One end of a :func:`Pipe`: ``send``/``recv`` objects, ``send_bytes``/``recv_bytes``."""

    def __init__(self, pipe_id: str, end: int, registry: str, readable: bool = True,
                 writable: bool = True) -> None:
        self._pipe_id, self._end, self._registry = pipe_id, end, registry
        self._readable, self._writable = readable, writable
        self._owner_pid = os.getpid()   # made or received here: closed here when dropped
        dropped.start()
        self._closed = False
        self._shipped = False
        self._used = False   # sent or received through in this process
        self._pid: Optional[int] = None  # process in which this end is active
        self._dormant_pid: Optional[int] = None  # process that handed it on, still holding it
        self._inbox: Optional[Inbox] = None
        self._outbox: Any = None   # Outbox or LocalOutbox
        self._peer_loc: Optional[dict] = None
        self._peer_gone = False
        self._peer_held = False   # gone, but a copy is held unused somewhere (see above)
        self._peer_close_due = 0.0   # peer closed cleanly: its marker is due by then
        self._suspect = False
        self._eof = False
        self._pending: Deque[Tuple[bytes, List[Any]]] = collections.deque()
        self._last_lookup = 0.0

    # -- pickling: an end sent to another process becomes active there -------------
    def __reduce__(self):
        self._check_open()
        self._shipped = True
        from ._runtime.jobenv import current_job_token, shipping_token
        # a copy never active here is still held here, as a descriptor would be: the
        # rendezvous counts it against a receiver that closes its copy unused
        held_here = None if self._pid == jobenv.pid else (process_id(), current_job_token())
        client_for(self._registry).cast("pipe", "ship", self._pipe_id, self._end,
                                        shipping_token(), held_here)
        if self._pid == jobenv.pid:
            self._hand_over()
        return (_rebuild, (self._pipe_id, self._end, self._registry, self._readable,
                           self._writable))

    def __repr__(self) -> str:
        state = "closed" if self._closed else ("active" if self._pid == jobenv.pid else "idle")
        return f"<fiberrl.Connection pipe={self._pipe_id} end={self._end} {state}>"

    # -- checks ----------------------------------------------------------------------
    def _check_open(self) -> None:
        if self._closed:
            raise OSError("handle is closed")

    def _check_readable(self) -> None:
        self._check_open()
        self._used = True
        if not self._readable:
            raise OSError("connection is write-only")

    def _check_writable(self) -> None:
        self._check_open()
        self._used = True
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
        """A descriptor that is readable while there is something to receive
        (``multiprocessing.connection.wait`` works with it)."""
        self._check_open()
        self._activate()
        self._collect(0)
        if self._pending:
            self._inbox.wake()  # messages already read off the streams count too
        return self._inbox.fileno()

    # -- connection.wait (fiberrl.connection_wait) -------------------------------------
    def _ready_for_wait(self) -> bool:
        """Whether a message or end of file is pending (never blocks)."""
        self._check_open()
        return self._readable and self._wait(0)

    def _wait_fd(self) -> int:
        """The descriptor that wakes a wait when something arrives for this end."""
        self._check_open()
        self._activate()
        return self._inbox.fileno()

    def _wait_slice(self) -> float:
        """How long a wait may sleep before this end must ask the rendezvous again."""
        return LOOKUP_INTERVAL if self._peer_loc is None or self._suspect else 1.0

    # -- sending ---------------------------------------------------------------------
    def _send_frames(self, kind: bytes, frames: List[Any]) -> None:
        self._activate()
        if self._peer_gone and not self._peer_held and kind != _CLOSE:
            raise BrokenPipeError("the other end of the pipe is closed")
        retry = _Retry()
        while retry.again(self):
            if self._outbox is None:
                (answer, peer), _ = client_for(self._registry).call(
                    "pipe", "mail", self._pipe_id, 1 - self._end, kind, body=frames)
                if answer == "stored":
                    return
                if answer == "closed":
                    self._peer_gone, self._peer_held = True, False
                    raise BrokenPipeError("the other end of the pipe is closed")
                if answer == "doubt" or not self._connect(peer, retry.connect_timeout()):
                    self._check_peer_there()
                    continue
            try:
                if self._outbox.hung_up():   # the copy it led to closed or moved on
                    raise ConnectionResetError("the other end's stream ended")
                self._outbox.send(kind, frames)
                return
            except OSError as exc:
                self._stream_broke(exc)
                self._check_peer_there()

    def _send_quick(self, kind: bytes, payload: bytes) -> bool:
        """Send one small ``bytes`` payload the short way when the end is active here and
        connected (the usual case; the caller has checked that it is open and
        writable); False when the general path must do it."""
        self._used = True
        outbox = self._outbox
        if (outbox is None or self._peer_gone or self._pid != jobenv.pid
                or len(payload) >= _QUICK_BYTES):
            return False
        try:
            outbox.send_small(kind, payload)
        except OSError as exc:   # the general path reconnects, or says why it cannot
            self._stream_broke(exc)
            return False
        return True

    def send(self, obj: Any) -> None:
        """Send a picklable object to the other end."""
        if self._closed or not self._writable:
            self._check_writable()   # raises why it cannot
        frames = reduction.dumps(obj)
        if len(frames) != 1 or not self._send_quick(_OBJECT, frames[0]):
            self._check_writable()   # closed meanwhile by another thread?
            self._send_frames(_OBJECT, frames)

    def send_bytes(self, buf: Any, offset: int = 0, size: Optional[int] = None) -> None:
        """Send bytes from a bytes-like object (optionally a slice ``[offset:offset+size]``)."""
        if self._closed or not self._writable:
            self._check_writable()   # raises why it cannot
        if type(buf) is bytes and offset == 0 and size is None:
            if self._send_quick(_BYTES, buf):
                return
            data = buf
        else:
            data = send_slice(buf, offset, size)
        self._check_writable()   # closed meanwhile by another thread?
        # small payloads travel as the signed frame; large ones unhashed (_wire.framing)
        self._send_frames(_BYTES, [data] if len(data) < _SIGNED_BYTES else [b"", data])

    # -- receiving -------------------------------------------------------------------
    def _wait(self, timeout: Optional[float]) -> bool:
        """Wait until a message (or EOF) is pending; False on timeout."""
        self._activate()
        if self._pending or self._eof:
            return True
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            slice_s = self._wait_slice()
            if deadline is not None:
                slice_s = min(slice_s, max(0.0, deadline - time.monotonic()))
            self._collect(slice_s)
            if self._pending:
                if self._peer_loc is None:
                    self._find_peer_of_a_receiver()
                return True
            if self._peer_loc is None or self._suspect:
                self._lookup_peer()
            if self._peer_gone and self._took_the_peers_last_words():
                return True
            if deadline is not None and time.monotonic() >= deadline:
                return False

    def _took_the_peers_last_words(self) -> bool:
        """The rendezvous says the peer is gone. What it sent before is in this end's
        streams, possibly arrived after the last look at them (or, from another host,
        still on its way, ahead of the close marker a clean close sends last): take it
        before the end of file. True when something, or the end of file, is pending."""
        inbox = self._live_inbox()
        try:
            inbox.drain(self._pending)
        except ValueError:   # its epoll set was closed under this thread
            raise OSError(TAKEN_AWAY) from None
        if self._pending:
            return True
        if time.monotonic() < self._peer_close_due:
            return False   # its close marker is on its way: keep receiving
        self._eof = True
        return True

    def _live_inbox(self) -> Inbox:
        """The inbox of this active end; ``OSError`` if another thread of this process
        closed the end or handed it to another process meanwhile."""
        inbox = self._inbox
        if inbox is None or inbox.closed:
            raise OSError(TAKEN_AWAY)
        return inbox

    def _collect(self, timeout: float) -> None:
        """Move what arrives within ``timeout`` s into the pending messages."""
        inbox = self._live_inbox()
        try:
            ended = inbox.receive(self._pending, timeout)
        except ValueError:   # its epoll set was closed under this thread
            raise OSError(TAKEN_AWAY) from None
        if ended:
            self._stream_ended(ended)

    def _next(self) -> Tuple[bytes, List[Any]]:
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
        if self._closed or not self._readable:
            self._check_readable()   # raises why it cannot
        self._used = True
        if timeout is not None and timeout < 0:
            timeout = 0.0
        if self._pid == jobenv.pid:   # active here (else _wait activates it)
            if self._pending or self._eof:
                return True
            if timeout == 0:
                return self._wait(0)
            # a wait: the short way first
            started = time.monotonic()
            self._take_quick(None, 1.0 if timeout is None else min(timeout, 1.0))
            if self._pending:
                return True
            if timeout is not None:
                timeout = max(0.0, timeout - (time.monotonic() - started))
        return self._wait(timeout)

    def _take_quick(self, kind: Optional[bytes], timeout: float = 1.0) -> Optional[bytes]:
        """The one frame of the next message, taken the short way when the end is
        active here, connected and the message is of ``kind`` (the usual case); None
        when the general path must decide (nothing within ``timeout`` s, end of file, a
        broken stream, an end closed or handed on by another thread meanwhile), or
        when the message is of another kind (``kind`` None: ``poll``), which then
        waits in the pending messages."""
        self._used = True
        pending = self._pending
        if pending:   # (what a poll took): no need to be connected to hand it out
            if (pending[0][0] == kind and len(pending[0][1]) == 1 and self._pid == jobenv.pid
                    and self._readable and not self._closed):
                return pending.popleft()[1][0]
            return None
        if (self._pid != jobenv.pid or not self._readable or self._closed or self._suspect
                or self._eof or self._peer_loc is None):
            return None
        inbox = self._inbox
        if inbox is not None:
            try:
                return inbox.take(kind, pending, timeout)
            except ValueError:   # its epoll set was closed under this thread
                pass
            except EOFError:   # a forged message: the stream was dropped
                self._stream_ended(STREAM_DROPPED)
        return None

    def recv(self) -> Any:
        """Receive an object sent with :meth:`send` (``EOFError`` when the peer is gone)."""
        payload = self._take_quick(_OBJECT)
        if payload is not None:
            return reduction.loads_one(payload)
        self._check_readable()
        kind, body = self._next()
        return reduction.loads(body)

    def recv_bytes(self, maxlength: Optional[int] = None) -> bytes:
        """Receive a message sent with :meth:`send_bytes` as ``bytes``."""
        if maxlength is None:
            payload = self._take_quick(_BYTES)
            if payload is not None:   # (a view when it waited in the mailbox)
                return bytes(payload)
        self._check_readable()
        if maxlength is not None and maxlength < 0:
            raise ValueError("negative maxlength")
        kind, body = self._next()
        data = bytes(body[-1]) if body else b""
        if maxlength is not None and len(data) > maxlength:
            self.close()
            raise OSError("bad message length")
        return data

    def recv_bytes_into(self, buf: Any, offset: int = 0) -> int:
        """Receive a message into ``buf`` at byte ``offset``; return its length.

        Raises ``BufferTooShort`` (carrying the message) when it does not fit.
        """
        self._check_readable()
        view = receive_target(buf, offset)
        kind, body = self._next()
        data = body[-1] if body else b""
        size = memoryview(data).nbytes
        if size > view.nbytes - offset:
            raise BufferTooShort(bytes(data))
        view[offset:offset + size] = data
        return size

    def __enter__(self) -> "Connection":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _rebuild(pipe_id: str, end: int, registry: str, readable: bool, writable: bool) -> Connection:
    conn = Connection(pipe_id, end, registry, readable, writable)
    conn._activate(arrived=True)
    return conn
