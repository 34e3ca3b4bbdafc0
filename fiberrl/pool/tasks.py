"""Tasks, the functions they call, and the result objects callers wait on.

A *call* (one ``apply_async``, ``map_async`` or ``imap``) is a result object plus
the tasks it was cut into: one task per chunk of ``chunksize`` items. Each task is
pickled once, in the caller's thread, when it is submitted: the caller gets pickling
errors at once, a task can be re-sent after its worker died, and the pool's I/O
thread never pickles user objects. Large buffers stay views of the caller's objects
the first time; one seen again becomes a shared entry, a snapshot sent once per
worker (:mod:`.shared`).

Result objects are filled on the process's I/O loop through ``_set``; callbacks run on
the pool's callback thread (:mod:`.callbacks`), one at a time, and a result with a
callback becomes ready once its callback ran, as in the stdlib.
"""
from __future__ import annotations

import abc
import collections
import functools
import itertools
import logging
import threading
import time
from typing import Any, Callable, Iterable, List, Optional, Tuple

from .. import reduction
from ..errors import JobFailedError, TimeoutError
from .progress import make_progress

logger = logging.getLogger(__name__)

#: What a task does with its pickled arguments in the worker.
APPLY, MAP, STARMAP = 0, 1, 2
#: Set by a worker on an exception a map task raised: the failing item's offset in the chunk.
ITEM_ATTRIBUTE = "_fiberrl_chunk_offset"

#: seconds between a waiting caller's wake-ups. Ctrl-C's SIGINT may be delivered to
#: any thread of this process; Python then raises KeyboardInterrupt in the main thread
#: only when that thread next runs Python code, so a main thread blocked on a lock
#: with no timeout would never see it (measured: a Ctrl-C while workers started
#: could hang ``pool.map`` for good).
_WAKE = 0.1


def _wait(event: threading.Event, timeout: Optional[float]) -> bool:
    """``event.wait(timeout)`` that a Ctrl-C interrupts within :data:`_WAKE` s."""
    deadline = None if timeout is None else time.monotonic() + max(timeout, 0.0)
    while True:
        left = _WAKE if deadline is None else min(_WAKE, deadline - time.monotonic())
        if event.wait(max(left, 0.0)):
            return True
        if deadline is not None and time.monotonic() >= deadline:
            return False


_task_ids = itertools.count(1)
_func_ids = itertools.count(1)


class Function:
    """A function pickled once per call (or once per pool for plain module functions)."""

    __slots__ = ("id", "frames", "name", "users", "cached", "item_seconds")

    def __init__(self, func: Callable[..., Any], cached: bool) -> None:
        self.id = next(_func_ids)
        self.frames = reduction.dumps(func)
        self.name = _function_name(func)
        self.users = 0
        self.cached = cached
        #: seconds one item took in the last call that finished (a new call's first
        #: estimate of its tasks' cost, so that it need not start one task at a time)
        self.item_seconds: Optional[float] = None


def _function_name(func: Callable[..., Any]) -> str:
    """A short name for errors: the qualified name, ``partial(f)`` for a partial."""
    if isinstance(func, functools.partial):
        return f"partial({_function_name(func.func)})"
    return getattr(func, "__qualname__", None) or repr(func)[:80]


class FunctionTable:
    """Pickled functions by id, with a cache keyed by the function object.

    A function is pickled the first time the pool sees it and re-used while it stays
    among the ``cache_size`` most recent: so a function from ``__main__`` (which
    travels by value) carries the globals it saw when first sent, as the stdlib's
    workers see the module as it was when they started. ``on_forget(entry)`` is
    called when workers may drop a function.
    """

    def __init__(self, on_forget: Callable[["Function"], None], cache_size: int = 64) -> None:
        self._lock = threading.Lock()
        self._cache: "collections.OrderedDict[int, tuple]" = collections.OrderedDict()
        self._cache_size = cache_size
        self._on_forget = on_forget

    def acquire(self, func: Callable[..., Any]) -> Function:
        """The :class:`Function` for ``func``; pair with :meth:`release`."""
        with self._lock:
            hit = self._cache.get(id(func))
            if hit is not None and hit[0] is func:
                self._cache.move_to_end(id(func))
                hit[1].users += 1
                return hit[1]
        entry = Function(func, cached=True)  # pickling errors reach the caller
        forgotten = []
        with self._lock:
            entry.users += 1
            self._cache[id(func)] = (func, entry)
            while len(self._cache) > self._cache_size:
                _, (_, old) = self._cache.popitem(last=False)
                old.cached = False
                if old.users == 0:
                    forgotten.append(old)
        for old in forgotten:
            self._on_forget(old)
        return entry

    def release(self, entry: Function) -> None:
        """Drop one use of ``entry``."""
        with self._lock:
            entry.users -= 1
            gone = entry.users <= 0 and not entry.cached
        if gone:
            self._on_forget(entry)


#: types that travel inside a message's header as themselves (see :class:`Task`)
SCALAR_TYPES = frozenset((bytes, str, int, float, bool, type(None), complex))
#: the longest chunk (or result list) sent that way: checking the type of each item in
#: Python costs more than the C pickler's stream for longer ones (measured: 64 ints,
#: 3.9 us to check, 2.3 us to pickle)
INLINE_MAX = 16


def all_scalars(items: Any) -> bool:
    """True if every item of the list or tuple ``items`` is of an exact scalar type."""
    scalar = SCALAR_TYPES
    for item in items:
        if type(item) not in scalar:
            return False
    return True


class Task:
    """One chunk of one call: its pickled arguments and where it has been.

    ``frames`` is ``(pickle stream, buffer or shared entry, ...)`` (see
    :mod:`.shared`), or, for a chunk of plain scalars (the common ``map`` over numbers
    or strings), ``(tuple of the items,)``: the tuple travels in the message's header;
    an ``apply`` whose arguments are a few scalars likewise sends ``((args, {}),)``.
    """

    __slots__ = ("id", "call", "index", "first", "mode", "frames", "size", "deaths", "suspect",
                 "worker", "rerun")

    def __init__(self, call: "Call", index: int, mode: int, payload: Any, size: int,
                 first: int = 0, memo: Optional[dict] = None,
                 scalars: Optional[tuple] = None) -> None:
        self.id = next(_task_ids)  # internal: the pending table's key, never shown to users
        self.call = call
        self.index = index
        self.first = first            # the input index of the chunk's first item
        self.mode = mode
        # (frames is a tuple, and deaths one until a death: a map's many tasks then add
        # one object per task for the garbage collector to walk, not three)
        if scalars is not None:       # the chunk, known to hold scalars only
            self.frames = (scalars,)
        elif type(payload) in _SLICED and len(payload) <= INLINE_MAX and all_scalars(payload):
            # travels as itself inside the message's header: no pickle of its own here,
            # no unpickling in the worker (and scalars cannot fail to pickle later)
            self.frames = (tuple(payload),)
        elif (mode == APPLY and not payload[1] and len(payload[0]) <= INLINE_MAX
              and all_scalars(payload[0])):
            self.frames = ((payload[0], {}),)   # an apply of a few scalars, likewise
        else:
            # large buffers that repeat become shared entries (see .shared); memo spans a call
            self.frames = call._core.buffers.share(reduction.dumps(payload), memo)
        self.size = size
        self.deaths: Tuple[str, ...] = ()   # how the workers that died running it ended
        self.suspect = False          # its worker died: run it alone next time
        self.worker: Optional[int] = None
        self.rerun: Any = None        # it raised, in a pool with error_handling (.rerun.Rerun)

    def wire_mode(self) -> Any:
        """The mode a worker is sent: ``(mode, offsets)`` when only the items at those
        offsets of the chunk are to run (the others succeeded in an earlier run)."""
        rerun = self.rerun
        if rerun is None or rerun.offsets is None:
            return self.mode
        return (self.mode, rerun.offsets)

    def describe(self, offset: Optional[int] = None) -> str:
        """What the task is, for errors: the call, and the input indices of its items
        (``offset``: the one item, within the chunk, to name)."""
        what = {APPLY: "apply", MAP: "map", STARMAP: "starmap"}[self.mode]
        name = f"{what} of {self.call.function.name}"
        if self.mode == APPLY:
            return name
        last = self.first + self.size - 1
        items = f"item {self.first}" if self.size == 1 else f"items {self.first}-{last}"
        if offset is not None and 0 <= offset < self.size:
            if self.size == 1:
                return f"{name}, item {self.first} of the input"
            return f"{name}, item {self.first + offset} of the input (its chunk: {items})"
        return f"{name}, {items} of the input"

    def name_item(self, exc: BaseException) -> None:
        """Add a note to ``exc``, raised by this task, naming the input item it came from."""
        offset = exc.__dict__.pop(ITEM_ATTRIBUTE, None) if hasattr(exc, "__dict__") else None
        add_note(exc, f"raised by {self.describe(offset)}")


def add_note(exc: BaseException, note: str) -> None:
    """Add ``note`` to ``exc`` (printed under its traceback)."""
    if hasattr(exc, "add_note"):
        exc.add_note(note)
    else:  # Python < 3.11: kept where 3.11's traceback would print it
        exc.__notes__ = [*getattr(exc, "__notes__", []), note]


class Call(abc.ABC):
    """What every result object shares: its function, its tasks, a cost estimate."""

    def __init__(self, pool_core: Any, func: Callable[..., Any], callback, error_callback,
                 progress: Any = None, total_items: Optional[int] = None,
                 items_per_task: int = 1) -> None:
        for name, fn in (("callback", callback), ("error_callback", error_callback)):
            if fn and not callable(fn):   # before any task is sent
                raise TypeError(f"{name} must be callable, got {type(fn).__name__}")
        self._core = pool_core
        self.function = pool_core.functions.acquire(func)
        self._items_per_task = items_per_task
        # a false value is no callback, as the stdlib's pool tests them (``if callback``)
        self._callback = callback or None
        self._error_callback = error_callback or None
        self._progress = make_progress(progress, total_items)
        self._outstanding = 0          # tasks submitted and not yet finished (I/O thread)
        self._submitted_all = False
        self._released = False
        self._owner: Any = None   # the Pool, held while this result lives (see keep_alive)
        per_item = self.function.item_seconds   # seconds per task, measured by workers
        self.mean_duration = None if per_item is None else per_item * items_per_task

    # -- called by the pool ------------------------------------------------------
    def keep_alive(self, owner: Any) -> None:
        """Hold ``owner`` (the :class:`~fiberrl.Pool`) until every task of this call has
        finished, as the stdlib's results hold their pool until they are ready:
        ``Pool(2).map_async(...)`` with the pool dropped at once still runs to its end."""
        self._owner = owner

    def _make_task(self, index: int, mode: int, payload: Any, size: int, first: int = 0,
                   memo: Optional[dict] = None) -> Task:
        """Pickle one task; ``memo`` (one dict per call) lets its tasks share large buffers."""
        return Task(self, index, mode, payload, size, first, memo)

    def _task_done(self, task: Task, ok: bool, value: Any, duration: float) -> None:
        """A task of this call finished (I/O thread)."""
        if duration >= 0:
            mean = self.mean_duration
            self.mean_duration = duration if mean is None else 0.8 * mean + 0.2 * duration
        self._outstanding -= 1
        if self._progress is not None:
            self._progress.advance(task.size)
            if self._submitted_all and self._outstanding <= 0:
                self._progress.close()  # the bar's last line comes before the result
                self._progress = None
        if (not ok and isinstance(value, BaseException) and task.mode != APPLY
                and not isinstance(value, JobFailedError)):  # those name the task themselves
            task.name_item(value)
        self._set(task.index, ok, value)
        self._maybe_release()

    def _tasks_done(self, done: List[tuple]) -> None:
        """Tasks of this call finished, ``(task, ok, value, seconds)`` each (I/O thread)."""
        for task, ok, value, seconds in done:
            try:
                self._task_done(task, ok, value, seconds)
            except Exception:  # user code runs in there (progress sinks)
                logger.exception("finishing %s failed", task.describe())

    def _run_done(self, tasks: List[Task], values: List[Any], seconds: float) -> None:
        """Map tasks of one item each succeeded with ``values``, taking ``seconds`` each
        on average (I/O thread)."""
        self._tasks_done([(task, True, [value], seconds) for task, value in zip(tasks, values)])

    def _tasks_added(self, count: int) -> None:
        self._outstanding += count

    def _all_submitted(self) -> None:
        self._submitted_all = True
        self._maybe_release()

    def _maybe_release(self) -> None:
        if self._submitted_all and self._outstanding <= 0 and not self._released:
            self._released = True
            if self._progress is not None:
                self._progress.close()
            if self.mean_duration is not None:
                self.function.item_seconds = self.mean_duration / self._items_per_task
            self._core.functions.release(self.function)
            self._owner = None   # a pool nobody else holds may go now (see keep_alive)

    @abc.abstractmethod
    def _set(self, index: int, ok: bool, value: Any) -> None:
        """Chunk ``index`` finished: ``value`` is its result, or its exception if not ``ok``."""

    @abc.abstractmethod
    def _abort(self, exc: BaseException) -> None:
        """The pool was terminated: fail whatever is still waiting."""

    def _run_callback(self, fn: Optional[Callable[[Any], Any]], value: Any) -> None:
        if fn is not None:
            try:
                fn(value)
            except Exception:
                logger.exception("pool callback %r raised", fn)


class ApplyResult(Call):
    """The ``multiprocessing.pool.AsyncResult`` of one call."""

    def __init__(self, pool_core: Any, func, callback=None, error_callback=None,
                 progress: Any = None, total_items: Optional[int] = None,
                 items_per_task: int = 1) -> None:
        super().__init__(pool_core, func, callback, error_callback, progress, total_items,
                         items_per_task)
        self._event = threading.Event()
        self._success: Optional[bool] = None
        self._value: Any = None

    def ready(self) -> bool:
        """True once the call has a result or an error."""
        return self._event.is_set()

    def successful(self) -> bool:
        """True if the call completed without an error; ValueError if not ready yet."""
        if not self.ready():
            raise ValueError(f"{self!r} not ready")
        return bool(self._success)

    def wait(self, timeout: Optional[float] = None) -> None:
        """Wait until the result is ready or ``timeout`` seconds pass."""
        _wait(self._event, timeout)

    def get(self, timeout: Optional[float] = None) -> Any:
        """The result; raises the task's exception, or TimeoutError after ``timeout`` s."""
        if not _wait(self._event, timeout):
            raise TimeoutError(f"no result within {timeout} s")
        if self._success:
            return self._value
        raise self._value

    def _finish(self, ok: bool, value: Any) -> None:
        if self._success is not None:   # finished already (a late abort, say)
            return
        self._success, self._value = ok, value
        fn = self._callback if ok else self._error_callback
        if fn is None:
            self._event.set()
            return

        def call_back_then_ready() -> None:
            self._run_callback(fn, value)
            self._event.set()

        self._core.callbacks.run(call_back_then_ready)

    def _set(self, index: int, ok: bool, value: Any) -> None:
        self._finish(ok, value)

    def _abort(self, exc: BaseException) -> None:
        self._finish(False, exc)


AsyncResult = ApplyResult


class MapResult(ApplyResult):
    """The result of ``map_async``: a list, filled chunk by chunk; fails at the first error."""

    def __init__(self, pool_core: Any, func, n_items: int, chunksize: int, callback=None,
                 error_callback=None, progress: Any = None) -> None:
        super().__init__(pool_core, func, callback, error_callback, progress, n_items,
                         max(chunksize, 1))
        self._chunksize = chunksize
        self._items: List[Any] = [None] * n_items
        self._chunks_left = -(-n_items // chunksize) if n_items else 0
        self._room: Optional[threading.Event] = None   # see _wait_for_room
        self._low_water = -1
        if n_items == 0:
            self._finish(True, [])

    def _wait_for_room(self, window: int) -> bool:
        """Block the submitting caller while more than ``window`` tasks are outstanding,
        until half of them finished; False once the call finished (failed, or aborted):
        submit no more."""
        if self._outstanding > window:
            if self._room is None:
                self._room = threading.Event()
            self._low_water = window // 2      # (after _room: the I/O thread reads both)
            while self._success is None:
                self._room.clear()
                if self._outstanding <= self._low_water:
                    break
                self._room.wait(_WAKE)   # a wake-up sooner: see _tasks_done
        return self._success is None

    def _tasks_done(self, done: List[tuple]) -> None:
        """:meth:`Call._tasks_done` without a call per task while chunks succeed and no
        progress is reported (a noop ``map`` spends much of its time here)."""
        if self._progress is not None or self._success is not None:
            super()._tasks_done(done)
        else:
            self._chunks_done(done)
        self._make_room()

    def _run_done(self, tasks: List[Task], values: List[Any], seconds: float) -> None:
        """:meth:`Call._run_done`, filling in one item per task."""
        if self._progress is not None or self._success is not None:
            super()._run_done(tasks, values, seconds)   # through _tasks_done
            return
        items, size = self._items, self._chunksize
        for task, value in zip(tasks, values):
            items[task.index * size] = value
        count, mean = len(tasks), self.mean_duration
        weight = 0.8 ** count   # as many steps of the average _task_done keeps
        self.mean_duration = seconds if mean is None else weight * mean + (1 - weight) * seconds
        self._outstanding -= count
        self._chunks_left -= count
        if self._chunks_left == 0:
            self._items = []
            self._finish(True, items)
        self._maybe_release()
        self._make_room()

    def _make_room(self) -> None:
        if self._low_water >= 0 and not self._room.is_set() and (
                self._outstanding <= self._low_water or self._success is not None):
            self._room.set()   # the caller submitting this map may go on (_wait_for_room)

    def _chunks_done(self, done: List[tuple]) -> None:
        """Fill in succeeded chunks; the first failed one, and those after it, one by one."""
        mean, items, size = self.mean_duration, self._items, self._chunksize
        finished = 0
        for task, ok, value, seconds in done:
            if not ok:
                break
            if seconds >= 0:
                mean = seconds if mean is None else 0.8 * mean + 0.2 * seconds
            start = task.index * size
            items[start:start + len(value)] = value
            finished += 1
        self.mean_duration = mean
        self._outstanding -= finished
        self._chunks_left -= finished
        if finished < len(done):
            super()._tasks_done(done[finished:])  # the failed chunk, and any after it
            return
        if self._chunks_left == 0:
            self._items = []
            self._finish(True, items)
        self._maybe_release()

    def _set(self, index: int, ok: bool, value: Any) -> None:
        if self._event.is_set():
            return  # failed fast earlier: later chunks are dropped
        if not ok:
            self._items = []
            self._finish(False, value)
            return
        start = index * self._chunksize
        self._items[start:start + len(value)] = value
        self._chunks_left -= 1
        if self._chunks_left == 0:
            items, self._items = self._items, []
            self._finish(True, items)


#: inputs cut into chunks by slicing: a list's or tuple's slice copies references only,
#: and a range's is a range (it travels as three numbers; the worker makes the items)
_SLICED = (list, tuple, range)


def chunks(iterable: Iterable[Any], size: int):
    """Yield chunks of ``size`` items (the last may be shorter): lists, or slices of a
    list, tuple or range."""
    if type(iterable) in _SLICED:
        for start in range(0, len(iterable), size):
            yield iterable[start:start + size]
        return
    iterator = iter(iterable)
    while True:
        chunk = list(itertools.islice(iterator, size))
        if not chunk:
            return
        yield chunk
