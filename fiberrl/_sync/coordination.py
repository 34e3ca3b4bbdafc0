"""The coordination service: serves ``fiberrl.Lock()``, ``Event()``, ``Value()``... .

The first such object a process creates starts a manager server in a daemon thread
of that process (no extra job), listening where the run's other jobs can reach it
and authenticated with the run's authkey. The objects live there; the handles
returned to the user are proxies, which pickle to any process of the run and reach
the service over fiberrl's wire (through the process's one listener). An object lives as long as some process holds a proxy to it,
and at most as long as the process that created it.

From other processes an operation is one request/reply on a connection (see the
README's figures); the threads of the process that created the service call the
objects of :mod:`.robust` directly, without a socket (they are thread-safe and tell
a thread of this process from a remote client). What happens when a process using
them dies is in :mod:`.robust`.
"""
from __future__ import annotations

import threading
from multiprocessing import process as mp_process
from typing import Any, Dict, Optional, Tuple

from . import cells, robust, robust_flags, semlock
from . import serving as managers

_LOCK_EXPOSED = semlock.LockProxy._exposed_
_SEMAPHORE_EXPOSED = semlock.SemaphoreProxy._exposed_


class EventProxy(managers.EventProxy):
    """``fiberrl.Event()``: shows its state in its repr, as ``multiprocessing.Event`` does."""

    def __repr__(self) -> str:
        state = "set" if self.is_set() else "unset"
        return f"<Event at {id(self):#x} {state}>"


#: typeid -> (factory, exposed methods, method_to_typeid, proxy type), as a manager registry
REGISTRY: Dict[str, Tuple[Any, Any, Any, type]] = {
    "Lock": (robust.Lock, _LOCK_EXPOSED, None, semlock.LockProxy),
    "RLock": (robust.RLock, _LOCK_EXPOSED, None, semlock.LockProxy),
    "Semaphore": (robust.Semaphore, _SEMAPHORE_EXPOSED, None, semlock.SemaphoreProxy),
    "BoundedSemaphore": (robust.BoundedSemaphore, _SEMAPHORE_EXPOSED, None,
                         semlock.SemaphoreProxy),
    "Condition": (robust.Condition, semlock.ConditionProxy._exposed_, None,
                  semlock.ConditionProxy),
    "Event": (robust_flags.Event, EventProxy._exposed_, None, EventProxy),
    "Barrier": (robust_flags.Barrier, managers.BarrierProxy._exposed_, None,
                managers.BarrierProxy),
    "ValueCell": (cells.ValueCell, cells.ValueCellProxy._exposed_, None,
                  cells.ValueCellProxy),
    "ArrayCell": (cells.ArrayCell, cells.ArrayCellProxy._exposed_, None,
                  cells.ArrayCellProxy),
}


class CoordinationService:
    """A manager server running in a thread of this process."""

    def __init__(self) -> None:
        self.server = managers.Server(REGISTRY, None, mp_process.current_process().authkey,
                                      "pickle")
        self.server.direct_calls = True   # this process's threads call its robust objects
        self.server.start_in_thread()

    @property
    def address(self) -> Any:
        """Where other processes reach this service."""
        return self.server.address

    def create(self, typeid: str, *args: Any, **kwargs: Any) -> Any:
        """Create a ``typeid`` object in the service and return a proxy to it."""
        ident, exposed = self.server.create(None, typeid, *args, **kwargs)
        token = managers.Token(typeid, self.server.address, ident)
        proxy_type = REGISTRY[typeid][3]
        try:
            return proxy_type(token, "pickle", authkey=self.server.authkey, exposed=exposed)
        finally:
            self.server.decref(None, ident)  # the proxy holds its own reference now


_service: Optional[CoordinationService] = None
_service_pid: Optional[int] = None
_service_lock = threading.Lock()


def service() -> CoordinationService:
    """This process's coordination service, started on first use."""
    global _service, _service_pid
    import os
    with _service_lock:
        if _service is None or _service_pid != os.getpid():
            _service, _service_pid = CoordinationService(), os.getpid()
        return _service


def create(typeid: str, *args: Any, **kwargs: Any) -> Any:
    """Create a ``typeid`` object in this process's coordination service."""
    return service().create(typeid, *args, **kwargs)
