"""``Queue``, ``JoinableQueue`` and ``SimpleQueue`` shared by processes on any machine.

Data flow::

    producer (any process) --put--> [broker of the queue, in the hub of the
                                      process that created it]  --get--> consumer
    items are kept as authenticated, still-pickled frames; only consumers unpickle.

The creating process owns the broker (a :class:`_Broker` inside its hub's "queue"
service). In that process, ``put`` and ``get`` touch the broker directly under a lock
(no sockets); elsewhere, ``put`` on an unbounded queue is one-way (``cast``) and
``get`` is one request/reply. Waiting ``get``s are served first come, first served,
whether local or remote; a blocked remote ``get`` is answered by the hub when an
item arrives or its timeout expires.

Delivery: an item goes to exactly one ``get``. An item sent to a remote consumer is
kept as *in flight* until the consumer acknowledges it; if that consumer is a job
started by the owning process and it dies first, the item goes back to the front of
the queue. ``qsize``/``empty``/``full`` are, as in the stdlib, approximate when other
processes put and get at the same time.
"""
from __future__ import annotations

import collections
import itertools
import logging
import os
import queue as _queue
import secrets
import threading
import time
import weakref
from typing import Any, Deque, Dict, List, Optional

from . import reduction, transport
from .hub import Hub, Request, existing_service, service

logger = logging.getLogger(__name__)

_INFLIGHT_CHECK = 0.5
#: A feeder batch ends at this many items or bytes; the rest goes in the next batch,
#: so the owner starts handing items out while later ones are still on their way.
_BATCH_ITEMS = 8192
_BATCH_BYTES = 4 << 20


class _Waiter:
    """A blocked ``get``: local (a thread here) or remote (a hub request)."""

    __slots__ = ("request", "token", "event", "item", "timer")

    def __init__(self, request: Optional[Request] = None, token: Optional[str] = None) -> None:
        self.request, self.token = request, token
        self.event = threading.Event() if request is None else None
        self.item: Optional[List[Any]] = None
        self.timer = None


class _Broker:
    """State of one queue; every method runs under ``self.lock``."""

    def __init__(self, hub: Hub, maxsize: int, joinable: bool) -> None:
        self.hub = hub
        self.maxsize = maxsize
        self.joinable = joinable
        self.lock = threading.Lock()
        self.not_full = threading.Condition(self.lock)
        self.all_done = threading.Condition(self.lock)
        self.items: Deque[List[Any]] = collections.deque()
        self.getters: Deque[_Waiter] = collections.deque()
        self.putters: Deque[tuple] = collections.deque()   # remote puts waiting for room
        self.local_putters = 0                               # threads here waiting for room
        self.joiners: List[Request] = []
        self.unfinished = 0
        self.inflight: Dict[int, tuple] = {}
        self.inflight_ids = itertools.count(1)
        self.checking_inflight = False

    # -- called with the lock held -------------------------------------------------
    def full(self) -> bool:
        return 0 < self.maxsize <= len(self.items)

    def wait_for_room(self, timeout: Optional[float]) -> None:
        """Wait (in a local ``put``) until not full; raise ``queue.Full`` at timeout."""
        deadline = None if timeout is None else time.monotonic() + timeout
        self.local_putters += 1
        try:
            while self.full():
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    raise _queue.Full
                self.not_full.wait(remaining)
        finally:
            self.local_putters -= 1

    def add(self, frames: List[Any], front: bool = False) -> None:
        """Store an item or hand it to the first waiting getter."""
        if not front and self.joinable:
            self.unfinished += 1
        while self.getters:
            waiter = self.getters.popleft()
            if self._deliver(waiter, frames):
                return
        if front:
            self.items.appendleft(frames)
        else:
            self.items.append(frames)

    def add_many(self, items: List[List[Any]]) -> None:
        """``add`` each of ``items`` in order (one producer's batch)."""
        if self.getters:
            for frames in items:
                self.add(frames)
            return
        if self.joinable:
            self.unfinished += len(items)
        self.items.extend(items)

    def _deliver(self, waiter: _Waiter, frames: List[Any]) -> bool:
        if waiter.request is None:
            if waiter.event.is_set():  # that local get already timed out
                return False
            waiter.item = frames
            waiter.event.set()
            return True
        if waiter.request.answered:
            return False
        if waiter.timer is not None:
            waiter.timer[2] = None
        self._reply_item(waiter.request, waiter.token, frames)
        return True

    def _reply_item(self, request: Request, token: Optional[str], frames: List[Any]) -> None:
        flight = next(self.inflight_ids)
        self.inflight[flight] = (token, frames, time.monotonic())
        self._on_hub(lambda: request.reply(flight, body=frames))
        self._watch_inflight()

    def _on_hub(self, fn) -> None:
        if threading.current_thread() is self.hub.thread:
            fn()
        else:
            self.hub.call_soon(fn)

    def take(self) -> Optional[List[Any]]:
        """Pop the next item, letting a waiting remote put in."""
        if not self.items:
            return None
        frames = self.items.popleft()
        if self.local_putters:
            self.not_full.notify()
        while self.putters and not self.full():
            request, body = self.putters.popleft()
            if not request.answered:
                self.add(body)
                self._on_hub(request.reply)
        return frames

    def task_done(self) -> None:
        if self.unfinished <= 0:
            raise ValueError("task_done() called too many times")
        self.unfinished -= 1
        if self.unfinished == 0:
            self.all_done.notify_all()
            joiners, self.joiners = self.joiners, []
            for request in joiners:
                self._on_hub(request.reply)

    def _watch_inflight(self) -> None:
        if not self.checking_inflight:
            self.checking_inflight = True
            self._on_hub(lambda: self.hub.call_later(_INFLIGHT_CHECK, self._check_inflight))

    def _check_inflight(self) -> None:
        """Requeue items in flight to consumer jobs that died (hub thread)."""
        from .popen import dead_job_tokens
        with self.lock:
            dead = dead_job_tokens({token for token, _, _ in self.inflight.values() if token})
            for flight, (token, frames, _) in sorted(self.inflight.items(), reverse=True):
                if token in dead:
                    del self.inflight[flight]
                    logger.warning("consumer job died with a queue item in flight; requeued it")
                    self.add(frames, front=True)
            if self.inflight:
                self.hub.call_later(_INFLIGHT_CHECK, self._check_inflight)
            else:
                self.checking_inflight = False


class _QueueService:
    """Hub service "queue": the brokers of every queue this process created."""

    def __init__(self, hub: Hub) -> None:
        self.hub = hub
        self.brokers: "weakref.WeakValueDictionary[str, _Broker]" = weakref.WeakValueDictionary()
        hub.register("queue", self)

    def __call__(self, op: str, request: Request) -> None:
        broker = self.brokers.get(request.args[0])
        if broker is None:
            request.fail(OSError(f"queue {request.args[0]} no longer exists (it was garbage "
                                 f"collected in the process that created it)"))
            return
        getattr(self, "op_" + op)(broker, request)

    def op_put(self, broker: _Broker, request: Request) -> None:
        block, timeout = request.args[1], request.args[2]
        body = list(request.body)  # views of received frames: writable, no copy
        with broker.lock:
            if not broker.full():
                broker.add(body)
                request.reply()
            elif not block:
                request.fail(_queue.Full())
            else:
                broker.putters.append((request, body))
                if timeout is not None:
                    self.hub.call_later(timeout, lambda: self._expire_put(broker, request))

    def op_put_many(self, broker: _Broker, request: Request) -> None:
        items = _unpack_batch(request.body, request.args[1], request.args[2])
        with broker.lock:
            broker.add_many(items)
        request.reply()

    def _expire_put(self, broker: _Broker, request: Request) -> None:
        with broker.lock:
            request.fail(_queue.Full())

    def op_get(self, broker: _Broker, request: Request) -> None:
        block, timeout, token = request.args[1], request.args[2], request.args[3]
        with broker.lock:
            frames = broker.take()
            if frames is not None:
                broker._reply_item(request, token, frames)
            elif not block:
                request.fail(_queue.Empty())
            else:
                waiter = _Waiter(request, token)
                broker.getters.append(waiter)
                if timeout is not None:
                    waiter.timer = self.hub.call_later(
                        timeout, lambda: self._expire_get(broker, request))

    def _expire_get(self, broker: _Broker, request: Request) -> None:
        with broker.lock:
            request.fail(_queue.Empty())

    def op_ack(self, broker: _Broker, request: Request) -> None:
        with broker.lock:
            broker.inflight.pop(request.args[1], None)

    def op_size(self, broker: _Broker, request: Request) -> None:
        with broker.lock:
            request.reply(len(broker.items), broker.full())

    def op_task_done(self, broker: _Broker, request: Request) -> None:
        with broker.lock:
            broker.task_done()
        request.reply()

    def op_join(self, broker: _Broker, request: Request) -> None:
        with broker.lock:
            if broker.unfinished == 0:
                request.reply()
            else:
                broker.joiners.append(request)


def _queue_service() -> _QueueService:
    return service("queue", _QueueService)


def _owning_broker(qid: str, hub_address: str) -> Optional[_Broker]:
    """The broker itself when this process owns the queue, else None."""
    queue_service = existing_service("queue")
    if queue_service is None or queue_service.hub.address != hub_address:
        return None
    return queue_service.brokers.get(qid)


def _pack_batch(batch: List[List[Any]]) -> tuple:
    """Items' frames -> ``(sizes, buffer_counts, body)`` of one ``put_many`` message:
    the pickle streams joined in the first frame, the one the transport signs in full,
    then the out-of-band buffers as frames of their own, uncopied."""
    sizes = [len(frames[0]) for frames in batch]
    body: List[Any] = [b"".join([frames[0] for frames in batch])]
    counts: Optional[List[int]] = None
    if any(len(frames) > 1 for frames in batch):
        counts = [len(frames) - 1 for frames in batch]
        body.extend(buf for frames in batch for buf in frames[1:])
    return sizes, counts, body


def _unpack_batch(body: List[Any], sizes: List[int], counts: Optional[List[int]]) -> List[List[Any]]:
    """The inverse of :func:`_pack_batch`: each item's frames (views, no copy)."""
    stream, starts = memoryview(body[0]), itertools.accumulate(sizes, initial=0)
    if counts is None:  # no out-of-band buffers (the common case)
        return [[stream[start:start + size]] for start, size in zip(starts, sizes)]
    buffers = iter(body[1:])
    return [[stream[start:start + size], *itertools.islice(buffers, count)]
            for start, size, count in zip(starts, sizes, counts)]


class _Feeder:
    """Background thread that sends a remote process's puts in batches.

    ``put`` appends the pickled item (no lock; it wakes the thread only if it sleeps).
    The thread sends what piled up, up to ``_BATCH_ITEMS``/``_BATCH_BYTES``, in one
    message and waits for the broker's acknowledgement, so batches grow with load and
    this process's other operations (``get``, ``qsize``...) can wait for earlier puts.
    """

    def __init__(self, client: transport.HubClient, qid: str) -> None:
        self.client, self.qid, self.pid = client, qid, os.getpid()
        self.cancelled = False
        self._pending: Deque[List[Any]] = collections.deque()
        self._wake = threading.Event()
        self._sleeping = False
        self._busy = False
        self._done = threading.Condition()  # notified after each batch
        self._error: Optional[BaseException] = None
        self._thread = threading.Thread(target=self._run, name="fiberrl-queue-feeder", daemon=True)
        self._thread.start()

    def put(self, frames: List[Any]) -> None:
        """Queue one item's frames for sending (buffers are copied now)."""
        if self._error is not None:
            raise self._error
        if len(frames) > 1:  # the item must not change after put()
            frames = [frames[0], *[bytes(f) for f in frames[1:]]]
        self._pending.append(frames)
        if self._sleeping:
            self._wake.set()

    def flush(self, timeout: Optional[float] = None) -> bool:
        """Wait until every put so far was acknowledged by the broker."""
        with self._done:
            done = self._done.wait_for(lambda: not self._pending and not self._busy
                                       or self._error is not None, timeout)
            if self._error is not None:
                raise self._error
            return done

    def _wait_for_items(self) -> None:
        # _sleeping is set before the last look at _pending, and put() appends
        # before it reads _sleeping: one of the two sees the other.
        while not self._pending:
            self._wake.clear()
            self._sleeping = True
            if not self._pending:
                self._wake.wait()
            self._sleeping = False

    def _take_batch(self) -> List[List[Any]]:
        pending, batch, size = self._pending, [], 0
        while pending and len(batch) < _BATCH_ITEMS and size < _BATCH_BYTES:
            frames = pending.popleft()
            batch.append(frames)
            size += len(frames[0]) if len(frames) == 1 else sum(map(len, frames))
        return batch

    def _run(self) -> None:
        while True:
            self._wait_for_items()
            self._busy = True  # before items leave _pending: flush() must not miss them
            batch = self._take_batch()
            sizes, counts, body = _pack_batch(batch)
            try:
                self.client.call("queue", "put_many", self.qid, sizes, counts, body=body)
            except BaseException as exc:  # the owner is gone: report it on the next call
                logger.error("could not deliver %d queued item(s): %s", len(batch), exc)
                with self._done:
                    self._error, self._busy = exc, False
                    self._done.notify_all()
                return
            with self._done:
                self._busy = False
                self._done.notify_all()


_feeders: "weakref.WeakSet[_Feeder]" = weakref.WeakSet()


def flush_all(timeout: float = 30.0) -> None:
    """At job exit: wait for every feeder of this process (unless cancelled)."""
    for feeder in list(_feeders):
        if feeder.pid == os.getpid() and not feeder.cancelled:
            try:
                feeder.flush(timeout)
            except BaseException as exc:
                logger.warning("queue items lost at exit: %s", exc)


class Queue:
    """A FIFO queue usable from every process of a run (``multiprocessing.Queue`` API)."""

    _joinable = False

    def __init__(self, maxsize: int = 0, *, ctx: Any = None) -> None:
        if not isinstance(maxsize, int):
            raise TypeError(f"maxsize must be an int, got {type(maxsize).__name__}")
        if maxsize <= 0:
            maxsize = 0
        service = _queue_service()
        self._qid = secrets.token_hex(8)
        self._broker_ref = _Broker(service.hub, maxsize, self._joinable)
        service.brokers[self._qid] = self._broker_ref
        self._hub_address = service.hub.address
        self._maxsize = maxsize
        self._setup()

    def _setup(self) -> None:
        self._closed = False
        self._cancelled = False
        self._pid: Optional[int] = None  # the process _owner and _client were found for
        self._owner: Optional[_Broker] = None
        self._client: Optional[transport.HubClient] = None
        self._feeder_obj: Optional[_Feeder] = None
        self._feeder_lock = threading.Lock()
        self._broker()

    def _broker(self) -> Optional[_Broker]:
        """The broker when this process owns the queue, else None (then ``_client`` is set)."""
        pid = os.getpid()
        if self._pid != pid:  # first use in this process
            broker = getattr(self, "_broker_ref", None)
            if broker is None or broker.hub.pid != pid:
                broker = _owning_broker(self._qid, self._hub_address)
            self._owner = broker
            self._client = None if broker else transport.client_for(self._hub_address)
            self._pid = pid
        return self._owner

    def _feeder(self) -> "_Feeder":
        feeder = self._feeder_obj
        if feeder is not None and feeder.pid == self._pid:
            return feeder
        with self._feeder_lock:
            if self._feeder_obj is None or self._feeder_obj.pid != os.getpid():
                self._feeder_obj = _Feeder(self._client, self._qid)
                _feeders.add(self._feeder_obj)
            return self._feeder_obj

    def _flush(self) -> None:
        """Wait until this process's earlier puts reached the broker (keeps order)."""
        feeder = self._feeder_obj
        if feeder is not None and feeder.pid == os.getpid():
            feeder.flush()

    def __getstate__(self) -> dict:
        return {"_qid": self._qid, "_hub_address": self._hub_address, "_maxsize": self._maxsize}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._broker_ref = _owning_broker(self._qid, self._hub_address)
        self._setup()

    def __repr__(self) -> str:
        return f"<fiberrl.{type(self).__name__} {self._qid} at {self._hub_address}>"

    def _check_closed(self) -> None:
        if self._closed:
            raise ValueError(f"Queue {self!r} is closed")

    # -- put -------------------------------------------------------------------------
    def put(self, obj: Any, block: bool = True, timeout: Optional[float] = None) -> None:
        """Put ``obj`` on the queue; raise ``queue.Full`` if no room came in time."""
        self._check_closed()
        try:
            frames = reduction.dumps(obj)
        except Exception as exc:
            self._on_queue_feeder_error(exc, obj)
            return
        broker = self._broker()
        if broker is not None:
            self._put_local(broker, frames, block, timeout)
        elif self._maxsize == 0:
            self._feeder().put(frames)
        else:
            wait = None if timeout is None else timeout + 5.0
            self._client.call("queue", "put", self._qid, block, timeout, body=frames,
                              timeout=wait if block else 5.0)

    @staticmethod
    def _put_local(broker: _Broker, frames: List[Any], block: bool, timeout: Optional[float]) -> None:
        if len(frames) > 1:  # copy views of the caller's buffers: the item must not change
            frames = [frames[0], *[bytearray(f) for f in frames[1:]]]
        with broker.lock:
            if broker.full():
                if not block:
                    raise _queue.Full
                broker.wait_for_room(timeout)
            broker.add(frames)

    def put_nowait(self, obj: Any) -> None:
        """``put(obj, False)``."""
        self.put(obj, False)

    @staticmethod
    def _on_queue_feeder_error(exc: BaseException, obj: Any) -> None:
        """Called when ``obj`` cannot be pickled; like the stdlib, report and drop it."""
        logger.error("%s", reduction.describe_unpicklable(obj, exc))

    # -- get -------------------------------------------------------------------------
    def get(self, block: bool = True, timeout: Optional[float] = None) -> Any:
        """Remove and return an item; raise ``queue.Empty`` if none came in time."""
        self._check_closed()
        if timeout is not None and timeout < 0:
            raise ValueError("'timeout' must be a non-negative number")
        broker = self._broker()
        if broker is not None:
            return reduction.loads(self._get_local(broker, block, timeout))
        from .jobenv import current_job_token
        self._flush()
        wait = None if (timeout is None or not block) else timeout + 10.0
        (flight,), body = self._client.call("queue", "get", self._qid, block, timeout,
                                            current_job_token(), timeout=wait if block else 10.0)
        self._client.cast("queue", "ack", self._qid, flight)
        return reduction.loads(body)

    @staticmethod
    def _get_local(broker: _Broker, block: bool, timeout: Optional[float]) -> List[Any]:
        with broker.lock:
            frames = broker.take()
            if frames is not None:
                return frames
            if not block:
                raise _queue.Empty
            waiter = _Waiter()
            broker.getters.append(waiter)
        if not waiter.event.wait(timeout):
            with broker.lock:
                if waiter.item is None:
                    waiter.event.set()  # tells add() this waiter is gone
                    raise _queue.Empty
        return waiter.item

    def get_nowait(self) -> Any:
        """``get(False)``."""
        return self.get(False)

    # -- size ------------------------------------------------------------------------
    def _size(self) -> tuple:
        broker = self._broker()
        if broker is not None:
            with broker.lock:
                return len(broker.items), broker.full()
        self._flush()
        values, _ = self._client.call("queue", "size", self._qid, timeout=30.0)
        return tuple(values)

    def qsize(self) -> int:
        """Approximate number of items in the queue."""
        return self._size()[0]

    def empty(self) -> bool:
        """Whether the queue is (approximately) empty."""
        return self._size()[0] == 0

    def full(self) -> bool:
        """Whether the queue is (approximately) full."""
        return self._size()[1]

    # -- life cycle ------------------------------------------------------------------
    def close(self) -> None:
        """This process will use the queue no more (``put``/``get`` then raise ValueError)."""
        self._closed = True

    def join_thread(self) -> None:
        """Wait until this process's puts have reached the queue (call after :meth:`close`)."""
        if not self._closed:
            raise ValueError("join_thread() requires the queue to be closed first")
        self._flush()

    def cancel_join_thread(self) -> None:
        """Do not wait for unsent puts when this process exits (they may be lost)."""
        self._cancelled = True
        if self._feeder_obj is not None:
            self._feeder_obj.cancelled = True


class JoinableQueue(Queue):
    """A :class:`Queue` with ``task_done()`` and ``join()``."""

    _joinable = True

    def task_done(self) -> None:
        """Mark one item taken with ``get`` as processed."""
        self._check_closed()
        broker = self._broker()
        if broker is not None:
            with broker.lock:
                broker.task_done()
        else:
            self._flush()
            self._client.call("queue", "task_done", self._qid, timeout=30.0)

    def join(self) -> None:
        """Block until every item put on the queue has been marked done."""
        broker = self._broker()
        if broker is not None:
            with broker.lock:
                while broker.unfinished:
                    broker.all_done.wait(1.0)
        else:
            self._flush()
            self._client.call("queue", "join", self._qid)


class SimpleQueue(Queue):
    """An unbounded queue with just ``put``, ``get``, ``empty`` and ``close``."""

    def __init__(self, *, ctx: Any = None) -> None:
        super().__init__(0)

    def get(self) -> Any:  # type: ignore[override]
        """Remove and return an item, waiting for one."""
        return super().get(True, None)
