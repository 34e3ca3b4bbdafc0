"""The one serialization seam of fiberrl.

Objects become a list of frames: ``[pickle_stream, buffer_1, buffer_2, ...]``.
Pickle protocol 5 hands large contiguous buffers (numpy arrays, ``PickleBuffer``
objects, the storages of CPU torch tensors: :mod:`fiberrl.reduction_torch`) to a
callback instead of copying them into the stream, so they travel as out-of-band frames
of the wire and are rebuilt without a copy.

Plain data (bytes, str, numbers, numpy arrays) goes through the C pickler; anything
else through cloudpickle, so lambdas, closures and classes defined in ``__main__``,
a REPL or a notebook travel by value.

Never call :func:`loads` on frames that were not authenticated first: unpickling is
code execution (see :mod:`fiberrl._wire.framing`).
"""
from __future__ import annotations

import copyreg
import io
import pickle
import socket
import sys
import types
from collections import ChainMap
from typing import Any, List, Optional, Sequence, Union

import cloudpickle
from multiprocessing import connection as _mp_connection

from . import reduction_main

__all__ = ["dumps", "dumps_data", "loads", "Frames", "OUT_OF_BAND_MIN_BYTES",
           "describe_unpicklable", "ForkingPickler", "register", "dump", "DupFd", "sendfds",
           "recvfds", "send_handle", "recv_handle"]

Frames = List[Union[bytes, memoryview, pickle.PickleBuffer]]

#: Buffers at least this large travel as their own frame; smaller ones stay in-band.
OUT_OF_BAND_MIN_BYTES = 64 * 1024

#: pickled in-band whatever their size (``bytearray`` too: only ``PickleBuffer`` objects
#: reach pickle 5's buffer callback)
_PLAIN_TYPES = frozenset((bytes, bytearray, str, int, float, bool, type(None), complex))

#: a tuple or list of at most this many built-in scalars is seen as plain at once (a
#: longer one costs the scan's budget less than looking at every item)
_FLAT_MAX = 16

#: the types pickled in-band with nothing to look inside: :data:`_PLAIN_TYPES`, and
#: each numpy scalar type once :func:`_cached_numpy_kind` has seen it, so that a
#: message such as gymnasium's ``("step", np.int64(1))`` is seen as plain in one C
#: call from its second sending on
_SCALARS = set(_PLAIN_TYPES)


#: numpy types seen so far, by what they are for pickling (see :func:`_numpy_kind`)
_NUMPY_KINDS: dict = {}
_NOT_PLAIN, _SCALAR, _MAY_HOLD_BUFFERS, _ARRAY = 0, 1, 2, 3


def _numpy_kind(kind: type) -> int:
    """What a type is for pickling, if it is one of numpy's own (a subclass from the
    user's code may need cloudpickle; numpy is not imported here): :data:`_SCALAR`
    for a scalar type (``np.int64``...: reduced without a buffer), :data:`_ARRAY` for
    an array type (plain unless its items are Python objects), :data:`_MAY_HOLD_BUFFERS`
    for numpy's other types (a ufunc, ``finfo``...), :data:`_NOT_PLAIN` for the rest."""
    if kind.__module__ != "numpy":
        return _NOT_PLAIN
    names = {base.__name__ for base in kind.__mro__ if base.__module__ == "numpy"}
    if "generic" in names:
        return _SCALAR
    return _ARRAY if "ndarray" in names else _MAY_HOLD_BUFFERS


def _cached_numpy_kind(kind: type) -> int:
    """:func:`_numpy_kind`, worked out once per type."""
    found = _NUMPY_KINDS.get(kind)
    if found is None:
        found = _NUMPY_KINDS[kind] = _numpy_kind(kind)
        if found == _SCALAR:
            _SCALARS.add(kind)
    return found


def _is_plain(obj: Any, budget: int = 64) -> bool:
    """True for data the C pickler handles alone: built-in scalars, numpy scalars and
    plain arrays, and small tuples, lists and dicts of them (at most ``budget`` items
    looked at)."""
    return _plain_kind(obj, budget) != _NOT_PLAIN


def _plain_kind(obj: Any, budget: int = 64) -> int:
    """:data:`_NOT_PLAIN` when ``obj`` is not plain data (see :func:`_is_plain`);
    :data:`_MAY_HOLD_BUFFERS` when it is and holds a numpy array (whose data pickle may
    hand out of band) or another numpy object; :data:`_SCALAR` when it holds only
    built-in and numpy scalars, so pickling needs no buffer callback."""
    state = [budget, _SCALAR]
    return state[1] if _plain_within(obj, state) else _NOT_PLAIN


def _plain_within(obj: Any, state: list) -> bool:
    """Whether ``obj`` is plain data; ``state`` is ``[items left to look at, kind so
    far]``, the kind raised to :data:`_MAY_HOLD_BUFFERS` on the first numpy object that
    is not a scalar."""
    kind = type(obj)
    if kind in _SCALARS:
        return True
    if kind is tuple or kind is list:
        state[0] -= len(obj)
        if state[0] < 0:
            return False
        for item in obj:
            if type(item) not in _SCALARS and not _plain_within(item, state):
                return False
        return True
    if kind is dict:
        state[0] -= 2 * len(obj)
        if state[0] < 0:
            return False
        for key, value in obj.items():
            if type(key) not in _PLAIN_TYPES:
                return False
            if type(value) not in _SCALARS and not _plain_within(value, state):
                return False
        return True
    found = _cached_numpy_kind(kind)
    if found == _NOT_PLAIN or (found == _ARRAY and obj.dtype.hasobject):
        return False
    if found != _SCALAR:   # an array, or a numpy object not known to hold none
        state[1] = _MAY_HOLD_BUFFERS
    return True


_DYNAMIC_CODE = "<dynamic-code>"


def _code_reduce_keeping_filename(code: types.CodeType) -> Any:
    """cloudpickle's reduction of a code object, with its real file name put back.

    cloudpickle 3.1.3 replaces the file name of code sent by value with
    ``"<dynamic-code>"``; a job's traceback then names no file and shows no source
    line, for every function from ``__main__`` or a notebook. Users read those
    tracebacks, so fiberrl keeps the name (the payload is then not byte-identical
    across machines, which fiberrl never relies on).
    """
    rebuild, args = cloudpickle.Pickler.dispatch_table[types.CodeType](code)
    return rebuild, tuple(code.co_filename if type(arg) is str and arg == _DYNAMIC_CODE else arg
                          for arg in args)


def _reduce_stdlib_connection(conn: Any) -> Any:
    """A stdlib ``Connection`` travels by lending its descriptor on this host, and is
    relayed to a job of a backend that does not share this host."""
    from ._services.fd_sharing import lend, receiver
    if conn.closed:
        raise OSError(f"cannot send a closed {type(conn).__name__}")
    token, same_host = receiver()
    if not same_host:
        from ._services.connection_relay import rebuild, relay
        return rebuild, (*relay(conn, token), conn.readable, conn.writable)
    return _rebuild_stdlib_connection, (*lend(conn.fileno(), "a stdlib Connection"),
                                        conn.readable, conn.writable)


def _rebuild_stdlib_connection(address: Any, ticket: str, readable: bool, writable: bool) -> Any:
    from ._services.fd_sharing import borrow
    # the class bound at import: where ``multiprocessing`` is later mapped to fiberrl,
    # the name ``multiprocessing.connection.Connection`` leads to fiberrl's pipe end
    return _mp_connection.Connection(borrow(address, ticket), readable, writable)


def _reduce_socket(sock: Any) -> Any:
    """A socket travels by lending its descriptor (same host only), as with the stdlib."""
    from ._services.fd_sharing import lend
    if sock.fileno() < 0:
        raise OSError("cannot send a closed socket")
    return _rebuild_socket, (*lend(sock.fileno(), "a socket"), sock.family, sock.type,
                             sock.proto)


def _rebuild_socket(address: Any, ticket: str, family: int, kind: int, proto: int) -> Any:
    from ._services.fd_sharing import borrow
    return socket.socket(family, kind, proto, fileno=borrow(address, ticket))


#: reducers added with :func:`register` (the stdlib's ``ForkingPickler.register``), and
#: the stdlib's connections and sockets, whose descriptor must be lent, not copied
_EXTRA_REDUCERS: dict = {_mp_connection.Connection: _reduce_stdlib_connection,
                         socket.socket: _reduce_socket}


#: torch's own reducers, which share tensors by file descriptor (not taken: ``register``)
_TORCH_SHARING_MODULE = "torch.multiprocessing.reductions"

#: torch tensors' and storages' reducers (:mod:`fiberrl.reduction_torch`), added once
#: torch has been imported; fiberrl itself never imports it
_TORCH_REDUCERS: dict = {}


def _add_torch_reducers() -> None:
    if not _TORCH_REDUCERS and "torch" in sys.modules:
        from .reduction_torch import reducers
        _TORCH_REDUCERS.update(reducers())


class _Pickler(cloudpickle.Pickler):
    """cloudpickle, keeping the file names of code it sends by value; functions of the
    main script share one namespace in the receiving job (:mod:`fiberrl.reduction_main`)."""

    dispatch_table = ChainMap(_EXTRA_REDUCERS, _TORCH_REDUCERS,
                              {types.CodeType: _code_reduce_keeping_filename},
                              cloudpickle.Pickler.dispatch_table)

    def _dynamic_function_reduce(self, func: Any) -> Any:
        reduced = super()._dynamic_function_reduce(func)
        if not reduction_main.is_main_function(func):
            return reduced
        _make, newargs, state, items, pairs, _setstate = reduced
        return (reduction_main.make_function, newargs, state, items, pairs,
                reduction_main.set_function_state)


def _cloudpickle(obj: Any, buffer_callback: Any = None) -> bytes:
    _add_torch_reducers()
    sink = io.BytesIO()
    _Pickler(sink, protocol=5, buffer_callback=buffer_callback).dump(obj)
    return sink.getvalue()


def dumps(obj: Any) -> Frames:
    """Serialize ``obj`` to frames; large buffers are separate, uncopied frames."""
    kind = type(obj)
    if kind in _SCALARS or ((kind is tuple or kind is list) and len(obj) <= _FLAT_MAX
                            and _SCALARS.issuperset(map(type, obj))):
        # the common small message (a step command, a few arguments): no buffers to
        # keep out, looked at in one C call
        return [pickle.dumps(obj, 5)]
    plain = _plain_kind(obj)
    if plain == _SCALAR:   # plain data with nothing to keep out of band: a chunk of
        # scalars, arguments, a step command, an env's reply
        return [pickle.dumps(obj, protocol=5)]
    buffers: Frames = []

    def keep_out_of_band(buf: pickle.PickleBuffer) -> bool:
        view = buf.raw()
        if view.nbytes < OUT_OF_BAND_MIN_BYTES:
            return True  # serialize in-band
        buffers.append(view)
        return False

    if plain:
        stream = pickle.dumps(obj, protocol=5, buffer_callback=keep_out_of_band)
    else:
        stream = _cloudpickle(obj, keep_out_of_band)
    return [stream, *buffers]


def dumps_inband(obj: Any) -> bytes:
    """One pickle holding everything (for byte-stream connections such as the managers').

    Plain pickle first (the managers' small messages spend most of their time here);
    cloudpickle when pickle cannot, or when the pickle names ``__main__``, whose
    functions and classes the receiving job could not import by name.
    """
    try:
        data = pickle.dumps(obj, 5)
    except (pickle.PicklingError, AttributeError, TypeError):
        return _cloudpickle(obj)
    # one scan finds "__main__" and "__mp_main__" (``find``: ``in`` on bytes first tries
    # the needle as an int and formats a TypeError, which costs more than the pickling)
    if data.find(b"main__") != -1:
        return _cloudpickle(obj)
    return data


class _DataPickler(_Pickler):
    """cloudpickle for data: classes from ``__main__`` travel by value, functions do not."""

    def reducer_override(self, obj: Any) -> Any:
        if isinstance(obj, types.FunctionType) and (
                obj.__module__ in ("__main__", "__mp_main__", None) or "<" in obj.__qualname__):
            raise pickle.PicklingError(
                f"function {obj.__qualname__!r} cannot be sent back by value: results carry "
                "data; return a function importable by name, or data describing it")
        return super().reducer_override(obj)


#: the C pickler's reducers: the torch ones (once loaded), then the standard library's
_C_DISPATCH = ChainMap(_TORCH_REDUCERS, copyreg.dispatch_table)


def _c_pickle(obj: Any, buffer_callback: Any) -> bytes:
    """The C pickler's stream for ``obj``, tensors included (pool results are often
    tensors; torch's own reduction would ``torch.save`` them into the stream)."""
    if not _TORCH_REDUCERS:
        return pickle.dumps(obj, protocol=5, buffer_callback=buffer_callback)
    sink = io.BytesIO()
    pickler = pickle.Pickler(sink, protocol=5, buffer_callback=buffer_callback)
    pickler.dispatch_table = _C_DISPATCH
    pickler.dump(obj)
    return sink.getvalue()


def dumps_data(obj: Any) -> Frames:
    """Like :func:`dumps` for results: functions must be importable by name.

    The stdlib cannot return a lambda from a pool task, and CPython's own tests
    insist; results are data, so fiberrl keeps that rule while still accepting
    instances of classes defined in ``__main__``.
    """
    buffers: Frames = []

    def keep_out_of_band(buf: pickle.PickleBuffer) -> bool:
        view = buf.raw()
        if view.nbytes < OUT_OF_BAND_MIN_BYTES:
            return True
        buffers.append(view)
        return False

    _add_torch_reducers()
    try:
        stream = _c_pickle(obj, keep_out_of_band)
    except (pickle.PicklingError, AttributeError, TypeError):
        buffers.clear()
        sink = io.BytesIO()
        _DataPickler(sink, protocol=5, buffer_callback=keep_out_of_band).dump(obj)
        stream = sink.getvalue()
    return [stream, *buffers]


#: rebuild an object from the one authenticated frame of a message made by :func:`dumps`
loads_one = pickle.loads


def loads(frames: Sequence[Any]) -> Any:
    """Rebuild an object from authenticated frames made by :func:`dumps`."""
    if len(frames) == 1:
        return pickle.loads(frames[0])
    return pickle.loads(frames[0], buffers=frames[1:])


def describe_unpicklable(obj: Any, exc: BaseException) -> str:
    """A message naming what could not be pickled, for errors at the API boundary."""
    return (f"cannot pickle {type(obj).__name__} object {obj!r:.200} for another process: "
            f"{type(exc).__name__}: {exc}")


# -- the stdlib's names (multiprocessing.reduction) -----------------------------------------
from multiprocessing import reduction as _mp_reduction  # noqa: E402
from multiprocessing.reduction import (ACKNOWLEDGE, HAVE_SEND_HANDLE,  # noqa: E402
                                       AbstractReducer, recvfds, sendfds)

_socket_level = (ACKNOWLEDGE, HAVE_SEND_HANDLE, AbstractReducer, recvfds,
                 sendfds)  # fd passing over a Unix socket: the stdlib's, one host


class _LentHandle(tuple):
    """What :func:`send_handle` sends on a fiberrl connection: ``(address, ticket)``."""


def send_handle(conn: Any, handle: int, destination_pid: Optional[int]) -> None:
    """Send the file descriptor ``handle`` over ``conn`` (the stdlib's function).

    On a stdlib connection (a Unix socket) it is the stdlib's ``SCM_RIGHTS`` transfer.
    On a fiberrl ``Connection``, which is not a descriptor of a socket, the descriptor
    is lent (:mod:`fiberrl._services.fd_sharing`) and its ticket sent as one message;
    :func:`recv_handle` borrows it. Both ends must be on one host: elsewhere
    ``recv_handle`` raises ``OSError`` saying so.
    """
    if isinstance(conn, _mp_connection._ConnectionBase):
        _mp_reduction.send_handle(conn, handle, destination_pid)
        return
    from ._services.fd_sharing import lend
    conn.send(_LentHandle(lend(handle, "a file descriptor")))


def recv_handle(conn: Any) -> int:
    """Receive a file descriptor sent with :func:`send_handle` (a new descriptor of this
    process). ``RuntimeError`` if the message received carries none."""
    if isinstance(conn, _mp_connection._ConnectionBase):
        return _mp_reduction.recv_handle(conn)
    message = conn.recv()
    if type(message) is not _LentHandle:
        raise RuntimeError(f"received {type(message).__name__!r} where a file descriptor "
                           "sent with send_handle() was expected")
    from ._services.fd_sharing import borrow
    return borrow(*message)


class ForkingPickler(_Pickler):
    """The role of the stdlib's ``ForkingPickler``: the pickler objects travel to other
    processes with (cloudpickle, so ``__main__`` objects travel by value), plus the
    reducers added with :meth:`register`. Plain data sent by :func:`dumps` takes the C
    pickler and does not consult them."""

    def __init__(self, file: Any, protocol: Any = None, *args: Any, **kwargs: Any) -> None:
        _add_torch_reducers()
        protocol = 5 if protocol is None else protocol
        if 0 <= protocol < 5:   # out-of-band buffers need protocol 5: torch's own reduction
            self.dispatch_table = ChainMap(_EXTRA_REDUCERS,
                                           {types.CodeType: _code_reduce_keeping_filename},
                                           cloudpickle.Pickler.dispatch_table)
        super().__init__(file, protocol, *args, **kwargs)

    @classmethod
    def register(cls, type_: type, reduce: Any) -> None:
        """Pickle instances of ``type_`` with ``reduce(obj)`` from now on.

        ``torch.multiprocessing`` registers its tensors' reducers here when
        ``multiprocessing`` is mapped to fiberrl; they are not taken: they share a
        tensor's memory through a file descriptor (``DupFd``), which cannot reach a
        job, and fiberrl sends tensors' bytes itself (:mod:`fiberrl.reduction_torch`)."""
        if getattr(reduce, "__module__", None) == _TORCH_SHARING_MODULE:
            return
        _EXTRA_REDUCERS[type_] = reduce

    @classmethod
    def dumps(cls, obj: Any, protocol: Any = None) -> memoryview:
        """``obj`` as one pickle."""
        sink = io.BytesIO()
        cls(sink, protocol).dump(obj)
        return sink.getbuffer()

    loads = staticmethod(pickle.loads)


register = ForkingPickler.register


def dump(obj: Any, file: Any, protocol: Any = None) -> None:
    """Write ``obj`` to ``file`` with :class:`ForkingPickler`."""
    ForkingPickler(file, protocol).dump(obj)


def DupFd(fd: int) -> Any:  # noqa: N802 - the stdlib's name
    """The stdlib duplicates ``fd`` into a child while it is being spawned; a fiberrl
    job is not spawned from this process (it may run on another host), so a file
    descriptor cannot ride in a pickle: this raises and says so."""
    raise NotImplementedError(
        f"cannot send file descriptor {fd} inside a pickle: fiberrl jobs are started by a "
        "backend, possibly on another host, not spawned from this process; send the data, "
        "or on one host pass descriptors over a Unix socket with sendfds()/recvfds()")
