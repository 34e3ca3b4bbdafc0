"""Synchronization objects that live in a server and survive the death of their users.

These are the objects behind ``fiberrl.Lock()``, ``fiberrl.Event()``... (served by the
coordination service of the process that created them) and behind
``Manager().Lock()``... (served by the manager's job). A remote client's call runs in
the server thread of its connection, so that thread's identity is the caller's
(one connection per client process and thread); a thread of the serving process
calls the coordination service's objects directly, and is known by its own ident
(negated: see :func:`_caller`).

What happens when a client process dies (its connection ends, or keepalive probes
go unanswered when its host is lost):

- ``Lock``/``RLock``: a lock it held is released (and logged), so waiters go on;
- ``Semaphore``/``BoundedSemaphore``: permits it acquired and had not released are
  given back;
- ``Condition``: the lock is released as above; a notification it was sent while
  waiting is passed on to the next waiter;
- ``Barrier``: if it was waiting, the barrier is broken, so the other parties get
  ``threading.BrokenBarrierError`` instead of waiting forever;
- ``Event``: nothing to undo.

A blocked call checks every :data:`WAIT_SLICE` seconds whether its own client hung
up, and then gives up, so a dead waiter holds nothing. ``Event`` and ``Barrier`` are
in :mod:`.robust_flags`, on the machinery here.
"""
from __future__ import annotations

import abc
import collections
import logging
import threading
import time
import weakref
from typing import Any, Callable, Deque, Dict, Optional, Tuple

from ..errors import ClientGone, NegativeSemaphoreError, NotOwnerError, UnlockedReleaseError
from . import serving as managers

logger = logging.getLogger(__name__)

#: seconds between checks, while a call blocks, that its client is still connected
WAIT_SLICE = 0.2


class _HandOff:
    """The holder of a lock released while clients waited, until one of them takes it."""

    def __repr__(self) -> str:
        return "HANDOFF"


HANDOFF = _HandOff()

_live: "weakref.WeakSet[Robust]" = weakref.WeakSet()
_live_lock = threading.Lock()


def _client_departed(ident: int) -> None:
    with _live_lock:
        objects = list(_live)
    for obj in objects:
        obj._client_departed(ident)


managers.on_client_departure(_client_departed)


def _caller() -> int:
    """Who calls: a remote client (the ident of the server thread serving it), or a
    thread of this process calling the object directly (its ident negated, so it is
    never taken for a serving thread's, whose client's departure releases its holds)."""
    ident = threading.get_ident()
    return ident if managers.serving_connection() is not None else -ident


def _deadline(block: bool, timeout: Optional[float]) -> Optional[float]:
    """Absolute deadline for ``acquire(block, timeout)``: None waits forever."""
    if not block:
        return time.monotonic()
    if timeout is None or timeout < 0:
        return None
    return time.monotonic() + timeout


class Robust:
    """Shared machinery: one internal condition, waits that notice a departed caller."""

    #: thread-safe, results are immutable: the threads of the serving process may call
    #: these objects directly (see :func:`fiberrl._sync.loopback.direct_referent`)
    direct_calls = True

    def __init__(self) -> None:
        self._state = threading.Condition(threading.Lock())
        with _live_lock:
            _live.add(self)

    def _wait_until(self, predicate: Callable[[], bool], deadline: Optional[float]) -> bool:
        """Wait (holding ``self._state``) until ``predicate()``; False at the deadline.

        Raises :class:`ClientGone` if the caller disconnected meanwhile.
        """
        while not predicate():
            remaining = WAIT_SLICE if deadline is None else min(WAIT_SLICE, deadline - time.monotonic())
            if remaining <= 0:
                return predicate()
            self._state.wait(remaining)
            if not predicate() and managers.caller_hung_up():
                raise ClientGone("the client of this call disconnected")
        return True

    def _client_departed(self, ident: int) -> None:
        """Undo what the departed client ``ident`` held (nothing by default)."""



class _Acquirable(Robust):
    """``with obj:`` acquires and releases (locks, semaphores, conditions)."""

    def __enter__(self) -> bool:
        return self.acquire()

    def __exit__(self, *exc: Any) -> None:
        self.release()


class _HandingOver(_Acquirable, abc.ABC):
    """A lock released while clients wait goes to one of them (:data:`HANDOFF`)."""

    _waiting = 0    # clients waiting in acquire
    _handoffs = 0   # hand-offs so far: a waiter takes only one made after it came

    def _await_handoff(self, deadline: Optional[float]) -> bool:
        """Wait (holding ``_state``, counted in ``_waiting``) until the lock is free or
        handed over since this waiter came. A hand-off this waiter cannot take (its
        client left, or a direct caller was interrupted) goes to the next waiter, or
        frees the lock."""
        came = self._handoffs
        self._waiting += 1
        try:
            return self._wait_until(
                lambda: self._free() or (self._handed_off() and self._handoffs != came),
                deadline)
        except BaseException:
            if self._handed_off():
                self._waiting -= 1
                self._unlock()
                self._waiting += 1
            raise
        finally:
            self._waiting -= 1

    @abc.abstractmethod
    def _free(self) -> bool:
        """Whether nobody holds the lock (holding ``_state``)."""

    @abc.abstractmethod
    def _handed_off(self) -> bool:
        """Whether the lock was handed to a waiter not yet woken (holding ``_state``)."""

    @abc.abstractmethod
    def _unlock(self) -> None:
        """Free the lock, or hand it to a waiter if there is one (holding ``_state``)."""


class Lock(_HandingOver):
    """A non-recursive lock; any client may release it, as with ``multiprocessing.Lock``.

    Released while clients wait, it is handed to one of them (:data:`HANDOFF`), so a
    thread of the serving process, whose calls take microseconds, cannot take it
    back again and again before a remote waiter, whose calls take a round trip, runs.
    """

    def __init__(self) -> None:
        super().__init__()
        self._locked = False
        self._holder: Any = None   # a caller, HANDOFF, or None
        self._waiting = 0

    def acquire(self, block: bool = True, timeout: Optional[float] = None) -> bool:
        """Acquire; ``block=False`` tries once, ``timeout`` bounds the wait."""
        with self._state:
            if not self._locked:
                self._locked, self._holder = True, _caller()
                return True
            if not self._await_handoff(_deadline(block, timeout)):
                return False
            self._locked, self._holder = True, _caller()
            return True

    def release(self) -> None:
        """Release (from any client); ``ValueError`` if it is not locked."""
        with self._state:
            if not self._locked or self._holder is HANDOFF:
                raise UnlockedReleaseError("semaphore or lock released too many times")
            self._unlock()

    def _free(self) -> bool:
        return not self._locked

    def _handed_off(self) -> bool:
        return self._locked and self._holder is HANDOFF

    def _unlock(self) -> None:
        if self._waiting:
            self._holder, self._handoffs = HANDOFF, self._handoffs + 1
            self._state.notify()
        else:
            self._locked, self._holder = False, None

    def locked(self) -> bool:
        """Whether the lock is held."""
        return self._locked

    def semlock_state(self) -> Tuple[int, int, int]:
        """``(free permits, permits the caller holds, most permits)``: what a
        ``multiprocessing`` ``_semlock`` answers (see :mod:`fiberrl.semlock`)."""
        with self._state:
            return (0 if self._locked else 1), int(self._locked and self._holder == _caller()), 1

    def _is_owned(self) -> bool:
        return self._locked and self._holder == _caller()

    def _release_save(self) -> Any:
        self.release()

    def _acquire_restore(self, saved: Any) -> None:
        self.acquire()

    def _client_departed(self, ident: int) -> None:
        with self._state:
            if self._locked and self._holder == ident:
                logger.warning("a process holding a lock disconnected; releasing the lock")
                self._unlock()

    def __repr__(self) -> str:
        return f"<fiberrl.robust.Lock {'locked' if self._locked else 'unlocked'}>"


class RLock(_HandingOver):
    """A recursive lock owned by the client (process and thread) that acquired it."""

    def __init__(self) -> None:
        super().__init__()
        self._owner: Any = None   # a caller, HANDOFF, or None
        self._count = 0
        self._waiting = 0

    def acquire(self, block: bool = True, timeout: Optional[float] = None) -> bool:
        """Acquire (again, if the caller owns it already)."""
        me = _caller()
        with self._state:
            if self._owner == me:
                self._count += 1
                return True
            if self._owner is not None and not self._await_handoff(_deadline(block, timeout)):
                return False
            self._owner, self._count = me, 1
            return True

    def release(self) -> None:
        """Release one level; :class:`NotOwnerError` (``AssertionError`` and
        ``RuntimeError``) if the caller does not own it."""
        with self._state:
            if self._owner != _caller():
                raise NotOwnerError("attempt to release recursive lock not owned by thread")
            self._count -= 1
            if self._count == 0:
                self._unlock()

    def _free(self) -> bool:
        return self._owner is None

    def _handed_off(self) -> bool:
        return self._owner is HANDOFF

    def _unlock(self) -> None:
        self._count = 0
        if self._waiting:
            self._owner, self._handoffs = HANDOFF, self._handoffs + 1
            self._state.notify()
        else:
            self._owner = None

    def _is_owned(self) -> bool:
        return self._owner == _caller()

    def semlock_state(self) -> Tuple[int, int, int]:
        """``(free permits, recursion level of the caller, most permits)``."""
        with self._state:
            mine = self._count if self._owner == _caller() else 0
            return (0 if self._owner is not None else 1), mine, 1

    def _release_save(self) -> int:
        with self._state:
            if self._owner != _caller():
                raise RuntimeError("cannot release un-acquired lock")
            count = self._count
            self._unlock()
            return count

    def _acquire_restore(self, count: int) -> None:
        self.acquire()
        with self._state:
            self._count = count

    def _client_departed(self, ident: int) -> None:
        with self._state:
            if self._owner == ident:
                logger.warning("a process holding an RLock disconnected; releasing the lock")
                self._unlock()

    def __repr__(self) -> str:
        return f"<fiberrl.robust.RLock owner={self._owner} count={self._count}>"


class Semaphore(_Acquirable):
    """A counting semaphore; permits a departed client still held are given back.

    Permits given back while clients wait are kept for them (``_reserved``, at most
    one per waiter), as a released lock is handed over: a client that comes later
    takes only the permits nobody waits for.
    """

    def __init__(self, value: int = 1) -> None:
        if value < 0:
            raise NegativeSemaphoreError.of(value)
        super().__init__()
        self._value = value
        self._held: Dict[int, int] = collections.Counter()
        self._waiting = 0
        self._reserved = 0
        self._reservations = 0   # releases that kept permits: a waiter takes them if it came before

    def acquire(self, block: bool = True, timeout: Optional[float] = None) -> bool:
        """Take one permit; ``block=False`` tries once, ``timeout`` bounds the wait."""
        with self._state:
            if self._value <= self._reserved:
                came, got = self._reservations, False
                self._waiting += 1
                try:
                    got = self._wait_until(lambda: self._value > self._reserved or (
                        self._reserved > 0 and self._reservations != came),
                        _deadline(block, timeout))
                finally:
                    self._waiting -= 1
                    if got and self._value <= self._reserved:
                        self._reserved -= 1          # one of the permits kept for waiters
                    self._reserved = min(self._reserved, self._waiting, self._value - int(got))
                    if not got and self._value > self._reserved:
                        self._state.notify()   # pass on a wake-up this waiter may have had
                if not got:
                    return False
            self._value -= 1
            self._held[_caller()] += 1
            return True

    def _give_back(self, n: int) -> None:
        """``n`` permits are free again: keep them for waiters first (holding ``_state``)."""
        self._value += n
        if self._waiting:   # (only acquire waits on ``_state``)
            self._reserved = min(self._waiting, self._reserved + n)
            self._reservations += 1
            self._state.notify(n)

    def release(self, n: int = 1) -> None:
        """Give back ``n`` permits."""
        if n < 1:
            raise ValueError("n must be one or more")
        with self._state:
            self._check_release(n)
            me = _caller()
            self._held[me] = max(0, self._held[me] - n)
            if not self._held[me]:
                del self._held[me]
            self._give_back(n)

    def _check_release(self, n: int) -> None:
        """Refuse a release (BoundedSemaphore); the plain semaphore accepts any."""

    def get_value(self) -> int:
        """The number of free permits."""
        return self._value

    def semlock_state(self) -> Tuple[int, int, int]:
        """``(free permits, permits the caller holds, most permits)``."""
        with self._state:
            return self._value, self._held.get(_caller(), 0), self._max_value()

    def _max_value(self) -> int:
        import _multiprocessing
        return _multiprocessing.SemLock.SEM_VALUE_MAX

    def _client_departed(self, ident: int) -> None:
        with self._state:
            held = self._held.pop(ident, 0)
            if held:
                logger.warning("a process holding %d semaphore permit(s) disconnected; "
                               "giving them back", held)
                self._give_back(held)

    def __repr__(self) -> str:
        return f"<fiberrl.robust.{type(self).__name__} value={self._value}>"


class BoundedSemaphore(Semaphore):
    """A semaphore that refuses to be released above its initial value."""

    def __init__(self, value: int = 1) -> None:
        super().__init__(value)
        self._initial = value

    def _max_value(self) -> int:
        return self._initial

    def _check_release(self, n: int) -> None:
        if self._value + n > self._initial:
            raise ValueError("Semaphore released too many times")


class Condition(_Acquirable):
    """A condition variable over a robust ``Lock`` or ``RLock`` (a new RLock by default)."""

    def __init__(self, lock: Any = None) -> None:
        super().__init__()
        if lock is not None and not isinstance(lock, (Lock, RLock)):
            referent = managers.local_referent(lock)
            if not isinstance(referent, (Lock, RLock)):
                raise TypeError("Condition needs a lock from the same service (fiberrl.Lock() "
                                "for fiberrl.Condition, manager.Lock() for manager.Condition)")
            self._lock_proxy = lock  # keeps the lock alive on the server
            lock = referent
        self._lock = lock if lock is not None else RLock()
        self._waiters: Deque[list] = collections.deque()  # [notified] flags, oldest first

    def acquire(self, block: bool = True, timeout: Optional[float] = None) -> bool:
        """Acquire the underlying lock."""
        return self._lock.acquire(block, timeout)

    def release(self) -> None:
        """Release the underlying lock."""
        self._lock.release()

    def wait(self, timeout: Optional[float] = None) -> bool:
        """Release the lock, wait for a notification (or the timeout), re-acquire it."""
        if not self._lock._is_owned():
            raise NotOwnerError("must acquire() condition before using wait()")
        waiter = [False]
        with self._state:
            self._waiters.append(waiter)
        saved = self._lock._release_save()
        try:
            deadline = None if timeout is None else time.monotonic() + max(0.0, timeout)
            with self._state:
                try:
                    notified = self._wait_until(lambda: waiter[0], deadline)
                    if notified and managers.caller_hung_up():
                        raise ClientGone("the client of this call disconnected")
                except BaseException:   # its client left, or a direct caller was interrupted
                    self._forget(waiter)
                    raise
                if not notified:
                    self._forget(waiter)
            return notified
        finally:
            self._lock._acquire_restore(saved)

    def _forget(self, waiter: list) -> None:
        """Drop ``waiter``; a notification it got but cannot use goes to the next one."""
        try:
            self._waiters.remove(waiter)
        except ValueError:
            pass
        if waiter[0]:
            self._notify_locked(1)

    def wait_for(self, predicate: Callable[[], bool], timeout: Optional[float] = None) -> Any:
        """Wait until ``predicate()`` is true (evaluated here, in the server)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        result = predicate()
        while not result:
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                break
            self.wait(remaining)
            result = predicate()
        return result

    def notify(self, n: int = 1) -> None:
        """Wake up to ``n`` waiters (the caller must hold the lock)."""
        if not self._lock._is_owned():
            raise NotOwnerError("cannot notify on un-acquired lock")
        with self._state:
            self._notify_locked(n)

    def _notify_locked(self, n: int) -> None:
        woken = 0
        while self._waiters and woken < n:
            self._waiters.popleft()[0] = True
            woken += 1
        if woken:
            self._state.notify_all()

    def notify_all(self) -> None:
        """Wake every waiter."""
        self.notify(len(self._waiters) or 1)
