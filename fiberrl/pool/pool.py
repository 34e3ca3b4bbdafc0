"""``fiberrl.Pool``: the ``multiprocessing.Pool`` API over job-backed workers.

Threads of a pool (all daemon threads of the caller's process)::

    caller ──pickle tasks──> I/O thread (dispatch.py) <──TCP──> worker jobs (worker.py)
                                  ^  events |
                                  |         v
                              supervisor thread (supervisor.py): starts, reaps, scales
    imap feeder threads: read an imap's input lazily, a bounded window ahead

Delivery guarantee: every task runs to completion at least once; a task whose
worker died is run again on another worker, so a task may run more than once if
its worker died after side effects. A task whose workers died ``max_task_retries``
times fails with :class:`fiberrl.TaskRetryError`. An exception raised by the task
itself goes to the caller, as with the stdlib, unless the pool was made with
``error_handling`` (Uber Fiber's meaning): then the task runs again, up to 5 more
times by default, and the caller gets its last exception only if every run raised
(see :mod:`.rerun`).
"""
from __future__ import annotations

import dataclasses
import itertools
import logging
import os
import threading
import time
import warnings
import weakref
from multiprocessing.pool import CLOSE, RUN, TERMINATE
from typing import Any, Callable, Iterable, List, Mapping, Optional

from .. import reduction, resources
from ..config import get_config
from ..errors import PoolTerminatedError, TimeoutError
from .callbacks import CallbackRunner
from .dispatch import MAX_BATCH, Dispatcher
from .limits import ensure_fd_room
from .shared import DEFAULT_ARG_CACHE_BYTES, BufferTable
from .supervisor import Supervisor
from .imap import IMapIterator, feed
from .rerun import error_retries_of
from .tasks import (APPLY, MAP, SCALAR_TYPES, STARMAP, ApplyResult, FunctionTable, MapResult, Task,
                    chunks)

logger = logging.getLogger(__name__)

_pool_ids = itertools.count(1)


@dataclasses.dataclass(frozen=True)
class PoolStats:
    """A snapshot of a pool (counts of workers and tasks)."""

    target: int        #: workers the pool aims to keep
    alive: int         #: workers connected and taking tasks
    starting: int      #: workers started that have not said hello yet
    idle: int          #: connected workers holding no task
    queued: int        #: tasks waiting for a worker
    pending: int       #: tasks handed to a worker, result not back yet
    completed: int     #: tasks finished since the pool started
    worker_deaths: int  #: workers lost unexpectedly (crash, kill, missed heartbeat)
    retried: int       #: tasks re-queued after their worker died
    error_reruns: int = 0  #: tasks run again after they raised (``error_handling``)
    time_limit_replacements: int = 0  #: workers replaced before their job's time limit
    payload_bytes_sent: int = 0  #: bytes of task messages sent to workers (pickled tasks,
    #: functions and large arguments)
    cached_arg_sends: int = 0    #: large arguments sent into a worker's cache
    cached_arg_hits: int = 0     #: large task arguments a worker's cache served instead
    cached_args: int = 0         #: shared large arguments the pool holds now (used by a task)
    shared_arg_maps: int = 0     #: large arguments a worker mapped from its host's memory
    #: (this process's, or another worker's there) instead of receiving their bytes
    #: (counted in ``cached_arg_sends`` too)


def _check_callable(func: Any) -> None:
    if not callable(func):
        raise TypeError(f"pool task must be callable, got {type(func).__name__}")


class _PoolCore:
    """Everything the threads share; the :class:`Pool` object only holds this."""

    def __init__(self, processes: int, worker_options: dict, max_task_retries: int,
                 heartbeat_timeout: float, idle_timeout: Optional[float],
                 error_retries: int = 0) -> None:
        self.name = f"Pool-{next(_pool_ids)}"
        self.state = RUN
        self.feeders: "weakref.WeakSet[threading.Thread]" = weakref.WeakSet()
        import queue
        events: "queue.SimpleQueue" = queue.SimpleQueue()
        self.dispatcher = Dispatcher(f"{self.name}-{os.getpid()}-{id(self):x}",
                                     max_task_retries, heartbeat_timeout, idle_timeout, events,
                                     error_retries)
        self.functions = FunctionTable(self.dispatcher.forget_function)
        self.callbacks = CallbackRunner(self.name)
        self.buffers = BufferTable(self.dispatcher.forget_buffer, reduction.OUT_OF_BAND_MIN_BYTES)
        self.dispatcher.buffers = self.buffers
        self.dispatcher.target = processes
        self.supervisor = Supervisor(self.dispatcher, processes, self.name, worker_options,
                                     max_task_retries, idle_timeout,
                                     get_config().time_limit_margin)
        self.dispatcher.start()
        self.supervisor.thread.start()

    def terminate(self) -> None:
        if self.state == TERMINATE:
            return
        self.state = TERMINATE
        self.supervisor.request("terminate")

    def join(self, timeout: Optional[float] = None) -> bool:
        thread = self.supervisor.thread
        if thread is not threading.current_thread() and thread.is_alive():
            thread.join(timeout)   # (not from a callback: the pool's own threads wind down)
            if thread.is_alive():
                return False
        if self.dispatcher.reactor.in_loop():
            return True   # on the I/O loop itself: the dispatcher stops after it
        if not self.dispatcher.wait_stopped(timeout):
            return False
        self.callbacks.stop(timeout)   # every result's callback has run
        return True


TERMINATE_WAIT = 15.0  # seconds terminate() waits for the workers to be gone


def _terminate_core(core: _PoolCore) -> None:
    """Terminate the core of a pool that was collected (or at exit) and wait for it,
    except on the I/O loop: a result that held the pool can be dropped there last, and
    the pool's threads need the loop to wind down."""
    core.terminate()
    if not core.dispatcher.reactor.in_loop():
        core.join(15.0)


class Pool:
    """A pool of job-backed worker processes with the ``multiprocessing.Pool`` API.

    ``processes`` (default: ``fiberrl.cpu_count()``), ``initializer``/``initargs``,
    ``maxtasksperchild`` and ``context`` are the stdlib's. Keyword-only extras:

    - ``error_handling``: False (the default) gives a task's exception to the caller
      at once, as the stdlib does. True runs a task that raised again, up to
      :data:`~fiberrl.pool.rerun.DEFAULT_ERROR_RETRIES` (5) more times, on whichever
      worker is free (Uber Fiber's ``Pool(error_handling=True)``); an int sets how many
      more times. Of a map chunk only the items that raised run again. If every run
      raised, the caller gets the last run's exception, its type unchanged, with notes
      naming the input item and the number of runs. Deaths of workers are counted
      apart (``max_task_retries``): a task being run again is in the pending table
      like any other, and is run again if its worker dies. Use it for tasks that are
      safe to run twice;
    - ``max_task_retries``: deaths of the workers running a task before it fails
      (default: the ``max_task_retries`` setting, 3);
    - ``heartbeat_timeout``: seconds of silence after which a worker is considered
      dead and killed, e.g. a SIGSTOPped or partitioned worker (default: the
      ``heartbeat_timeout`` setting, 10 s);
    - ``idle_timeout``: seconds after which an idle worker is released back to the
      cluster (default None: workers stay); released workers start again when work
      arrives;
    - ``arg_cache_bytes``: bytes of large arguments each worker may keep so that an
      argument shared by many tasks is sent once per worker at most, and from 1 MiB
      once per host (default 256 MiB; see :mod:`fiberrl.pool.shared`);
    - ``cpu``, ``mem``, ``gpu`` and backend hints such as ``time_limit`` or
      ``partition`` (see :mod:`fiberrl.resources`): what each worker's job asks for.

    A worker whose job nears the backend's time limit (Slurm ``--time``) is replaced
    ``time_limit_margin`` seconds before it (config setting, 120 s). Workers start in
    the background; tasks flow as soon as the first is up. Grow or
    shrink the pool with :meth:`resize`; watch it with :meth:`stats`.
    """

    def __init__(self, processes: Optional[int] = None, initializer: Optional[Callable[..., Any]] = None,
                 initargs: Iterable[Any] = (), maxtasksperchild: Optional[int] = None,
                 context: Any = None, *, error_handling: "bool | int" = False,
                 max_task_retries: Optional[int] = None,
                 heartbeat_timeout: Optional[float] = None,
                 idle_timeout: Optional[float] = None, arg_cache_bytes: int = DEFAULT_ARG_CACHE_BYTES,
                 cpu: Optional[float] = None,
                 mem: Any = None, gpu: Optional[int] = None, **hints: Any) -> None:
        self._state = RUN  # before anything can raise, so __del__ works
        self._core: Optional[_PoolCore] = None
        if processes is None:
            processes = os.cpu_count() or 1
        _check_count(processes, "processes")
        if maxtasksperchild is not None and (not isinstance(maxtasksperchild, int)
                                             or isinstance(maxtasksperchild, bool)
                                             or maxtasksperchild <= 0):
            raise ValueError("maxtasksperchild must be a positive int or None")
        if initializer is not None and not callable(initializer):
            raise TypeError("initializer must be a callable")
        cfg = get_config()
        retries = cfg.max_task_retries if max_task_retries is None else max_task_retries
        _check_count(retries, "max_task_retries")
        timeout = cfg.heartbeat_timeout if heartbeat_timeout is None else float(heartbeat_timeout)
        if timeout <= 0:
            raise ValueError("heartbeat_timeout must be positive")
        if idle_timeout is not None and idle_timeout <= 0:
            raise ValueError("idle_timeout must be positive or None")
        if isinstance(context, bool):   # Pool(4, None, (), None, True), written for Fiber
            raise TypeError("Pool's fifth argument is the stdlib's context; pass Uber Fiber's "
                            "error_handling by keyword: Pool(..., error_handling=True)")
        error_retries = error_retries_of(error_handling)
        initargs = tuple(initargs)
        if initializer is not None:
            from .. import reduction
            reduction.dumps((initializer, initargs))  # pickling errors surface here
        options = {"initializer": initializer, "initargs": initargs, "maxtasks": maxtasksperchild,
                   "heartbeat_interval": min(cfg.heartbeat_interval, timeout / 4),
                   "error_handling": error_retries > 0,
                   "resources": resources.validate(cpu, mem, gpu, **hints)}
        self._processes = processes
        self._window = 4 * processes + 32
        ensure_fd_room(processes)  # a clear error here, not EMFILE in a thread later
        if not isinstance(arg_cache_bytes, int) or arg_cache_bytes < 0:
            raise ValueError(f"arg_cache_bytes must be a non-negative int, got {arg_cache_bytes!r}")
        self._core = _PoolCore(processes, options, retries, timeout, idle_timeout, error_retries)
        self._core.dispatcher.arg_cache_bytes = arg_cache_bytes
        self._finalizer = weakref.finalize(self, _terminate_core, self._core)

    # -- the stdlib API --------------------------------------------------------------
    def apply(self, func: Callable[..., Any], args: Iterable[Any] = (),
              kwds: Optional[Mapping[str, Any]] = None) -> Any:
        """Run ``func(*args, **kwds)`` in a worker and return its result."""
        return self.apply_async(func, args, kwds).get()

    def apply_async(self, func: Callable[..., Any], args: Iterable[Any] = (),
                    kwds: Optional[Mapping[str, Any]] = None, callback: Optional[Callable] = None,
                    error_callback: Optional[Callable] = None) -> ApplyResult:
        """Start ``func(*args, **kwds)`` in a worker; returns an ``AsyncResult``."""
        self._check_running()
        _check_callable(func)
        core = self._core
        result = ApplyResult(core, func, callback, error_callback)
        result.keep_alive(self)
        try:
            task = result._make_task(0, APPLY, (tuple(args), dict(kwds or {})), 1)
        except BaseException:
            core.functions.release(result.function)
            raise
        core.dispatcher.submit(result, [task], True)
        return result

    def map(self, func: Callable[[Any], Any], iterable: Iterable[Any], chunksize: Optional[int] = None,
            *, progress: Any = False) -> List[Any]:
        """``list(map(func, iterable))``, computed by the workers.

        Tasks are submitted a bounded window ahead of the results (see
        :meth:`_map_async`); once a task raised, the rest of the input is submitted at
        once and still runs, as with the stdlib.
        """
        return self._map_async(func, iterable, MAP, chunksize, None, None, progress,
                               self._map_window()).get()

    def starmap(self, func: Callable[..., Any], iterable: Iterable[Iterable[Any]],
                chunksize: Optional[int] = None, *, progress: Any = False) -> List[Any]:
        """Like :meth:`map`, calling ``func(*item)``."""
        return self._map_async(func, iterable, STARMAP, chunksize, None, None, progress,
                               self._map_window()).get()

    def map_async(self, func: Callable[[Any], Any], iterable: Iterable[Any],
                  chunksize: Optional[int] = None, callback: Optional[Callable] = None,
                  error_callback: Optional[Callable] = None, *, progress: Any = False) -> MapResult:
        """Asynchronous :meth:`map`; returns an ``AsyncResult`` of the list."""
        return self._map_async(func, iterable, MAP, chunksize, callback, error_callback, progress)

    def starmap_async(self, func: Callable[..., Any], iterable: Iterable[Iterable[Any]],
                      chunksize: Optional[int] = None, callback: Optional[Callable] = None,
                      error_callback: Optional[Callable] = None, *, progress: Any = False) -> MapResult:
        """Asynchronous :meth:`starmap`."""
        return self._map_async(func, iterable, STARMAP, chunksize, callback, error_callback, progress)

    def imap(self, func: Callable[[Any], Any], iterable: Iterable[Any], chunksize: int = 1,
             *, progress: Any = False) -> IMapIterator:
        """Lazy, ordered :meth:`map`: reads ``iterable`` a bounded window ahead."""
        return self._imap(func, iterable, chunksize, True, progress)

    def imap_unordered(self, func: Callable[[Any], Any], iterable: Iterable[Any], chunksize: int = 1,
                       *, progress: Any = False) -> IMapIterator:
        """Like :meth:`imap`, yielding results as they finish."""
        return self._imap(func, iterable, chunksize, False, progress)

    def close(self) -> None:
        """Accept no more work; workers exit once every submitted task is done."""
        if self._state == RUN:
            self._state = CLOSE
            core = self._core
            core.state = CLOSE
            core.dispatcher.call_soon(lambda: setattr(core.dispatcher, "closing", True))
            core.supervisor.request("close")

    def terminate(self) -> None:
        """Stop now: kill every worker; outstanding results raise PoolTerminatedError."""
        self._state = TERMINATE
        if self._core is not None:
            self._core.terminate()
            # like the stdlib's, return once the workers are gone (bounded: a backend
            # that does not answer must not hang the caller)
            self._core.join(TERMINATE_WAIT)

    def join(self, timeout: Optional[float] = None) -> None:
        """Wait for the workers to exit (after :meth:`close` or :meth:`terminate`)."""
        if self._state == RUN:
            raise ValueError("Pool is still running")
        if self._core is not None and not self._core.join(timeout):
            logger.warning("pool %s did not wind down within %s s", self._core.name, timeout)

    def __enter__(self) -> "Pool":
        self._check_running()
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.terminate()

    def __del__(self) -> None:
        if getattr(self, "_state", None) == RUN and getattr(self, "_core", None) is not None:
            warnings.warn(f"unclosed running multiprocessing pool {self!r}", ResourceWarning,
                          source=self)

    def __reduce__(self):
        raise NotImplementedError("pool objects cannot be passed between processes or pickled")

    def __repr__(self) -> str:
        name = self._core.name if self._core is not None else "Pool"
        return f"<fiberrl.{name} state={self._state} processes={self._processes}>"

    # -- fiberrl's extras --------------------------------------------------------------
    @property
    def processes(self) -> int:
        """The number of workers the pool aims to keep."""
        return self._processes

    def resize(self, processes: int) -> None:
        """Grow or shrink the pool while it runs.

        New workers start in the background. When shrinking, workers still starting
        go first, then the least busy; a worker that is retired finishes the tasks it
        holds before it exits, so no task is lost or re-run.
        """
        self._check_running()
        _check_count(processes, "processes")
        ensure_fd_room(max(0, processes - self._processes))  # not EMFILE in a thread later
        self._processes = processes
        self._window = 4 * processes + 32
        core = self._core
        core.dispatcher.call_soon(lambda: setattr(core.dispatcher, "target", processes))
        core.supervisor.request("resize", processes)

    def start_workers(self) -> None:
        """Start every worker now (Uber Fiber's name).

        Workers start when the pool is made, in the background, so this matters only
        with ``idle_timeout``, where they otherwise start when work arrives: it starts
        them all now (they are released again once idle for ``idle_timeout``)."""
        self._check_running()
        self._core.supervisor.request("start_workers")

    def wait_until_workers_up(self, timeout: Optional[float] = None) -> None:
        """Block until every one of the pool's ``processes`` workers is connected and
        taking tasks (Uber Fiber's name; it also starts them, as :meth:`start_workers`).

        ``timeout`` (seconds, None: no limit): when it expires first,
        ``multiprocessing.TimeoutError`` (``fiberrl.TimeoutError``) says how many are up.
        Raises the backend's :class:`~fiberrl.JobFailedError` if workers keep failing
        to start (as queued tasks do), :class:`~fiberrl.PoolTerminatedError` if the pool
        stops meanwhile, and ``ValueError`` on a pool that was closed or terminated.
        """
        self.start_workers()
        supervisor = self._core.supervisor
        deadline = None if timeout is None else time.monotonic() + max(0.0, timeout)
        while True:
            up, wanted = supervisor.workers_up(), self._processes
            if up >= wanted:
                return
            if supervisor.start_error is not None:
                raise supervisor.start_error
            if self._state != RUN or not supervisor.thread.is_alive():
                raise PoolTerminatedError("the pool stopped before its workers were up")
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise TimeoutError(f"{up} of the pool's {wanted} workers are up after "
                                   f"{timeout} s")
            # (woken within 0.1 s at most, so that Ctrl-C reaches the main thread)
            supervisor.wait_changed(0.1 if left is None else min(0.1, left))

    def workers(self) -> list:
        """The worker process objects currently started (``fiberrl.Process``)."""
        return self._core.supervisor.processes() if self._core is not None else []

    def stats(self) -> PoolStats:
        """Counts of workers and tasks right now."""
        core = self._core
        dispatcher, supervisor = core.dispatcher, core.supervisor
        links = list(dispatcher.links.values())
        alive = [link for link in links if not link.dead]
        return PoolStats(target=self._processes, alive=len(alive),
                         starting=supervisor.roster.starting,
                         idle=sum(1 for link in alive if dispatcher.pending.held_by(link.id) == 0),
                         queued=len(dispatcher.queue), pending=len(dispatcher.pending),
                         completed=dispatcher.completed, worker_deaths=supervisor.worker_deaths,
                         retried=dispatcher.pending.retried,
                         error_reruns=dispatcher.error_reruns,
                         time_limit_replacements=supervisor.time_limit_replacements,
                         payload_bytes_sent=dispatcher.payload_bytes_sent,
                         cached_arg_sends=dispatcher.cached_arg_sends,
                         cached_arg_hits=dispatcher.cached_arg_hits,
                         cached_args=core.buffers.live,
                         shared_arg_maps=dispatcher.broadcast.maps)

    # -- stdlib-compatible internals used by CPython's tests --------------------------
    @property
    def _pool(self) -> list:
        """The stdlib's list of worker processes; waits (up to 60 s) until the
        supervisor has started the target number of workers."""
        core = self._core
        if core is not None and core.state == RUN:
            deadline = time.monotonic() + 60.0
            while (len(core.supervisor.roster) < self._processes and time.monotonic() < deadline
                   and core.supervisor.thread.is_alive()):
                time.sleep(0.01)
        return self.workers()

    def _repopulate_pool(self) -> None:
        """Ask the supervisor to refill the pool now (it also does so on its own)."""
        if self._core is not None:
            self._core.supervisor.request("resize", self._processes)

    # -- helpers -----------------------------------------------------------------------
    def _map_window(self) -> int:
        """Tasks a blocking map keeps outstanding: enough for every worker's fullest batch."""
        return 4096 + 2 * MAX_BATCH * self._processes

    def _check_running(self) -> None:
        if self._state != RUN:
            raise ValueError("Pool not running")

    def _map_async(self, func, iterable, mode, chunksize, callback, error_callback, progress,
                   window=None):
        """Submit a map's tasks. ``window`` (a blocking ``map``): keep at most about that many
        tasks outstanding while submitting, so that a long map's tasks are not all alive
        at once (the garbage collector walks every live one, again and again)."""
        self._check_running()
        _check_callable(func)
        if not hasattr(iterable, "__len__"):
            iterable = list(iterable)
        n_items = len(iterable)
        if chunksize is None:
            chunksize, extra = divmod(n_items, self._processes * 4)
            if extra:
                chunksize += 1
        _check_count(chunksize, "chunksize", allow_zero=n_items == 0)
        chunksize = max(chunksize, 1)
        core = self._core
        result = MapResult(core, func, n_items, chunksize, callback, error_callback, progress)
        result.keep_alive(self)
        memo: dict = {}  # the call's tasks share their large buffers (see .shared)
        batch: list = []
        submit, make_task = core.dispatcher.submit, result._make_task
        limit = 1   # the first task goes alone, so that a worker starts while the rest
        #             are cut and pickled; then batches of 4, 16, 64, 256 (but tasks that
        #             carry large buffers go together: the buffers they share are sent
        #             once per worker only if the tasks sharing them are queued together)
        try:
            if chunksize == 1:   # no chunk lists to cut: each item is its own chunk
                tasks = (Task(result, index, mode, None, 1, index, None, (item,))
                         if type(item) in SCALAR_TYPES else
                         make_task(index, mode, [item], 1, index, memo)
                         for index, item in enumerate(iterable))
            else:
                tasks = (make_task(index, mode, chunk, len(chunk), index * chunksize, memo)
                         for index, chunk in enumerate(chunks(iterable, chunksize)))
            for task in tasks:
                batch.append(task)
                if len(task.frames) > 1:
                    limit = 256
                if len(batch) >= limit:
                    submit(result, batch, False)
                    batch, limit = [], min(256, limit * 4)
                    if window is not None and not result._wait_for_room(window):
                        if core.state == TERMINATE:
                            break   # the pool stopped: nothing more to run
                        window = None   # the call failed: its other tasks still run, as
                        #                 with the stdlib, which queues them all at once
        except BaseException as exc:
            for task in batch:
                core.buffers.release(task.frames)
            submit(result, [], True)
            result._abort(exc)
            raise
        submit(result, batch, True)
        return result

    def _imap(self, func, iterable, chunksize, ordered, progress):
        self._check_running()
        _check_callable(func)
        _check_count(chunksize, "chunksize")
        core = self._core
        total = len(iterable) if hasattr(iterable, "__len__") else None
        result = IMapIterator(core, func, ordered, self._window, progress, total, chunksize)
        result.keep_alive(self)
        feeder = threading.Thread(target=feed, args=(core, result, iter(iterable), chunksize,
                                                      MAP),
                                  name=f"fiberrl-{core.name}-feeder", daemon=True)
        core.feeders.add(feeder)
        feeder.start()
        return result


def _check_count(value: Any, name: str, allow_zero: bool = False) -> None:
    """A count argument: ``TypeError`` if not an int, ``ValueError`` if too small (the
    stdlib's types for ``Pool('4')`` and ``Pool(0)``)."""
    wanted = f"{name} must be {'a non-negative' if allow_zero else 'at least 1, an'} int"
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"{wanted}, got {type(value).__name__} {value!r}")
    if value < (0 if allow_zero else 1):
        raise ValueError(f"{wanted}, got {value!r}")
