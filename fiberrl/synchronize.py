"""``fiberrl.Lock``, ``RLock``, ``Semaphore``, ``BoundedSemaphore``, ``Condition``,
``Event`` and ``Barrier``: synchronization for job-backed processes on any backend.

Each object lives in the coordination service of the process that creates it
(:mod:`fiberrl._sync.coordination`); the returned proxy can be passed to any process of
the run (as a ``Process`` argument, through a ``Queue`` or ``Pipe``, to pool tasks)
and each operation is one request to the service. Semantics follow
``multiprocessing``; :mod:`fiberrl._sync.robust` says what happens when a process using
one dies. ``ctx`` is accepted as in the stdlib's classes (there is one kind of
context here).
"""
from __future__ import annotations

from typing import Any, Callable, Optional

from ._sync import coordination
from ._sync.semlock import RECURSIVE_MUTEX, SEMAPHORE, SemLock  # noqa: F401 (the stdlib's name)
from .errors import NegativeSemaphoreError

SEM_VALUE_MAX = __import__("_multiprocessing").SemLock.SEM_VALUE_MAX

__all__ = ["Lock", "RLock", "Semaphore", "BoundedSemaphore", "Condition", "Event", "Barrier",
           "RECURSIVE_MUTEX", "SEMAPHORE", "SEM_VALUE_MAX"]


def Lock(*, ctx: Any = None) -> Any:
    """A non-recursive lock (any process may release it, as in ``multiprocessing``)."""
    return coordination.create("Lock")


def RLock(*, ctx: Any = None) -> Any:
    """A recursive lock owned by the process and thread that acquired it."""
    return coordination.create("RLock")


def Semaphore(value: int = 1, *, ctx: Any = None) -> Any:
    """A counting semaphore with ``value`` permits."""
    _check_value(value)
    return coordination.create("Semaphore", value)


def BoundedSemaphore(value: int = 1, *, ctx: Any = None) -> Any:
    """A semaphore that cannot be released above ``value``."""
    _check_value(value)
    return coordination.create("BoundedSemaphore", value)


def Condition(lock: Any = None, *, ctx: Any = None) -> Any:
    """A condition variable over ``lock`` (a ``fiberrl.Lock``/``RLock``; a new RLock by default)."""
    return coordination.create("Condition", lock)


def Event(*, ctx: Any = None) -> Any:
    """A flag processes can set, clear and wait for."""
    return coordination.create("Event")


def Barrier(parties: int, action: Optional[Callable[[], Any]] = None,
            timeout: Optional[float] = None, *, ctx: Any = None) -> Any:
    """A barrier for ``parties`` processes; ``action`` runs in the service when it trips."""
    if not isinstance(parties, int) or parties < 1:
        raise ValueError(f"parties must be a positive int, got {parties!r}")
    return coordination.create("Barrier", parties, action, timeout)


def _check_value(value: Any) -> None:
    if not isinstance(value, int):
        raise TypeError(f"semaphore initial value must be an int, got {value!r}")
    if value < 0:
        raise NegativeSemaphoreError.of(value)
