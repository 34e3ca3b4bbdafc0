"""Managers: objects that live in a server job, used from anywhere through proxies.

``fiberrl.managers`` is CPython's ``multiprocessing.managers`` with three changes:

- the server is a fiberrl job (``BaseManager.start`` uses fiberrl's ``Process`` and
  ``Pipe``), so it runs on whatever backend is configured;
- it listens at an address other jobs can reach (its process's one listener, on the
  backend's listen host, unless the user chose an address), so proxies work when
  passed to processes on other machines;
- connections are streams of fiberrl's one wire: both sides prove the manager's
  authkey (by default the run's secret, every job's ``current_process().authkey``)
  and every message after that is signed, so nothing from a peer without the key is
  unpickled at any time of a connection; a server that is gone surfaces as
  ``ManagerConnectionError``.

Arguments and results travel with cloudpickle (so lambdas and ``__main__`` objects
work), and the synchronization types of :class:`SyncManager` are the robust ones of
:mod:`fiberrl._sync.robust`: a lock held by a process that dies is released. The
machinery lives in :mod:`fiberrl._sync`; this module is the public surface.
"""
from __future__ import annotations

from multiprocessing import managers as _mp_managers
from typing import Any

from ._sync import robust as _robust
from ._sync import robust_flags as _robust_flags
from ._sync.connections import open_connection
from ._sync.serving import (AcquirerProxy, Array, ArrayProxy, AutoProxy, BarrierProxy,
                            BaseListProxy, BaseManager, BasePoolProxy, BaseProxy,
                            ClientFactory, ConditionProxy, DictProxy, EventProxy, HAS_SHMEM,
                            IteratorProxy, ListProxy, MakeProxyType, Namespace,
                            NamespaceProxy, PoolProxy, ProcessLocalSet, RebuildProxy,
                            RemoteError, SemaphoreProxy, Server, State, Token, Value,
                            ValueProxy, all_methods, caller_hung_up, convert_to_error,
                            dispatch, local_referent, on_client_departure, public_methods,
                            rebuild_as_list, reduce_array, serving_connection)

__all__ = ["BaseManager", "SyncManager", "BaseProxy", "Token", "SharedMemoryManager"]

def _pool_factory(*args: Any, **kwargs: Any):
    from .pool import Pool
    return Pool(*args, **kwargs)


def _robust_types() -> dict:
    return {"Lock": _robust.Lock, "RLock": _robust.RLock, "Semaphore": _robust.Semaphore,
            "BoundedSemaphore": _robust.BoundedSemaphore, "Condition": _robust.Condition,
            "Event": _robust_flags.Event, "Barrier": _robust_flags.Barrier}


class SyncManager(BaseManager):
    """``multiprocessing.managers.SyncManager`` with a fiberrl server.

    ``dict``, ``list``, ``Namespace``, ``Value``, ``Array``, ``Queue``,
    ``JoinableQueue`` and ``Pool`` (a :class:`fiberrl.Pool`, whose workers are jobs
    too) as in the stdlib; ``Lock``, ``RLock``, ``Semaphore``, ``BoundedSemaphore``,
    ``Condition``, ``Event`` and ``Barrier`` are :mod:`fiberrl._sync.robust` objects.
    """


def _register_sync_types() -> None:
    robust_types = _robust_types()
    for typeid, (factory, exposed, method_to_typeid, proxytype) in \
            _mp_managers.SyncManager._registry.items():
        if typeid == "Pool":
            factory = _pool_factory
        factory = robust_types.get(typeid, factory)
        if typeid == "Pool":
            exposed = PoolProxy._exposed_
        if typeid in ("Semaphore", "BoundedSemaphore"):
            proxytype, exposed = SemaphoreProxy, SemaphoreProxy._exposed_
        SyncManager.register(typeid, factory, proxytype, exposed, method_to_typeid,
                             create_method=hasattr(_mp_managers.SyncManager, typeid))


_register_sync_types()


#: Uber Fiber's asynchronous manager names, found here as in ``fiber.managers``
_ASYNC_NAMES = ("AsyncManager", "AsyncProxy", "AsyncProxyResult")


def __getattr__(name: str) -> Any:
    """``SharedMemoryManager``/``SharedMemoryServer`` live in :mod:`fiberrl.shared_memory`
    (imported on first use, as the stdlib's managers expose them); ``AsyncManager``,
    ``AsyncProxy`` and ``AsyncProxyResult`` in :mod:`fiberrl.asyncproxy` (where Uber
    Fiber's programs look for them here)."""
    if name in ("SharedMemoryManager", "SharedMemoryServer"):
        from . import shared_memory
        return getattr(shared_memory, name)
    if name in _ASYNC_NAMES:
        from . import asyncproxy
        return getattr(asyncproxy, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
