"""ctypes objects in named shared memory: ``Value``/``Array`` when all jobs share a host.

On a backend whose jobs all run on this machine (``backend.shares_host``: the local
backend), :mod:`fiberrl.sharedctypes` puts each ``Value``/``Array`` in a POSIX
shared-memory segment of its own (``/dev/shm/fiberrl-<pid>-<random>``). The object
is a real ctypes object mapped on that segment, so ``get_obj()`` supports the buffer
protocol (``np.frombuffer`` works) and every process that receives it maps the same
memory: a write is seen by all at once, with no request to any server.

Data flow: the creating process makes the segment and maps it; pickling an object
sends ``(ctype, length, segment name, host)``; a job that unpickles it maps the
segment by name. The creating process unlinks the segment when its object is
garbage-collected or the process exits; as with the stdlib's ``SharedMemory``,
keep the object alive until the processes that use it have received it.
Unpickling on another host raises :class:`fiberrl.errors.SharedMemoryHostError`
naming both hosts: shared memory does not cross machines (there the server-backed
form of :mod:`fiberrl.sharedctypes` is used instead).
"""
from __future__ import annotations

import ctypes
import mmap
import os
import secrets
import socket
import weakref
from multiprocessing import sharedctypes as mp_sharedctypes
from typing import Any, Dict, Optional, Tuple

import _posixshmem

from .errors import SharedMemoryHostError

_types: Dict[Tuple[Any, Optional[int]], type] = {}


def _unlink(name: str) -> None:
    try:
        _posixshmem.shm_unlink(name)
    except FileNotFoundError:
        pass


class Segment:
    """A named shared-memory segment mapped in this process (created when ``name`` is None)."""

    def __init__(self, size: int, name: Optional[str] = None, host: Optional[str] = None) -> None:
        here = socket.gethostname()
        if host is not None and host != here:
            raise SharedMemoryHostError(
                f"shared memory segment {name} lives on host {host!r} and cannot be mapped on "
                f"host {here!r}: shared memory does not cross machines (run the jobs that share "
                "it on one host, or use a backend whose Value/Array are server-backed)")
        create = name is None
        if create:
            name = f"/fiberrl-{os.getpid()}-{secrets.token_hex(6)}"
        flags = os.O_RDWR | (os.O_CREAT | os.O_EXCL if create else 0)
        fd = _posixshmem.shm_open(name, flags, mode=0o600)
        try:
            length = max(size, 1)
            if create:
                os.ftruncate(fd, length)
            self.mmap = mmap.mmap(fd, length)
        finally:
            os.close(fd)
        self.name, self.size, self.host = name, size, here
        self.owner = create
        if create:
            weakref.finalize(self, _unlink, name)


def _shared_type(ctype: Any, length: Optional[int]) -> type:
    """A subclass of ``ctype`` (or ``ctype * length``) whose instances pickle by segment."""
    key = (ctype, length)
    cls = _types.get(key)
    if cls is None:
        base = ctype if length is None else ctype * length
        cls = type(base.__name__, (base,), {"__reduce__": _reduce, "__module__": __name__})
        _types[key] = cls
    return cls


def _reduce(obj: Any) -> tuple:
    return _attach, (obj._fiberrl_ctype, obj._fiberrl_length, obj._fiberrl_segment.name,
                     obj._fiberrl_segment.host)


def _map(ctype: Any, length: Optional[int], segment: Segment) -> Any:
    obj = _shared_type(ctype, length).from_buffer(segment.mmap)
    obj._fiberrl_segment = segment  # the segment (and its unlinking) lives as long as obj
    obj._fiberrl_ctype, obj._fiberrl_length = ctype, length
    return obj


def _attach(ctype: Any, length: Optional[int], name: str, host: str) -> Any:
    size = ctypes.sizeof(ctype) * (1 if length is None else length)
    return _map(ctype, length, Segment(size, name, host))


def is_shared(obj: Any) -> bool:
    """Whether ``obj`` is a ctypes object made by this module."""
    return hasattr(obj, "_fiberrl_segment")


def raw_value(ctype: Any, args: tuple) -> Any:
    """A ``ctype`` value in a new segment, initialised with ``args``."""
    obj = _map(ctype, None, Segment(ctypes.sizeof(ctype)))
    if args:
        copy_into(obj, ctype(*args))
    return obj


def copy_into(obj: Any, source: Any) -> None:
    """Copy the bytes of ctypes object ``source`` into ``obj`` (of the same size)."""
    ctypes.memmove(ctypes.addressof(obj), ctypes.addressof(source), ctypes.sizeof(obj))


def raw_array(ctype: Any, size_or_initializer: Any) -> Any:
    """A ``ctype`` array in a new segment: zeros of a length, or a copy of a sequence."""
    if isinstance(size_or_initializer, int):
        length, items = size_or_initializer, None
    else:
        items = list(size_or_initializer)
        length = len(items)
    obj = _map(ctype, length, Segment(ctypes.sizeof(ctype) * length))
    if items:
        obj[:] = items
    return obj


class _PicklableSync:
    """The stdlib's synchronized wrappers pickle only while a stdlib process is being
    spawned; these pickle anywhere (the object by segment, the lock as a proxy)."""

    def __reduce__(self):
        return type(self), (self._obj, self._lock)


class Synchronized(_PicklableSync, mp_sharedctypes.Synchronized):
    """``Value(...)`` in shared memory: ``value`` under its lock, ``get_obj()`` the ctypes object."""


class SynchronizedArray(_PicklableSync, mp_sharedctypes.SynchronizedArray):
    """``Array(...)`` in shared memory; ``get_obj()`` supports the buffer protocol."""


class SynchronizedString(_PicklableSync, mp_sharedctypes.SynchronizedString):
    """``Array('c', ...)`` in shared memory, with ``value`` and ``raw``."""


class SynchronizedStructure(_PicklableSync, mp_sharedctypes.SynchronizedBase):
    """``Value(SomeStructure, ...)`` in shared memory: each field is read or written
    under the lock, as with the stdlib's per-structure synchronized classes."""

    def __getattr__(self, name: str) -> Any:
        obj = self.__dict__.get("_obj")
        if obj is not None and name in _field_names(obj):
            with self._lock:
                return getattr(obj, name)
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def __setattr__(self, name: str, value: Any) -> None:
        obj = self.__dict__.get("_obj")
        if obj is not None and name in _field_names(obj):
            with self._lock:
                setattr(obj, name, value)
        else:
            object.__setattr__(self, name, value)


def _field_names(obj: Any) -> Tuple[str, ...]:
    return tuple(field[0] for field in obj._fields_)


def synchronized(obj: Any, lock: Any) -> Any:
    """Wrap a shared ctypes object with ``lock``, as the stdlib's ``synchronized`` does."""
    if isinstance(obj, ctypes._SimpleCData):
        return Synchronized(obj, lock)
    if isinstance(obj, ctypes.Array):
        if obj._type_ is ctypes.c_char:
            return SynchronizedString(obj, lock)
        return SynchronizedArray(obj, lock)
    if isinstance(obj, ctypes.Structure):
        return SynchronizedStructure(obj, lock)
    raise TypeError(f"cannot synchronize {type(obj).__name__}: only values and arrays of "
                    "simple ctypes types, and structures, are shared")
