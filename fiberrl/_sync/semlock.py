"""``._semlock`` on fiberrl's locks and semaphores: what the stdlib's own classes read.

The stdlib's ``multiprocessing.queues.Queue(ctx=...)`` (and so
``concurrent.futures.ProcessPoolExecutor``) builds its locks and semaphores from the
context it is given and then reads their kernel semaphore directly:
``full()`` is ``sem._semlock._is_zero()``, ``qsize()`` is
``maxsize - sem._semlock._get_value()``. fiberrl's locks and semaphores live in a
coordination service (:mod:`fiberrl.coordination`), so their ``_semlock`` is a
:class:`SemLockView`: each answer is one request to the service, read under the
object's own lock there, so it is true at the moment it is asked.

The view answers what ``_multiprocessing.SemLock`` answers: ``kind``,
``maxvalue``, ``_is_zero()``, ``_get_value()``, ``_count()``, ``_is_mine()``,
``acquire()``, ``release()``. It has no ``handle`` or ``name``: there is no
kernel semaphore, and the object may be used from other hosts.
"""
from __future__ import annotations

from typing import Any, Optional, Tuple

from . import serving as managers

#: ``_multiprocessing.SemLock`` kinds
RECURSIVE_MUTEX, SEMAPHORE = 0, 1

_STATE_EXPOSED = ("semlock_state",)


class SemLockView:
    """The ``_semlock`` of a fiberrl lock or semaphore (answers from its service)."""

    def __init__(self, proxy: Any, kind: int) -> None:
        self._proxy = proxy
        self.kind = kind

    def _state(self) -> Tuple[int, int, int]:
        return self._proxy._callmethod("semlock_state")

    @property
    def maxvalue(self) -> int:
        """The most permits the object can hold (1 for a lock)."""
        return self._state()[2]

    def _is_zero(self) -> bool:
        """True when no permit is free (a lock that is held, a semaphore at zero)."""
        return self._state()[0] == 0

    def _get_value(self) -> int:
        """The number of free permits."""
        return self._state()[0]

    def _count(self) -> int:
        """Permits (or recursion levels) held by the calling process and thread."""
        return self._state()[1]

    def _is_mine(self) -> bool:
        """Whether the calling process and thread hold the object."""
        return self._state()[1] > 0

    def acquire(self, block: bool = True, timeout: Optional[float] = None) -> bool:
        """Take a permit, as the object's own ``acquire``."""
        return self._proxy.acquire(block, timeout)

    def release(self) -> None:
        """Give a permit back, as the object's own ``release``."""
        self._proxy.release()

    def _after_fork(self) -> None:
        """Nothing to reset: the state lives in the service, not in this process."""

    def __repr__(self) -> str:
        return f"<fiberrl SemLockView kind={self.kind} of {self._proxy!r}>"


class _BlockAcquire:
    """``acquire`` with the signature of the stdlib's ``SemLock.acquire`` (its first
    argument is ``block``; a manager's lock proxy calls it ``blocking``)."""

    def acquire(self, block: bool = True, timeout: Optional[float] = None) -> bool:
        """Take the lock or a permit; False if ``block`` is false or ``timeout`` passes
        first."""
        args = (block,) if timeout is None else (block, timeout)
        return self._callmethod("acquire", args)   # type: ignore[attr-defined]


class SemLock(_BlockAcquire, managers.AcquirerProxy):
    """The base of fiberrl's lock and semaphore proxies, under the stdlib's name for the
    base of its own (``multiprocessing.synchronize.SemLock``: loky patches it)."""

    _exposed_ = managers.AcquirerProxy._exposed_ + _STATE_EXPOSED


class LockProxy(SemLock):
    """``fiberrl.Lock()``/``RLock()``: a lock with the stdlib's ``_semlock``."""

    @property
    def _semlock(self) -> SemLockView:
        kind = RECURSIVE_MUTEX if self._token.typeid == "RLock" else SEMAPHORE
        return SemLockView(self, kind)


class SemaphoreProxy(SemLock, managers.SemaphoreProxy):
    """``fiberrl.Semaphore()``/``BoundedSemaphore()`` with the stdlib's ``_semlock``."""

    _exposed_ = managers.SemaphoreProxy._exposed_ + _STATE_EXPOSED

    @property
    def _semlock(self) -> SemLockView:
        return SemLockView(self, SEMAPHORE)


class ConditionProxy(_BlockAcquire, managers.ConditionProxy):
    """``fiberrl.Condition()``: its ``acquire`` is its lock's, as in the stdlib."""
