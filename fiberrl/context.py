"""``FiberContext``: the face of fiberrl, one factory method per ``multiprocessing`` name.

Mirrors CPython's ``multiprocessing/context.py``: ``import fiberrl as mp`` exposes
the default context's methods, and each imports its module only when first used, so
importing fiberrl does no work. Every start method is accepted for compatibility;
jobs always have spawn semantics (nothing of the parent's memory is inherited: the
process object travels pickled), on the configured backend. The local backend forks
them from a warm fork server unless the ``forkserver`` setting is off.
"""
from __future__ import annotations

import os
import sys
from multiprocessing import context as _mp_context
from typing import Any, Optional

from . import errors
from ._runtime import jobenv

#: the stdlib's start method names (``get_all_start_methods``); ``"fiberrl"`` is also
#: accepted, as the default's other name
_START_METHODS = ["spawn", "fork", "forkserver"]
_ACCEPTED = ("fiberrl", *_START_METHODS)


class FiberContext(_mp_context.BaseContext):
    """A ``multiprocessing`` context whose processes are jobs.

    It is a ``multiprocessing.context.BaseContext``, so libraries that type-check the
    context they are given (torch's ``DataLoader(multiprocessing_context=...)``,
    ``concurrent.futures``) accept it; every factory hands out fiberrl's objects.
    """

    ProcessError = errors.ProcessError
    BufferTooShort = errors.BufferTooShort
    TimeoutError = errors.TimeoutError
    AuthenticationError = errors.AuthenticationError
    TaskRetryError = errors.TaskRetryError
    TaskDeserializationError = errors.TaskDeserializationError
    PoolTerminatedError = errors.PoolTerminatedError
    ManagerConnectionError = errors.ManagerConnectionError

    def __init__(self, start_method: Optional[str] = "spawn") -> None:
        self._start_method = start_method
        self._reducer: Any = None

    @property
    def Process(self):
        """The job-backed ``Process`` class."""
        from .process import Process
        return Process

    def Pipe(self, duplex: bool = True):
        """Two connected ``Connection`` objects (see :func:`fiberrl.connection.Pipe`)."""
        from .connection import Pipe
        return Pipe(duplex)

    def Queue(self, maxsize: int = 0):
        """A queue shared by every process of the run."""
        from .queues import Queue
        return Queue(maxsize)

    def JoinableQueue(self, maxsize: int = 0):
        """A queue with ``task_done()`` and ``join()``."""
        from .queues import JoinableQueue
        return JoinableQueue(maxsize)

    def SimpleQueue(self):
        """An unbounded queue with ``put``, ``get``, ``empty`` and ``close``."""
        from .queues import SimpleQueue
        return SimpleQueue()

    def Pool(self, processes: Optional[int] = None, initializer: Any = None, initargs: tuple = (),
             maxtasksperchild: Optional[int] = None, **options: Any):
        """A pool of job-backed workers (see :class:`fiberrl.pool.Pool`)."""
        from ._runtime import spare
        # its first worker's interpreter starts while the pool's modules import: before
        # the configuration is read in a fresh program (reading it costs ~20 ms), so
        # dropped below if the backend is not local; not started if it is known not to be
        settings = sys.modules.get("fiberrl.config")
        if settings is None or settings.backend_name() == "local":
            spare.prestart(sys.executable, preload=("fiberrl.pool.worker",))
        try:
            from .config import backend_name
            if backend_name() != "local":
                spare.discard()
            from .pool import Pool
            return Pool(processes, initializer, initargs, maxtasksperchild, context=self,
                        **options)
        except BaseException:
            spare.discard()
            raise

    # -- managers and synchronization ---------------------------------------------
    def Manager(self):
        """A started :class:`fiberrl.managers.SyncManager` (its server is a job)."""
        from .managers import SyncManager
        manager = SyncManager(ctx=self)
        manager.start()
        return manager

    @staticmethod
    def Lock():
        """A lock shared by every process of the run (see :mod:`fiberrl.synchronize`)."""
        from .synchronize import Lock
        return Lock()

    @staticmethod
    def RLock():
        """A recursive lock shared by every process of the run."""
        from .synchronize import RLock
        return RLock()

    @staticmethod
    def Semaphore(value: int = 1):
        """A semaphore shared by every process of the run."""
        from .synchronize import Semaphore
        return Semaphore(value)

    @staticmethod
    def BoundedSemaphore(value: int = 1):
        """A bounded semaphore shared by every process of the run."""
        from .synchronize import BoundedSemaphore
        return BoundedSemaphore(value)

    @staticmethod
    def Condition(lock: Any = None):
        """A condition variable shared by every process of the run."""
        from .synchronize import Condition
        return Condition(lock)

    @staticmethod
    def Event():
        """An event shared by every process of the run."""
        from .synchronize import Event
        return Event()

    @staticmethod
    def Barrier(parties: int, action: Any = None, timeout: Optional[float] = None):
        """A barrier shared by every process of the run."""
        from .synchronize import Barrier
        return Barrier(parties, action, timeout)

    @staticmethod
    def Value(typecode_or_type: Any, *args: Any, lock: Any = True):
        """A shared value (see :mod:`fiberrl.sharedctypes`)."""
        from .sharedctypes import Value
        return Value(typecode_or_type, *args, lock=lock)

    @staticmethod
    def Array(typecode_or_type: Any, size_or_initializer: Any, *, lock: Any = True):
        """A shared array (see :mod:`fiberrl.sharedctypes`)."""
        from .sharedctypes import Array
        return Array(typecode_or_type, size_or_initializer, lock=lock)

    @staticmethod
    def RawValue(typecode_or_type: Any, *args: Any):
        """A shared value without a lock."""
        from .sharedctypes import RawValue
        return RawValue(typecode_or_type, *args)

    @staticmethod
    def RawArray(typecode_or_type: Any, size_or_initializer: Any):
        """A shared array without a lock."""
        from .sharedctypes import RawArray
        return RawArray(typecode_or_type, size_or_initializer)

    # -- process helpers ---------------------------------------------------------
    @staticmethod
    def current_process():
        """The process object of the calling process."""
        from .process import current_process
        return current_process()

    @staticmethod
    def parent_process():
        """The parent's process object (None in the main process)."""
        from .process import parent_process
        return parent_process()

    @staticmethod
    def active_children():
        """Children of this process that are still running (joins finished ones)."""
        from .process import active_children
        return active_children()

    @staticmethod
    def host_address() -> str:
        """The address other processes of this run reach this process at: the one its
        connections listen on (for rendezvous of libraries such as torch.distributed)."""
        from .backends import default_backend
        return default_backend().listen_host()

    @staticmethod
    def cpu_count() -> int:
        """Number of CPUs of this machine."""
        count = os.cpu_count()
        if count is None:
            raise NotImplementedError("cannot determine number of cpus")
        return count

    # -- configuration and compatibility ----------------------------------------
    @staticmethod
    def init(**config: Any):
        """Update fiberrl's configuration (backend, resources...); see :mod:`fiberrl.config`."""
        from . import backends  # noqa: F401 - registers its check of the backend's name
        from .config import init
        return init(**config)

    @staticmethod
    def reset():
        """Forget every :meth:`init` setting (Uber Fiber's ``fiber.reset``): back to the
        environment, the config file and the defaults."""
        from . import backends  # noqa: F401 - registers its check of the backend's name
        from .config import reset
        return reset()

    @staticmethod
    def meta(**hints: Any):
        """Decorator attaching resource hints to a target (see :mod:`fiberrl.resources`)."""
        from .resources import meta
        return meta(**hints)

    def get_context(self, method: Optional[str] = None) -> "FiberContext":
        """The context of ``method`` (default: the current start method's), as the
        stdlib's; every stdlib start method name is accepted."""
        return concrete_context(self.get_start_method() if method is None else method)

    def get_start_method(self, allow_none: bool = False) -> str:
        """The recorded start method (jobs always have spawn semantics)."""
        if self._start_method is None:  # the default context: the process's own
            return jobenv.start_method()
        return self._start_method

    def set_start_method(self, method: Optional[str], force: bool = False) -> None:
        """Accepted for compatibility; jobs always have spawn semantics (see the
        ``forkserver`` setting for how the local backend starts them). A job started
        from here reports the same start method."""
        if method is not None and method not in _ACCEPTED:
            raise ValueError(f"cannot find context for {method!r}")
        if self._start_method is None:
            jobenv.set_start_method(method or "spawn")
        else:
            self._start_method = method or "spawn"

    @staticmethod
    def get_all_start_methods() -> list:
        """The stdlib's start method names, all accepted (the default first)."""
        return list(_START_METHODS)

    @staticmethod
    def set_executable(executable: "str | bytes | os.PathLike") -> None:
        """Set the Python interpreter that runs jobs (str, bytes or path)."""
        from .config import init
        init(python=os.fsdecode(executable))

    @staticmethod
    def set_forkserver_preload(module_names: list) -> None:
        """Modules the local backend's fork server imports before it forks jobs (from
        the next server started; an import that fails is skipped), as in the stdlib."""
        from .backends.local.forkserver_client import set_preload
        set_preload(module_names)

    @staticmethod
    def freeze_support() -> None:
        """Accepted for compatibility; has no effect."""

    @staticmethod
    def allow_connection_pickling() -> None:
        """Connections always pickle in fiberrl; kept for compatibility."""

    @staticmethod
    def get_logger():
        """The ``fiberrl`` logger."""
        from .log import get_logger
        return get_logger()

    @staticmethod
    def log_to_stderr(level: Any = None):
        """Log fiberrl's records to stderr."""
        from .log import log_to_stderr
        return log_to_stderr(level if level is not None else 20)

    @property
    def reducer(self):
        """The pickling module of this context (:mod:`fiberrl.reduction`), as
        ``multiprocessing.reducer`` is ``multiprocessing.reduction``."""
        if self._reducer is not None:
            return self._reducer
        from . import reduction
        return reduction

    @reducer.setter
    def reducer(self, reduction: Any) -> None:
        self._reducer = reduction

    def _check_available(self) -> None:
        """Every start method name maps to fiberrl's jobs, which are always available."""

    def __repr__(self) -> str:
        return f"<fiberrl.{type(self).__name__} start_method={self.get_start_method()!r}>"


default_context = FiberContext(None)  # its start method is the process's (jobenv)


class _ConcreteContext(FiberContext):
    """The context of one start method (``get_context(method)``): its ``Process``
    class says the method, and a job started with it reports it; its start method
    cannot be changed, as with the stdlib's concrete contexts."""

    _process_name = "Process"

    @property
    def Process(self):
        """The job-backed ``Process`` class of this start method."""
        return _process_class(self._process_name)

    def get_context(self, method: Optional[str] = None) -> "FiberContext":
        """This context, or the context of ``method``."""
        return self if method is None else concrete_context(method)

    def set_start_method(self, method: Optional[str], force: bool = False) -> None:
        """Refused, as by the stdlib: a concrete context's method is fixed."""
        raise ValueError("cannot set start method of concrete context")


class SpawnContext(_ConcreteContext):
    """Jobs started by the ``spawn`` context (all jobs have spawn semantics)."""

    _process_name = "SpawnProcess"


class ForkContext(_ConcreteContext):
    """Jobs started by the ``fork`` context (nothing of this process's memory is
    inherited: the process object travels pickled)."""

    _process_name = "ForkProcess"


class ForkServerContext(_ConcreteContext):
    """Jobs started by the ``forkserver`` context."""

    _process_name = "ForkServerProcess"


class FiberrlContext(_ConcreteContext):
    """The ``fiberrl`` context: plain :class:`fiberrl.Process` jobs."""


_CONCRETE = {"spawn": SpawnContext, "fork": ForkContext, "forkserver": ForkServerContext,
             "fiberrl": FiberrlContext}
_concrete_contexts: dict = {}


def concrete_context(method: str) -> FiberContext:
    """The one context of start method ``method`` (``ValueError`` for an unknown name).

    A library may add its own context to ``_concrete_contexts``, as it would to the
    stdlib's table (loky does): it is found by name here too."""
    ctx = _concrete_contexts.get(method)
    if ctx is None:
        if method not in _CONCRETE:
            raise ValueError(f"cannot find context for {method!r}")
        ctx = _concrete_contexts.setdefault(method, _CONCRETE[method](method))
    return ctx


def _process_class(name: str) -> type:
    from . import process
    return getattr(process, name)

# The stdlib's names: every start method is a fiberrl context here, and every process a job.
BaseContext = _mp_context.BaseContext
ProcessError, BufferTooShort = errors.ProcessError, errors.BufferTooShort
TimeoutError, AuthenticationError = errors.TimeoutError, errors.AuthenticationError
# whether a stdlib process is being spawned (fiberrl's objects pickle at any time)
get_spawning_popen = _mp_context.get_spawning_popen
set_spawning_popen = _mp_context.set_spawning_popen
assert_spawning = _mp_context.assert_spawning


def __getattr__(name: str) -> Any:
    if name in ("Process", "SpawnProcess", "ForkProcess", "ForkServerProcess"):
        from . import process
        return getattr(process, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def register_with_stdlib(name: str = "fiberrl") -> str:
    """Make ``multiprocessing.get_context(name)`` return fiberrl's default context, and
    return ``name``.

    For libraries that take a context *name* rather than an object and resolve it
    with the stdlib, such as gymnasium's ``AsyncVectorEnv(context="fiberrl")``. It
    adds one entry to the stdlib's table of contexts in this process (it changes
    nothing else: ``multiprocessing``'s default context stays what it was).
    """
    if name in ("fork", "spawn", "forkserver"):
        raise ValueError(f"{name!r} is one of the stdlib's own start methods; pick another name")
    _mp_context._concrete_contexts[name] = default_context
    return name
