"""``fiberrl.Value``, ``Array``, ``RawValue`` and ``RawArray``: two forms.

**One host** (the backend's jobs all run on this machine, ``shares_host``: the local
backend): the ctypes object lives in a shared-memory segment of its own
(:mod:`fiberrl.shm_ctypes`), as in the stdlib. ``get_obj()`` supports the buffer
protocol (``np.frombuffer(ctx.Array('d', 10).get_obj())``), and reads and writes
cost no request. The lock of ``Value``/``Array`` is a ``fiberrl.RLock``.

**Other hosts** (Slurm, Docker, Kubernetes backends): jobs may run on different
machines, so there is no shared memory to map: the ctypes object lives in a *cell* in the coordination service of the process that
created it (:mod:`fiberrl.coordination`), and every read or write is one request to
it. Types, conversions and overflow behave as the ctypes object does, because the
cell holds a real one.

``Value(..., lock=True)`` (the default) pairs the cell with a ``fiberrl.RLock``:
``get_lock()``, ``acquire()``/``release()``, ``with v:`` and ``get_obj()`` behave as
in the stdlib, and ``v.value`` takes the lock while it reads or writes, inside the
service, so it costs one request rather than three. ``lock=False`` and ``RawValue``
give the bare cell. Pointers and structures are not supported: they have no
meaning in another process's memory.
"""
from __future__ import annotations

import ctypes
from multiprocessing import sharedctypes as mp_sharedctypes
from typing import Any, Optional

from . import managers, shm_ctypes

typecode_to_type = mp_sharedctypes.typecode_to_type
SynchronizedBase = mp_sharedctypes.SynchronizedBase
Synchronized = shm_ctypes.Synchronized
SynchronizedString = shm_ctypes.SynchronizedString

__all__ = ["RawValue", "RawArray", "Value", "Array", "copy", "synchronized"]


def _ctype(typecode_or_type: Any) -> Any:
    ctype = mp_sharedctypes.typecode_to_type.get(typecode_or_type, typecode_or_type)
    if not (isinstance(ctype, type) and issubclass(ctype, ctypes._SimpleCData)):
        raise TypeError(f"fiberrl.Value/Array hold simple ctypes types (a typecode such as 'i' "
                        f"or 'd', or a type such as ctypes.c_double), not {typecode_or_type!r}")
    return ctype


def _resolve_lock(lock: Any) -> Any:
    from . import robust
    referent = managers.local_referent(lock)
    return referent if isinstance(referent, (robust.Lock, robust.RLock)) else None


class _Cell:
    def __init__(self, lock: Any) -> None:
        self._lock_proxy = lock  # keeps the lock alive while the cell lives
        self._lock = _resolve_lock(lock) if lock is not None else None

    def _guard(self, locked: bool):
        return _Locked(self._lock if locked else None)


class _Locked:
    def __init__(self, lock: Any) -> None:
        self._lock = lock

    def __enter__(self) -> None:
        if self._lock is not None:
            self._lock.acquire()

    def __exit__(self, *exc: Any) -> None:
        if self._lock is not None:
            self._lock.release()


class ValueCell(_Cell):
    """Server side: one ctypes value, optionally guarded by a lock of the same service."""

    def __init__(self, typecode_or_type: Any, args: tuple, lock: Any = None) -> None:
        super().__init__(lock)
        self._obj = _ctype(typecode_or_type)(*args)

    def get(self, locked: bool = False) -> Any:
        """The value (taking the lock first if ``locked``)."""
        with self._guard(locked):
            return self._obj.value

    def set(self, value: Any, locked: bool = False) -> None:
        """Store ``value``."""
        with self._guard(locked):
            self._obj.value = value

    def has_lock(self) -> bool:
        """Whether the service can take the value's lock itself."""
        return self._lock is not None

    def __repr__(self) -> str:
        return f"{type(self._obj).__name__}({self._obj.value!r})"


class ArrayCell(_Cell):
    """Server side: one ctypes array, optionally guarded by a lock of the same service."""

    def __init__(self, typecode_or_type: Any, size_or_initializer: Any, lock: Any = None) -> None:
        super().__init__(lock)
        ctype = _ctype(typecode_or_type)
        if isinstance(size_or_initializer, int):
            self._obj = (ctype * size_or_initializer)()
        else:
            items = list(size_or_initializer)
            self._obj = (ctype * len(items))(*items)

    def length(self) -> int:
        """The number of elements."""
        return len(self._obj)

    def getitem(self, key: Any, locked: bool = False) -> Any:
        """``array[key]`` (an element, or a list/bytes for a slice)."""
        with self._guard(locked):
            return self._obj[key]

    def setitem(self, key: Any, value: Any, locked: bool = False) -> None:
        """``array[key] = value``."""
        with self._guard(locked):
            self._obj[key] = value

    def getattr(self, name: str, locked: bool = False) -> Any:
        """``value`` or ``raw`` of a char array."""
        if name not in ("value", "raw"):
            raise AttributeError(name)
        with self._guard(locked):
            return getattr(self._obj, name)

    def setattr(self, name: str, value: Any, locked: bool = False) -> None:
        """Set ``value`` or ``raw`` of a char array."""
        if name not in ("value", "raw"):
            raise AttributeError(name)
        with self._guard(locked):
            setattr(self._obj, name, value)

    def has_lock(self) -> bool:
        """Whether the service can take the array's lock itself."""
        return self._lock is not None

    def __repr__(self) -> str:
        return f"{type(self._obj).__name__}({self._obj[:]!r})"


def _char_array_attribute(name: str, doc: str) -> property:
    """``value`` or ``raw`` of a shared char array, read and written through the
    class's ``_cell_call(method, *args)``."""
    return property(lambda self: self._cell_call("getattr", name),
                    lambda self, new: self._cell_call("setattr", name, new), doc=doc)


class ValueCellProxy(managers.BaseProxy):
    """A bare shared value (``RawValue``, ``Value(lock=False)``, ``Value.get_obj()``)."""

    _exposed_ = ("get", "set", "has_lock", "__repr__")

    @property
    def value(self) -> Any:
        """The shared value."""
        return self._callmethod("get")

    @value.setter
    def value(self, new: Any) -> None:
        self._callmethod("set", (new,))

    def __repr__(self) -> str:
        return f"<fiberrl shared {self._callmethod('__repr__')}>"


class ArrayCellProxy(managers.BaseProxy):
    """A bare shared array (``RawArray``, ``Array(lock=False)``, ``Array.get_obj()``)."""

    _exposed_ = ("length", "getitem", "setitem", "getattr", "setattr", "has_lock", "__repr__")

    def __len__(self) -> int:
        return self._callmethod("length")

    def __getitem__(self, key: Any) -> Any:
        return self._callmethod("getitem", (key,))

    def __setitem__(self, key: Any, value: Any) -> None:
        self._callmethod("setitem", (key, value))

    def __iter__(self):
        return iter(self._callmethod("getitem", (slice(None),)))

    def _cell_call(self, method: str, *args: Any) -> Any:
        return self._callmethod(method, args)

    value = _char_array_attribute("value", "A char array's value (bytes up to the first NUL).")
    raw = _char_array_attribute("raw", "A char array's raw bytes.")

    def __repr__(self) -> str:
        return f"<fiberrl shared {self._callmethod('__repr__')}>"


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
    value = _char_array_attribute("value", "A char array's value (read under the lock).")
    raw = _char_array_attribute("raw", "A char array's raw bytes (read under the lock).")

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


def RawValue(typecode_or_type: Any, *args: Any) -> Any:
    """A shared value without a lock."""
    from . import coordination
    ctype = _ctype(typecode_or_type)
    if one_host():
        return shm_ctypes.raw_value(ctype, args)
    return coordination.create("ValueCell", typecode_or_type, args)


def RawArray(typecode_or_type: Any, size_or_initializer: Any) -> Any:
    """A shared array without a lock."""
    from . import coordination
    ctype = _ctype(typecode_or_type)
    if one_host():
        return shm_ctypes.raw_array(ctype, size_or_initializer)
    return coordination.create("ArrayCell", typecode_or_type, size_or_initializer)


def Value(typecode_or_type: Any, *args: Any, lock: Any = True, ctx: Any = None) -> Any:
    """A shared value; with a lock (``get_lock()``) unless ``lock=False``."""
    from . import coordination
    _ctype(typecode_or_type)
    lock = _lock_for(lock)
    if lock is None:
        return RawValue(typecode_or_type, *args)
    if one_host():
        return shm_ctypes.synchronized(RawValue(typecode_or_type, *args), lock)
    return SynchronizedValue(coordination.create("ValueCell", typecode_or_type, args, lock), lock)


def Array(typecode_or_type: Any, size_or_initializer: Any, *, lock: Any = True,
          ctx: Any = None) -> Any:
    """A shared array; with a lock (``get_lock()``) unless ``lock=False``."""
    from . import coordination
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
    ctypes value or array; a server-backed cell does not say its type, so not those)."""
    if isinstance(obj, ctypes._SimpleCData):
        return RawValue(_ctype_of(obj), obj.value)
    return RawArray(_ctype_of(obj), obj[:])


def _ctype_of(obj: Any) -> Any:
    if shm_ctypes.is_shared(obj):
        return obj._fiberrl_ctype
    if isinstance(obj, ctypes.Array):
        return obj._type_
    if isinstance(obj, ctypes._SimpleCData):
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
