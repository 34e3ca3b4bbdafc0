"""The owner's side of a queue: its :class:`Broker`, inside the "queue" service.

Data flow::

    put (this process: under the lock) ----------------+
    put / put_many (request from elsewhere) ----------+--> Broker.items --> get
                                                              |
    a remote get's item stays *in flight* until acknowledged -+ (requeued if its
                                                                 consumer job ended)

Every broker of a process lives in that process's runtime ("queue" service); each
method runs under the broker's lock, on the I/O loop or in a local caller. Blocked
gets are :class:`Waiter` s served first come, first served, local or remote.
"""
from __future__ import annotations

import collections
import itertools
import logging
import os
import queue as _queue
import threading
import time
import weakref
from typing import Any, Deque, Dict, List, Optional

from .._runtime.liveness import existing_job_watch, job_watch
from .._runtime.rpc import Request
from .._runtime.runtime import Runtime, existing_service, service
from .queue_feeder import unpack_batch

logger = logging.getLogger(__name__)

class Waiter:
    """A blocked ``get``: local (a thread here) or remote (a request)."""

    __slots__ = ("request", "token", "event", "item", "timer")

    def __init__(self, request: Optional[Request] = None, token: Optional[str] = None) -> None:
        self.request, self.token = request, token
        self.event = threading.Event() if request is None else None
        self.item: Optional[List[Any]] = None
        self.timer = None


class ReadyFlag:
    """A descriptor that is readable exactly while its queue holds items (what
    ``connection.wait`` polls for a queue's reader)."""

    def __init__(self) -> None:
        self._r, self._w = os.pipe()
        os.set_blocking(self._r, False)
        self._set = False

    def fileno(self) -> int:
        """The read end of the flag's pipe."""
        return self._r

    def update(self, ready: bool) -> None:
        """Raise or lower the flag (under the broker's lock)."""
        if ready and not self._set:
            os.write(self._w, b"\0")
        elif not ready and self._set:
            os.read(self._r, 16)
        self._set = ready

    def __del__(self) -> None:
        for fd in (getattr(self, "_r", None), getattr(self, "_w", None)):
            if fd is not None:
                try:
                    os.close(fd)
                except OSError:
                    pass


class _FinalizerPut:
    """Stands for a put made by a finalizer in the :attr:`Broker.putters` line (such a
    put waits for room there, as a remote one does, but nobody waits for its reply)."""

    answered = False

    def reply(self) -> None:
        """Nothing to tell."""


class Broker:
    """State of one queue; every method runs under ``self.lock``.

    The lock is re-entrant for one case, checked with :meth:`held_here`: the garbage
    collector runs finalizers on whichever thread allocates, so a finalizer that puts
    on this queue (torch's ``DataLoader`` iterator does) may run inside one of this
    broker's own critical sections, on the thread holding the lock.
    """

    def __init__(self, rt: Runtime, maxsize: int, joinable: bool) -> None:
        self.reactor = rt.reactor
        self.maxsize = maxsize
        self.joinable = joinable
        self.lock = threading.RLock()
        self.not_full = threading.Condition(self.lock)
        self.all_done = threading.Condition(self.lock)
        self.items: Deque[List[Any]] = collections.deque()
        self.getters: Deque[Waiter] = collections.deque()
        self.putters: Deque[tuple] = collections.deque()   # remote puts waiting for room
        self.local_putters = 0                               # threads here waiting for room
        self.joiners: List[Request] = []
        self.unfinished = 0
        self.inflight: Dict[int, tuple] = {}
        self.inflight_ids = itertools.count(1)
        self.ready: Optional[ReadyFlag] = None   # made when a reader is waited on

    def ready_flag(self) -> ReadyFlag:
        """The queue's :class:`ReadyFlag` (made on first use)."""
        with self.lock:
            if self.ready is None:
                self.ready = ReadyFlag()
                self.ready.update(bool(self.items))
            return self.ready

    def held_here(self) -> bool:
        """Whether this thread is inside one of this broker's critical sections."""
        return self.lock._is_owned()

    def add_later(self, frames: List[Any]) -> None:
        """Add an item once the critical section this thread is in has ended (a put
        from a finalizer run there: waiting for the lock would wait for itself). It
        never blocks; on a full queue it waits for room in line with remote puts."""
        def add() -> None:
            with self.lock:
                if self.full():
                    self.putters.append((_FinalizerPut(), frames))
                else:
                    self.add(frames)
        self.reactor.call_soon(add)

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
        if self.ready is not None:
            self.ready.update(True)

    def add_many(self, items: List[List[Any]]) -> None:
        """``add`` each of ``items`` in order (one producer's batch)."""
        if self.getters:
            for frames in items:
                self.add(frames)
            return
        if self.joinable:
            self.unfinished += len(items)
        self.items.extend(items)
        if self.ready is not None:
            self.ready.update(bool(self.items))

    def _deliver(self, waiter: Waiter, frames: List[Any]) -> bool:
        if waiter.request is None:
            if waiter.event.is_set():  # that local get already timed out
                return False
            waiter.item = frames
            waiter.event.set()
            return True
        if waiter.request.answered:
            return False
        if waiter.timer is not None:
            waiter.timer.cancel()
        self._reply_item(waiter.request, waiter.token, frames)
        return True

    def _reply_item(self, request: Request, token: Optional[str], frames: List[Any]) -> None:
        flight = next(self.inflight_ids)
        self.inflight[flight] = (token, frames, time.monotonic())
        request.reply(flight, body=frames)
        if token and _job_ended(token):  # it ended as we answered: nobody will ack
            self.requeue_from(token)

    def take(self) -> Optional[List[Any]]:
        """Pop the next item, letting a waiting remote put in."""
        if not self.items:
            return None
        frames = self.items.popleft()
        if self.ready is not None:
            self.ready.update(bool(self.items))
        if self.local_putters:
            self.not_full.notify()
        while self.putters and not self.full():
            request, body = self.putters.popleft()
            if not request.answered:
                self.add(body)
                request.reply()
        return frames

    def task_done(self) -> None:
        if self.unfinished <= 0:
            raise ValueError("task_done() called too many times")
        self.unfinished -= 1
        if self.unfinished == 0:
            self.all_done.notify_all()
            joiners, self.joiners = self.joiners, []
            for request in joiners:
                request.reply()

    def requeue_from(self, token: str) -> None:
        """Put back, in order, the items in flight to the job of ``token`` (it ended
        before acknowledging them)."""
        for flight, (owner, frames, _) in sorted(self.inflight.items(), reverse=True):
            if owner == token:
                del self.inflight[flight]
                logger.warning("consumer job ended with a queue item in flight; requeued it")
                self.add(frames, front=True)


def _job_ended(token: str) -> bool:
    jobs = existing_job_watch()
    return jobs is not None and jobs.ended(token)


class QueueService:
    """Service "queue": the brokers of every queue this process created."""

    def __init__(self, rt: Runtime) -> None:
        self.runtime = rt
        self.reactor = rt.reactor
        self.brokers: "weakref.WeakValueDictionary[str, Broker]" = weakref.WeakValueDictionary()
        self.jobs = job_watch()
        self.jobs.on_end(self._job_ended)
        rt.rpc.register("queue", self)

    def _job_ended(self, token: str) -> None:
        for broker in list(self.brokers.values()):
            with broker.lock:
                broker.requeue_from(token)

    def __call__(self, op: str, request: Request) -> None:
        broker = self.brokers.get(request.args[0])
        if broker is None:
            request.fail(OSError(f"queue {request.args[0]} no longer exists (it was garbage "
                                 f"collected in the process that created it)"))
            return
        getattr(self, "op_" + op)(broker, request)

    def op_put(self, broker: Broker, request: Request) -> None:
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
                    self.reactor.call_later(timeout, lambda: self._expire_put(broker, request))

    def op_put_many(self, broker: Broker, request: Request) -> None:
        items = unpack_batch(request.body, request.args[1], request.args[2])
        with broker.lock:
            broker.add_many(items)
        request.reply()

    def _expire_put(self, broker: Broker, request: Request) -> None:
        with broker.lock:
            request.fail(_queue.Full())

    def op_get(self, broker: Broker, request: Request) -> None:
        block, timeout, token = request.args[1], request.args[2], request.args[3]
        with broker.lock:
            frames = broker.take()
            if frames is not None:
                broker._reply_item(request, token, frames)
            elif not block:
                request.fail(_queue.Empty())
            else:
                waiter = Waiter(request, token)
                broker.getters.append(waiter)
                if timeout is not None:
                    waiter.timer = self.reactor.call_later(
                        timeout, lambda: self._expire_get(broker, request))

    def _expire_get(self, broker: Broker, request: Request) -> None:
        with broker.lock:
            request.fail(_queue.Empty())

    def op_ack(self, broker: Broker, request: Request) -> None:
        with broker.lock:
            broker.inflight.pop(request.args[1], None)

    def op_size(self, broker: Broker, request: Request) -> None:
        with broker.lock:
            request.reply(len(broker.items), broker.full())

    def op_task_done(self, broker: Broker, request: Request) -> None:
        with broker.lock:
            broker.task_done()
        request.reply()

    def op_join(self, broker: Broker, request: Request) -> None:
        with broker.lock:
            if broker.unfinished == 0:
                request.reply()
            else:
                broker.joiners.append(request)


def queue_service() -> QueueService:
    """This process's "queue" service (the runtime and the service start on first use)."""
    return service("queue", QueueService)


def owning_broker(qid: str, address: tuple) -> Optional[Broker]:
    """The broker itself when this process owns the queue, else None."""
    running = existing_service("queue")
    if running is None or running.runtime.address != tuple(address):
        return None
    return running.brokers.get(qid)
