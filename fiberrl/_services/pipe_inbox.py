"""Where a pipe end receives: its :class:`Inbox`, and the :class:`PipeEnds` of a process.

Data flow::

    sender in another process --stream "pipe:<id>:<end>"--> runtime's acceptor
                                  (set-up, proof)  --> PipeEnds --attach--> Inbox
    sender in this process ------------------- deliver_local -----------------> Inbox
                                                                  recv() reads it here

A sender opens an authenticated stream to the receiving process's runtime (one
listener per process) with the label of the pipe end it wants; the acceptor checks
the proof and hands the stream to that end's inbox, or answers "not here" when the
end is not active in that process (it was handed on or closed). From then on the
thread that calls ``recv`` reads the stream itself: the I/O loop only ever sees
set-ups, so a busy receiver never stalls a connecting sender, and a message costs no
thread switch.

An inbox waits on one epoll set (its streams, a wake-up pipe for senders in this
process, and optionally the end's own outbox, whose stream breaking is news too), so
``fileno()`` of a ``Connection`` is an honest, pollable descriptor.

Messages from several senders (copies of one end in several processes, or a sender
in this process too) come out in the order they were sent, as from one kernel pipe:
each carries its send time, and a message is handed on only once every stream has been
looked at after its send time, so that one sent earlier, by a sender that had to wait
for it (a lock, a barrier), cannot come second. Send times are wall-clock times, so this
holds across hosts as far as their clocks agree; a message counts as sent no later than
it was read, so a host whose clock runs ahead delays nothing.

Waiting spins a little before it sleeps, adaptively (:mod:`fiberrl._wire.spin`
says why and how), so a slow peer (an environment step, a long computation) costs
no polling.
"""
from __future__ import annotations

import collections
import logging
import os
import select
import socket
import threading
import time
from typing import Any, Deque, Dict, List, Optional, Tuple

from .._runtime.runtime import Runtime, existing_service, service
from .._wire.auth import MAC_BYTES, Verifier
from .._wire.framing import FrameReader, Message, scratch_buffer
from .._wire.sockets import Address
from .._wire.spin import Backoff, SpinGate, spin_budget, spin_for
from ..errors import ForgedMessageError
from .pipe_stamp import FRAME_AT, PAYLOAD_AT, STAMP_BYTES, clock_ns, unpack_stamped_head, unstamp

logger = logging.getLogger(__name__)

#: how long an inbox that stops receiving reads on a TCP stream for what its sender
#: wrote before it learnt of the stop (see :meth:`Inbox.stop_receiving`)
TCP_FLUSH_SECONDS = 0.2

#: what :meth:`Inbox.receive` reports besides messages (bits)
STREAM_DROPPED = 1   # a sender's stream ended
OUTBOX_BROKE = 2     # the end's own outbox, which the inbox watches, ended


class Inbox:
    """The receiving side of one active pipe end: streams, local deliveries, wake-ups."""

    def __init__(self) -> None:
        self._spin = spin_budget()
        self._spin_gate = SpinGate()
        # whether take() reads the lone stream before it waits: a message that already
        # arrived (a reply that came while this process ran, the second of two) then
        # costs one system call, not three; backs off while it finds nothing
        self._probe = Backoff()
        self._epoll = select.epoll()
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        self._epoll.register(self._wake_r, select.EPOLLIN)
        self._lock = threading.Lock()
        self._local: Deque[Tuple[int, Message]] = collections.deque()   # (send time, message)
        self._readers: Dict[int, FrameReader] = {}
        # per stream: the send time its last message was merged at (see _read)
        self._merged_at: Dict[int, int] = {}
        self._held: List[Tuple[int, Message]] = []   # sent after the last horizon: see receive
        self._local_used = False   # a sender in this process delivered here
        self._local_sent = 0   # the send time of the last local delivery
        #: the only sender stream while no sender in this process has delivered here,
        #: which receive() reads without ordering: (the epoll events of that stream
        #: alone being readable, its reader); (None, None) when there is none
        self._lone: Tuple[Any, Optional[FrameReader]] = (None, None)
        self._watched: Optional[int] = None
        self.closed = False

    def fileno(self) -> int:
        """Readable when something arrived for this end (the epoll set's descriptor)."""
        return self._epoll.fileno()

    # -- called from other threads ---------------------------------------------------
    def attach(self, sock: socket.socket, recv_key: bytes, initial: bytes) -> bool:
        """Take a new authenticated stream (the I/O loop); False if closed."""
        with self._lock:
            if self.closed:
                return False
            sock.setblocking(False)
            reader = FrameReader(sock, Verifier(recv_key), initial)
            self._readers[sock.fileno()] = reader
            self._epoll.register(sock.fileno(), select.EPOLLIN)
            self._find_lone()
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
            self._local_used = True
            self._lone = (None, None)
            # never before the last one (the clock may be set back): kept in send order
            self._local_sent = max(self._local_sent, clock_ns())
            self._local.append((self._local_sent, (kind, frames)))

    def wake(self) -> None:
        """Make :meth:`fileno` readable now (until the next :meth:`receive`)."""
        with self._lock:
            self._poke()

    def _find_lone(self) -> None:
        """Set :attr:`_lone` from the streams (the lock held)."""
        self._lone = (None, None)
        if len(self._readers) == 1 and not self._local_used:
            fd, reader = next(iter(self._readers.items()))
            self._lone = ([(fd, select.EPOLLIN)], reader)

    def _poke(self) -> None:
        if self._wake_w < 0:
            return   # closed (the lock is held: it cannot close meanwhile)
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

    def receive(self, into: Deque[Message], timeout: float) -> int:
        """Wait up to ``timeout`` s; append arrived messages to ``into``.

        Returns what else happened, as bits: :data:`STREAM_DROPPED` (a sender's stream
        ended) and :data:`OUTBOX_BROKE` (the watched outbox did); either may mean the
        peer is gone: ask the rendezvous. 0 when neither did.
        """
        held = self._held
        events = self._epoll.poll(0.0) if held else self._events(timeout)
        if not events and not held:
            return 0
        lone = self._lone
        if events == lone[0] and not held:
            # one sender, nothing to put in order
            try:
                messages = lone[1].read()
            except EOFError as exc:
                self._stream_ended(events[0][0], exc)
                return STREAM_DROPPED
            for message in messages:
                into.append(unstamp(message)[1])
            return 0
        items, ended = self._read(events)
        if len(self._readers) > 1 or self._held or self._local_used:
            # Several senders: a message may only be handed on once every message sent
            # before it is here. One sent before ``horizon`` is in its stream by then
            # (or was sent concurrently, without an order to keep), so after a last
            # look at every stream, what was sent up to ``horizon`` goes out in send
            # order and anything later waits for the next call (module doc).
            horizon = clock_ns()
            more, ended_more = self._read(self._epoll.poll(0))
            items += more + self._held
            ended |= ended_more
            items.sort(key=lambda item: item[0])   # stable: one sender's order is kept
            ready = [item for item in items if item[0] <= horizon]
            self._held = items[len(ready):]
            if self._held:
                with self._lock:
                    self._poke()   # fileno() stays readable while messages wait here
            items = ready
        if items:
            into.extend(message for _, message in items)
        return ended

    def take(self, kind: Optional[bytes], into: Deque[Message],
             timeout: float) -> Optional[bytes]:
        """The payload of the next message, waiting up to ``timeout`` s, when it is a
        one-frame message of ``kind`` that arrives alone on the only sender stream:
        the pipe's hot path (a request and its reply, an environment's step), read and
        checked here in one step. Otherwise None, and any message this call read is
        appended to ``into``: a lone one-frame message of another kind (any kind, when
        ``kind`` is None: ``poll``) read the same short way. None with nothing read
        when :meth:`receive` must decide: nothing came, or not only there, or a
        message began earlier. A message that arrived already is read before any wait
        (while such reads find one: :attr:`_probe`).

        Raises ``EOFError`` (a :class:`ForgedMessageError`) when the stream carried a
        forged message: the stream is dropped, as :meth:`receive` reports with
        :data:`STREAM_DROPPED`.
        """
        events_alone, reader = self._lone
        if reader is None or self._held or reader.partial or reader.big is not None:
            return None
        scratch, view = scratch_buffer()
        n = -1
        if self._probe.due():   # arrived already? Then no epoll call, no spin
            try:
                n = reader.sock.recv_into(scratch)
            except BlockingIOError:
                pass
            except OSError:   # nothing taken (after a reset, receive() reads the end)
                return None
            self._probe.record(n >= 0)
        if n < 0:
            if self._events(timeout) != events_alone:
                return None   # (epoll is level-triggered: receive() sees the same events)
            try:
                n = reader.sock.recv_into(scratch)
            except OSError:
                return None
        if not n:
            return None   # the stream's end, which receive() reads again and reports
        try:
            if n > PAYLOAD_AT:
                got, count, size, _sent, empty = unpack_stamped_head(scratch)
                end = FRAME_AT + size
                if n == end + MAC_BYTES and count == 1 and not empty and size >= STAMP_BYTES:
                    reader.verifier.check_one(view[end:n], view[:end])
                    payload = bytes(view[PAYLOAD_AT:end])
                    if got == kind:
                        return payload
                    into.append((got, [payload]))
                    return None
            messages = reader.absorb(scratch, view, n)   # several, part of one, another kind
            for message in messages:
                into.append(unstamp(message)[1])
        except ForgedMessageError as exc:
            self._stream_ended(events_alone[0][0], exc)
            raise
        return None

    def _read(self, events: List[Tuple[int, int]]) -> Tuple[List[Tuple[int, Message]], int]:
        """What the streams (and local senders) behind ``events`` have: ``(send time,
        message)`` pairs, and what else happened (bits, as :meth:`receive` returns)."""
        items: List[Tuple[int, Message]] = []
        ended = 0
        for fd, _ in events:
            if fd == self._wake_r:
                items += self._take_local()
            elif fd == self._watched:
                ended |= OUTBOX_BROKE
            else:
                reader = self._readers.get(fd)
                if reader is None:
                    continue
                messages = self._read_stream(fd, reader)
                if messages is None:
                    ended |= STREAM_DROPPED
                elif messages:
                    items += self._merge_times(fd, messages)
        return items, ended

    def _merge_times(self, fd: int, messages: List[Message]) -> List[Tuple[int, Message]]:
        """``(send time, message)`` pairs for what one stream brought, the times made
        fit to merge by: a message was sent no later than it was read (a sender on a
        host whose clock runs ahead is not held back until this clock catches up), and
        no earlier than the one before it on its stream (a clock set back cannot
        reorder one sender's messages)."""
        read_at = clock_ns()
        floor = self._merged_at.get(fd, 0)
        pairs = []
        for message in messages:
            sent, message = unstamp(message)
            floor = max(floor, min(sent, read_at))
            pairs.append((floor, message))
        self._merged_at[fd] = floor
        return pairs

    def _read_stream(self, fd: int, reader: FrameReader) -> Optional[List[Message]]:
        """What one sender's stream has; None when it ended (it is dropped then)."""
        try:
            return reader.read()
        except EOFError as exc:
            self._stream_ended(fd, exc)
            return None

    def _stream_ended(self, fd: int, exc: EOFError) -> None:
        if isinstance(exc, ForgedMessageError):
            logger.warning("dropped a pipe stream: %s", exc)
        self._drop(fd)

    def _events(self, timeout: float) -> List[Tuple[int, int]]:
        """The epoll set's events within ``timeout`` s; when the spin gate allows,
        polling without sleeping for the spin first (:mod:`fiberrl._wire.spin`)."""
        poll = self._epoll.poll
        if timeout <= 0 or not self._spin_gate.should_spin(self._spin):
            return poll(timeout)
        started = time.perf_counter()
        found: List[Tuple[int, int]] = []

        def arrived() -> bool:
            found.extend(poll(0))
            return bool(found)

        caught = spin_for(arrived, min(self._spin, timeout))
        self._spin_gate.record(caught)
        if caught:
            return found
        return poll(max(0.0, timeout - (time.perf_counter() - started)))

    def drain(self, into: Deque[Message]) -> None:
        """Take everything that already arrived, without waiting."""
        for _ in range(10_000):
            before = len(into)
            ended = self.receive(into, 0)
            if len(into) == before and not ended & STREAM_DROPPED:
                return

    def stop_receiving(self, into: Deque[Message], flush_tcp: bool = True) -> None:
        """Stop receiving here and append everything sent here so far to ``into``, in
        order: from now on a stream set-up is refused, a local sender's delivery fails
        and a stream takes no more (each sender then asks the rendezvous, which keeps
        what it sends for the end's next copy), so nothing sent here is lost.

        On a Unix socket the cut is exact: a sender's write fails once this side shut
        reading. Over TCP a sender learns of it only when the shutdown reaches it, so
        with ``flush_tcp`` (a copy that moves: what it hands back is read by the next
        one) the stream is read until the sender closes it, for at most
        :data:`TCP_FLUSH_SECONDS`.
        """
        with self._lock:
            self.closed = True
            self._lone = (None, None)
            readers = list(self._readers.items())
        items, self._held = self._take_local() + self._held, []
        deadline = time.monotonic() + (TCP_FLUSH_SECONDS if flush_tcp else 0.0)
        for fd, reader in readers:
            unix = reader.sock.family == socket.AF_UNIX
            try:
                reader.sock.shutdown(socket.SHUT_RD if unix else socket.SHUT_WR)
            except OSError:
                pass
            items += self._read_to_end(fd, reader, deadline)
        items.sort(key=lambda item: item[0])   # stable: one sender's order is kept
        into.extend(message for _, message in items)

    def _read_to_end(self, fd: int, reader: FrameReader,
                     deadline: float) -> List[Tuple[int, Message]]:
        """``(send time, message)`` pairs of all one stream still brings, until it ends
        (at once on a Unix socket shut for reading) or ``deadline`` passes."""
        items: List[Tuple[int, Message]] = []
        while True:
            try:
                items += self._merge_times(fd, reader.read())
            except EOFError:
                return items
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([reader.sock], [], [], left)[0]:
                return items

    def _take_local(self) -> List[Tuple[int, Message]]:
        with self._lock:
            try:
                if self._wake_r >= 0:
                    os.read(self._wake_r, 4096)
            except BlockingIOError:
                pass
            taken = list(self._local)
            self._local.clear()
            return taken

    def _drop(self, fd: int) -> None:
        with self._lock:
            reader = self._readers.pop(fd, None)
            self._merged_at.pop(fd, None)
            self._find_lone()
            try:
                self._epoll.unregister(fd)
            except OSError:
                pass
        if reader is not None:
            reader.sock.close()

    def close(self) -> None:
        """Close every stream and the wake-up pipe (the receiving thread); once."""
        with self._lock:
            if self._wake_r < 0:
                return   # closed before: its descriptor numbers may be another's now
            self.closed = True
            readers, self._readers = list(self._readers.values()), {}
            self._lone = (None, None)
            self._merged_at.clear()
            self._local.clear()
            self._held = []
        self.unwatch()
        for reader in readers:
            reader.sock.close()
        self._epoll.close()
        wake_r, wake_w, self._wake_r, self._wake_w = self._wake_r, self._wake_w, -1, -1
        os.close(wake_r)
        os.close(wake_w)


class PipeEnds:
    """The pipe ends active in this process, reached over the runtime's "pipe" route."""

    def __init__(self, rt: Runtime) -> None:
        self.address: Address = rt.address
        self._inboxes: Dict[Tuple[str, int], Inbox] = {}
        self._lock = threading.Lock()
        rt.acceptor.route("pipe", self._take)

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

    def _take(self, label: str, sock: socket.socket, send_key: bytes, recv_key: bytes,
              leftover: bytes) -> bool:
        _, pipe_id, end = (label.split(":") + ["", ""])[:3]
        inbox = self.inbox(pipe_id, int(end)) if end.isdigit() else None
        return inbox is not None and inbox.attach(sock, recv_key, leftover)


def pipe_ends() -> PipeEnds:
    """This process's active pipe ends (the runtime starts if needed)."""
    return service("pipe-ends", PipeEnds)


def existing_pipe_ends() -> Optional[PipeEnds]:
    """This process's active pipe ends if any were made (starts nothing)."""
    return existing_service("pipe-ends")
