"""fiberrl: Python's ``multiprocessing`` API, with processes that run as cluster jobs.

Swap ``import multiprocessing as mp`` for ``import fiberrl as mp``: ``Process``,
``Queue``, ``JoinableQueue``, ``SimpleQueue`` and ``Pipe`` then run on the local
machine (the default), or on the backend chosen with ``fiberrl.init(backend=...)``.
Importing this package does no work; each name is resolved on first use.
"""
from __future__ import annotations

from typing import Any

from .context import FiberContext, default_context
from .errors import (AuthenticationError, BackendError, BufferTooShort, ConfigError,
                     ForgedMessageError, JobFailedError, ManagerConnectionError, OwnerGoneError,
                     PoolTerminatedError, ProcessError, SharedMemoryHostError,
                     TaskDeserializationError, TaskRetryError, TimeoutError)

__version__ = "0.1.0"

_CONTEXT_NAMES = [name for name in dir(FiberContext) if not name.startswith("_")]

__all__ = sorted(set(_CONTEXT_NAMES) | {"FiberContext", "JobFailedError", "ManagerConnectionError",
                                        "OwnerGoneError", "ConfigError", "BackendError",
                                        "ForgedMessageError", "SharedMemoryHostError",
                                        "PoolTerminatedError", "TaskRetryError",
                                        "TaskDeserializationError", "__version__"})


#: submodules reachable as attributes (``fiberrl.config.reset()``), imported on first use
_SUBMODULES = frozenset({"config", "backends", "connection", "context", "dummy", "heap",
                         "managers", "pool", "process", "queues", "reduction", "shared_memory",
                         "sharedctypes", "synchronize", "util"})


def __getattr__(name: str) -> Any:
    if name in _CONTEXT_NAMES:
        return getattr(default_context, name)
    if name in _SUBMODULES:
        import importlib
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module 'fiberrl' has no attribute {name!r}")


def __dir__() -> list:
    return sorted(set(globals()) | set(_CONTEXT_NAMES))
