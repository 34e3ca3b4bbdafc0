"""The server side of ``Value``/``Array`` across hosts: cells and their proxies.

A cell holds a real ctypes object inside the coordination service
(:mod:`.coordination`) of the process that created it; its proxy reads and writes it
with one request each, taking the cell's lock (a robust ``RLock`` of the same
service) inside the service when asked to. :mod:`fiberrl.sharedctypes` wraps these for
users, and uses shared memory instead when every job shares this host.
"""
from __future__ import annotations

import ctypes
from multiprocessing import sharedctypes as mp_sharedctypes
from typing import Any

from . import robust
from . import serving as managers


def ctype_of_code(typecode_or_type: Any) -> Any:
    """The simple ctypes type of a typecode or type; ``TypeError`` for anything else."""
    ctype = mp_sharedctypes.typecode_to_type.get(typecode_or_type, typecode_or_type)
    if not (isinstance(ctype, type) and issubclass(ctype, ctypes._SimpleCData)):
        raise TypeError(f"fiberrl.Value/Array hold simple ctypes types (a typecode such as 'i' "
                        f"or 'd', or a type such as ctypes.c_double), not {typecode_or_type!r}")
    return ctype


def _resolve_lock(lock: Any) -> Any:
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
        self._obj = ctype_of_code(typecode_or_type)(*args)

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
        ctype = ctype_of_code(typecode_or_type)
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


def char_array_attribute(name: str, doc: str) -> property:
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

    value = char_array_attribute("value", "A char array's value (bytes up to the first NUL).")
    raw = char_array_attribute("raw", "A char array's raw bytes.")

    def __repr__(self) -> str:
        return f"<fiberrl shared {self._callmethod('__repr__')}>"


