"""``Queue``, ``JoinableQueue`` and ``SimpleQueue`` shared by processes on any machine.

Data flow::

    producer (any process) --put--> [broker of the queue, in the runtime of the
                                      process that created it]  --get--> consumer
    items are kept as authenticated, still-pickled frames; only consumers unpickle.

The creating process owns the broker (a :class:`~fiberrl._services.queue_broker.Broker` inside
its runtime's "queue" service); other processes' puts go through a
:class:`~fiberrl._services.queue_feeder.Feeder` thread. In that process, ``put`` and ``get``
touch the broker directly under a lock
(no sockets); elsewhere, ``put`` on an unbounded queue is one-way (``cast``) and
``get`` is one request/reply. Waiting ``get``s are served first come, first served,
whether local or remote; a blocked remote ``get`` is answered by the owner when an
item arrives or its timeout expires.

Delivery: an item goes to exactly one ``get``. An item sent to a remote consumer is
kept as *in flight* until the consumer acknowledges it; if that consumer is a job
started by the owning process and it ends first, the item goes back to the front of
the queue (the owner hears of the end from its job watch). When the owner itself is
gone, calls raise :class:`~fiberrl.errors.OwnerGoneError`. ``qsize``/``empty``/``full`` are, as in the stdlib, approximate when other
processes put and get at the same time.
"""
from __future__ import annotations

import logging
import os
import queue as _queue
from queue import Empty, Full  # noqa: F401 (where the stdlib's module has them too)
import secrets
import threading
from typing import Any, List, Optional

from . import reduction
from ._runtime import jobenv
from ._runtime.rpc import RpcClient, client_for
from ._services.queue_broker import Broker, Waiter, owning_broker, queue_service
from ._services.queue_feeder import Feeder, feeders
from ._wire.sockets import wait_for

__all__ = ["Queue", "JoinableQueue", "SimpleQueue"]

#: the stdlib module's end-of-feed marker, importable here for code built on that module
#: (loky imports it); fiberrl's feeder does not use it
_sentinel = object()

logger = logging.getLogger(__name__)



def _no_less_than_zero(timeout: Optional[float]) -> Optional[float]:
    """A negative timeout waits no time, as with the stdlib's multiprocessing queues
    (their semaphore's ``acquire`` treats it as 0: ``Empty``/``Full`` at once)."""
    return 0.0 if timeout is not None and timeout < 0 else timeout

class Queue:
    """A FIFO queue usable from every process of a run (``multiprocessing.Queue`` API)."""

    _joinable = False
    #: the stdlib's Queue pickles in its feeder thread (an unpicklable item is reported
    #: and dropped); its SimpleQueue pickles in ``put``, which raises
    _raise_pickling_errors = False

    def __init__(self, maxsize: int = 0, *, ctx: Any = None) -> None:
        if not isinstance(maxsize, int):
            raise TypeError(f"maxsize must be an int, got {type(maxsize).__name__}")
        if maxsize <= 0:
            maxsize = 0
        service = queue_service()
        self._qid = secrets.token_hex(8)
        self._broker_ref = Broker(service.runtime, maxsize, self._joinable)
        service.brokers[self._qid] = self._broker_ref
        self._address = service.runtime.address
        self._maxsize = maxsize
        self._setup()

    def _setup(self) -> None:
        self._closed = False
        self._cancelled = False
        self._pid: Optional[int] = None  # the process _owner and _client were found for
        self._owner: Optional[Broker] = None
        self._client: Optional[RpcClient] = None
        self._feeder_obj: Optional[Feeder] = None
        self._feeder_lock = threading.Lock()
        self._broker()

    def _broker(self) -> Optional[Broker]:
        """The broker when this process owns the queue, else None (then ``_client`` is set)."""
        pid = jobenv.pid
        if self._pid != pid:  # first use in this process
            broker = getattr(self, "_broker_ref", None)
            if broker is None or broker.reactor.pid != pid:
                broker = owning_broker(self._qid, self._address)
            self._owner = broker
            self._client = None if broker else client_for(self._address)
            self._pid = pid
        return self._owner

    def _feeder(self) -> "Feeder":
        feeder = self._feeder_obj
        if feeder is not None and feeder.pid == self._pid:
            return feeder
        with self._feeder_lock:
            if self._feeder_obj is None or self._feeder_obj.pid != os.getpid():
                self._feeder_obj = Feeder(self._client, self._qid)
                feeders.add(self._feeder_obj)
            return self._feeder_obj

    def _flush(self) -> None:
        """Wait until this process's earlier puts reached the broker (keeps order)."""
        feeder = self._feeder_obj
        if feeder is not None and feeder.pid == os.getpid():
            feeder.flush()

    def __getstate__(self) -> dict:
        return {"_qid": self._qid, "_address": self._address, "_maxsize": self._maxsize}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._broker_ref = owning_broker(self._qid, self._address)
        self._setup()

    def __repr__(self) -> str:
        return f"<fiberrl.{type(self).__name__} {self._qid} at {self._address}>"

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
            if self._raise_pickling_errors:
                raise
            self._on_queue_feeder_error(exc, obj)
            return
        feeder = self._feeder_obj
        if (feeder is not None and feeder.pid == jobenv.pid and self._pid == feeder.pid
                and self._maxsize == 0):
            feeder.put(frames)   # the usual case in a producer: this process's feeder
            return
        timeout = _no_less_than_zero(timeout)
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
    def _put_local(broker: Broker, frames: List[Any], block: bool, timeout: Optional[float]) -> None:
        if len(frames) > 1:  # copy views of the caller's buffers: the item must not change
            frames = [frames[0], *[bytearray(f) for f in frames[1:]]]
        if broker.held_here():   # a finalizer, run by the collector inside a critical section
            broker.add_later(frames)
            return
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
        owner = self._owner
        if owner is not None and self._pid == jobenv.pid and not self._closed:
            with owner.lock:   # the usual case in the owner: an item is waiting
                frames = owner.take()
            if frames is not None:
                return reduction.loads(frames)
        self._check_closed()
        timeout = _no_less_than_zero(timeout)
        broker = self._broker()
        if broker is not None:
            return reduction.loads(self._get_local(broker, block, timeout))
        from ._runtime.jobenv import current_job_token
        self._flush()
        wait = None if (timeout is None or not block) else timeout + 10.0
        (flight,), body = self._client.call("queue", "get", self._qid, block, timeout,
                                            current_job_token(), timeout=wait if block else 10.0)
        self._client.cast("queue", "ack", self._qid, flight)
        return reduction.loads(body)

    @staticmethod
    def _get_local(broker: Broker, block: bool, timeout: Optional[float]) -> List[Any]:
        with broker.lock:
            frames = broker.take()
            if frames is not None:
                return frames
            if not block:
                raise _queue.Empty
            waiter = Waiter()
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


    @property
    def _reader(self) -> "QueueReader":
        """The stdlib queues' read end, which ``concurrent.futures`` waits on with
        ``connection.wait`` and reads with ``recv()``: here, in the creating process."""
        return QueueReader(self)

    @property
    def _writer(self) -> "QueueWriter":
        """The stdlib queues' write end: ``send(obj)`` puts, ``closed`` after ``close()``."""
        return QueueWriter(self)


class QueueReader:
    """A queue's readable side as a connection: ``fileno()`` is readable exactly while
    the queue holds items (in the process that created it; elsewhere ``OSError``)."""

    def __init__(self, queue: Queue) -> None:
        self._queue = queue

    def fileno(self) -> int:
        """A descriptor readable while an item is waiting."""
        broker = self._queue._broker()
        if broker is None:
            raise OSError(f"{self._queue!r} can be waited on only in the process that "
                          "created it")
        return broker.ready_flag().fileno()

    def poll(self, timeout: Optional[float] = 0.0) -> bool:
        """Whether an item is waiting, within ``timeout`` seconds (None: no limit)."""
        return wait_for(self.fileno(), timeout=timeout)

    def recv(self) -> Any:
        """Remove and return the next item, waiting for one."""
        return self._queue.get()

    def close(self) -> None:
        """Close the queue."""
        self._queue.close()

    @property
    def closed(self) -> bool:
        """True once the queue was closed in this process."""
        return self._queue._closed

    def __eq__(self, other: object) -> bool:   # a fresh reader each time: same queue, equal
        return isinstance(other, QueueReader) and other._queue is self._queue

    def __hash__(self) -> int:
        return hash(id(self._queue))


class QueueWriter:
    """A queue's writable side as a connection end: ``send(obj)`` puts ``obj``."""

    def __init__(self, queue: Queue) -> None:
        self._queue = queue

    def send(self, obj: Any) -> None:
        """Put ``obj`` on the queue."""
        self._queue.put(obj)

    def close(self) -> None:
        """Close the queue."""
        self._queue.close()

    @property
    def closed(self) -> bool:
        """True once the queue was closed in this process."""
        return self._queue._closed

    def __eq__(self, other: object) -> bool:   # a fresh writer each time: same queue, equal
        return isinstance(other, QueueWriter) and other._queue is self._queue

    def __hash__(self) -> int:
        return hash(id(self._queue))


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

    _raise_pickling_errors = True

    def __init__(self, *, ctx: Any = None) -> None:
        super().__init__(0)

    def get(self) -> Any:  # type: ignore[override]
        """Remove and return an item, waiting for one."""
        return super().get(True, None)

    def get_nowait(self) -> Any:
        """An item if one is there, else ``queue.Empty`` (as ``queue.SimpleQueue``'s;
        the stdlib's multiprocessing SimpleQueue has no such method)."""
        return super().get(False)

    @property
    def reader(self) -> QueueReader:
        """The read end, ``recv()`` being ``get()`` (Uber Fiber's name for it)."""
        return self._reader

    @property
    def writer(self) -> QueueWriter:
        """The write end, ``send(obj)`` being ``put(obj)`` (Uber Fiber's name for it)."""
        return self._writer


def __getattr__(name: str) -> Any:
    """``Pipe``, found here as in Uber Fiber's ``fiber.queues`` (it is
    :func:`fiberrl.connection.Pipe`, imported on first use)."""
    if name == "Pipe":
        from .connection import Pipe
        return Pipe
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
