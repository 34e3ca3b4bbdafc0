"""``fiberrl.Value``, ``Array``, ``RawValue`` and ``RawArray``: two forms.

**One host** (the backend's jobs all run on this machine, ``shares_host``: the local
backend): the ctypes object lives in a shared-memory segment of its own
(:mod:`fiberrl.shm_ctypes`), as in the stdlib. ``get_obj()`` supports the buffer
protocol (``np.frombuffer(ctx.Array('d', 10).get_obj())``), and reads and writes
cost no request. The lock of ``Value``/``Array`` is a ``fiberrl.RLock``.

**Other hosts** (Slurm, Docker, Kubernetes backends): jobs may run on different
machines, so there is no shared memory to map: the ctypes object lives in a *cell* in the coordination service of the process that
created it (:mod:`fiberrl._sync.coordination`), and every read or write is one request to
it. Types, conversions and overflow behave as the ctypes object does, because the
cell holds a real one.

``Value(..., lock=True)`` (the default) pairs the cell with a ``fiberrl.RLock``:
``get_lock()``, ``acquire()``/``release()``, ``with v:`` and ``get_obj()`` behave as
in the stdlib, and ``v.value`` takes the lock while it reads or writes, inside the
service, so it costs one request rather than three. ``lock=False`` and ``RawValue``
give the bare cell. A ``ctypes.Structure`` is a ``Value`` in shared memory only (one
host): a cell holds simple types and arrays of them. Pointers are not supported: they
have no meaning in another process's memory.
"""
from __future__ import annotations

import ctypes
from multiprocessing import sharedctypes as mp_sharedctypes
from typing import Any, Optional

from . import shm_ctypes
from ._sync.cells import ArrayCellProxy, ValueCellProxy, char_array_attribute
from ._sync.cells import ctype_of_code as _ctype

typecode_to_type = mp_sharedctypes.typecode_to_type
SynchronizedBase = mp_sharedctypes.SynchronizedBase
Synchronized = shm_ctypes.Synchronized
SynchronizedString = shm_ctypes.SynchronizedString

__all__ = ["RawValue", "RawArray", "Value", "Array", "copy", "synchronized"]


class _Synchronized:
    """A cell and its lock: ``get_lock``, ``get_obj``, ``acquire``/``release``, ``with``."""

    def __init__(self, cell: Any, lock: Any) -> None:
        self._cell = cell
        self._lock = lock
        self._service_locks = cell._callmethod("has_lock")

    def get_lock(self) -> Any:
        """The lock guarding the value."""
        return self._lock

    def get_obj(self) -> Any:
        """The bare shared object (its reads and writes do not take the lock)."""
        return self._cell

    def acquire(self, *args: Any) -> bool:
        """Acquire the lock."""
        return self._lock.acquire(*args)

    def release(self) -> None:
        """Release the lock."""
        self._lock.release()

    def __enter__(self) -> bool:
        return self._lock.__enter__()

    def __exit__(self, *exc: Any) -> None:
        self._lock.__exit__(*exc)

    def _call(self, method: str, *args: Any) -> Any:
        if self._service_locks:
            return self._cell._callmethod(method, (*args, True))
        with self._lock:
            return self._cell._callmethod(method, args)


class SynchronizedValue(_Synchronized):
    """``fiberrl.Value``: a shared value whose accesses take its lock."""

    @property
    def value(self) -> Any:
        """The shared value (read under the lock)."""
        return self._call("get")

    @value.setter
    def value(self, new: Any) -> None:
        self._call("set", new)

    def __repr__(self) -> str:
        return f"<fiberrl Synchronized wrapper for {self._cell!r}>"


class SynchronizedArray(_Synchronized):
    """``fiberrl.Array``: a shared array whose accesses take its lock."""

    def __len__(self) -> int:
        return self._cell._callmethod("length")

    def __getitem__(self, key: Any) -> Any:
        return self._call("getitem", key)

    def __setitem__(self, key: Any, value: Any) -> None:
        self._call("setitem", key, value)

    def __iter__(self):
        return iter(self[:])

    _cell_call = _Synchronized._call
    value = char_array_attribute("value", "A char array's value (read under the lock).")
    raw = char_array_attribute("raw", "A char array's raw bytes (read under the lock).")

    def __repr__(self) -> str:
        return f"<fiberrl Synchronized wrapper for {self._cell!r}>"


def _lock_for(lock: Any) -> Optional[Any]:
    if lock is False:
        return None
    if lock is True or lock is None:
        from .synchronize import RLock
        return RLock()
    if not hasattr(lock, "acquire"):
        raise AttributeError(f"{lock!r} has no method 'acquire'")
    return lock


def one_host() -> bool:
    """Whether every job of the configured backend runs on this machine, so that
    ``Value``/``Array`` live in shared memory (else in a coordination service)."""
    from .backends import default_backend
    return default_backend().shares_host


def _value_type(typecode_or_type: Any) -> Any:
    """The ctypes type of a ``Value``: a simple type, or on one host a ``Structure``."""
    if isinstance(typecode_or_type, type) and issubclass(typecode_or_type, ctypes.Structure):
        if not one_host():
            raise TypeError(f"a Value of structure {typecode_or_type.__name__} needs shared "
                            "memory, which jobs of this backend (on other hosts) do not share; "
                            "use a Value or an Array per field")
        return typecode_or_type
    return _ctype(typecode_or_type)


def RawValue(typecode_or_type: Any, *args: Any) -> Any:
    """A shared value without a lock."""
    from ._sync import coordination
    ctype = _value_type(typecode_or_type)
    if one_host():
        return shm_ctypes.raw_value(ctype, args)
    return coordination.create("ValueCell", typecode_or_type, args)


def RawArray(typecode_or_type: Any, size_or_initializer: Any) -> Any:
    """A shared array without a lock."""
    from ._sync import coordination
    ctype = _ctype(typecode_or_type)
    if one_host():
        return shm_ctypes.raw_array(ctype, size_or_initializer)
    return coordination.create("ArrayCell", typecode_or_type, size_or_initializer)


def Value(typecode_or_type: Any, *args: Any, lock: Any = True, ctx: Any = None) -> Any:
    """A shared value; with a lock (``get_lock()``) unless ``lock=False``."""
    from ._sync import coordination
    _value_type(typecode_or_type)
    lock = _lock_for(lock)
    if lock is None:
        return RawValue(typecode_or_type, *args)
    if one_host():
        return shm_ctypes.synchronized(RawValue(typecode_or_type, *args), lock)
    return SynchronizedValue(coordination.create("ValueCell", typecode_or_type, args, lock), lock)


def Array(typecode_or_type: Any, size_or_initializer: Any, *, lock: Any = True,
          ctx: Any = None) -> Any:
    """A shared array; with a lock (``get_lock()``) unless ``lock=False``."""
    from ._sync import coordination
    _ctype(typecode_or_type)
    lock = _lock_for(lock)
    if lock is None:
        return RawArray(typecode_or_type, size_or_initializer)
    if one_host():
        return shm_ctypes.synchronized(RawArray(typecode_or_type, size_or_initializer), lock)
    return SynchronizedArray(
        coordination.create("ArrayCell", typecode_or_type, size_or_initializer, lock), lock)


def copy(obj: Any) -> Any:
    """A new shared object (without a lock) holding a copy of ``obj``'s contents (a
    ctypes value, structure or array; a server-backed cell does not say its type, so
    not those)."""
    if isinstance(obj, ctypes._SimpleCData):
        return RawValue(_ctype_of(obj), obj.value)
    if isinstance(obj, ctypes.Structure):
        new = RawValue(_ctype_of(obj))
        shm_ctypes.copy_into(new, obj)
        return new
    return RawArray(_ctype_of(obj), obj[:])


def _ctype_of(obj: Any) -> Any:
    if shm_ctypes.is_shared(obj):
        return obj._fiberrl_ctype
    if isinstance(obj, ctypes.Array):
        return obj._type_
    if isinstance(obj, (ctypes._SimpleCData, ctypes.Structure)):
        return type(obj)
    raise TypeError(f"fiberrl.sharedctypes.copy takes a shared ctypes value or array, "
                    f"not {type(obj).__name__}")


def synchronized(obj: Any, lock: Any = None, ctx: Any = None) -> Any:
    """Wrap a shared value or array (from ``RawValue``/``RawArray``) with a lock
    (a new ``fiberrl.RLock`` by default)."""
    lock = _lock_for(lock if lock is not None else True)
    if shm_ctypes.is_shared(obj):
        return shm_ctypes.synchronized(obj, lock)
    if isinstance(obj, ValueCellProxy):
        return SynchronizedValue(obj, lock)
    if isinstance(obj, ArrayCellProxy):
        return SynchronizedArray(obj, lock)
    raise TypeError(f"cannot synchronize {type(obj).__name__}: pass an object made by "
                    "fiberrl.RawValue or fiberrl.RawArray")
