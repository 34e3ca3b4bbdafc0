"""How CPU torch tensors travel in fiberrl's pickles: their storage as an out-of-band buffer.

torch's own pickling of a tensor (``Tensor.__reduce_ex__``) writes its storage with
``torch.save`` into a ``bytes`` object inside the pickle stream: a copy on each side,
a second legacy-format parse when loading, and, since the stream is the frame the wire
signs, a MAC over every byte. The stdlib's ``multiprocessing`` avoids that with
``torch.multiprocessing``'s reducers, which move storages to shared memory and pass a
file descriptor; a fiberrl job may run on another host, so here the storage's bytes
become one out-of-band buffer of protocol 5 (:mod:`fiberrl.reduction` sends buffers of
64 KiB or more as frames of their own, uncopied, unhashed) and are rebuilt on the other
side without a parse.

Data flow::

    Tensor -> (_rebuild_tensor, (UntypedStorage, dtype, offset, size, stride))
    UntypedStorage -> (_rebuild_storage, (PickleBuffer over its bytes,))

Storages are pickled as objects of their own, so tensors that share one (views of one
tensor in one message) share it again when loaded. Tensors this does not cover (not on
the CPU, not strided, quantized, requiring grad, carrying Python attributes, or with
lazy conjugate/negative bits) keep torch's own reduction.

Registered by :func:`fiberrl.reduction.dumps` when ``torch`` has been imported (fiberrl
never imports it itself).
"""
from __future__ import annotations

import pickle
import weakref
from typing import Any

import numpy
import torch

__all__ = ["reducers"]

#: rebuilt storages whose buffer address is not a multiple of this are copied
#: (torch's kernels expect at least element alignment; its own allocations are 64)
_ALIGN = 16


def _reduce_tensor(tensor: torch.Tensor) -> Any:
    if (tensor.device.type != "cpu" or tensor.layout is not torch.strided
            or tensor.is_quantized or tensor.requires_grad or tensor.is_conj()
            or tensor.is_neg() or any(getattr(tensor, "names", ())) or tensor.__dict__):
        return tensor.__reduce_ex__(pickle.HIGHEST_PROTOCOL)
    return _rebuild_tensor, (tensor.untyped_storage(), tensor.dtype, tensor.storage_offset(),
                             tuple(tensor.size()), tuple(tensor.stride()))


def _reduce_storage(storage: torch.UntypedStorage) -> Any:
    if storage.device.type != "cpu":
        return storage.__reduce__()
    if storage.nbytes() == 0:
        return _rebuild_storage, (b"",)
    return _rebuild_storage, (pickle.PickleBuffer(_bytes_of(storage)),)


#: one byte view per live storage (see _bytes_of); a view keeps its storage alive, so
#: while an entry is here no other storage can have its address
_views: "weakref.WeakValueDictionary[tuple, numpy.ndarray]" = weakref.WeakValueDictionary()


def _bytes_of(storage: torch.UntypedStorage) -> numpy.ndarray:
    """A uint8 array over ``storage``'s memory, the same object each time the same
    storage is pickled while it lives: the pool's argument cache
    (:mod:`fiberrl.pool.shared`) knows a repeated argument by its buffer's object."""
    key = (storage.data_ptr(), storage.nbytes())
    view = _views.get(key)
    if view is None:
        view = torch.empty(0, dtype=torch.uint8).set_(storage).numpy()  # shares its memory
        _views[key] = view
    return view


def _rebuild_storage(buffer: Any) -> torch.UntypedStorage:
    view = memoryview(buffer)
    if view.nbytes == 0:
        return torch.UntypedStorage(0)
    if view.readonly:  # torch wants writable memory; frames from the wire are
        view = memoryview(bytearray(view))
    data = torch.frombuffer(view, dtype=torch.uint8)
    if data.data_ptr() % _ALIGN:
        data = data.clone()
    return data.untyped_storage()


def _rebuild_tensor(storage: torch.UntypedStorage, dtype: torch.dtype, offset: int,
                    size: tuple, stride: tuple) -> torch.Tensor:
    return torch.empty(0, dtype=dtype).set_(storage, offset, size, stride)


def reducers() -> dict:
    """``{type: reduce}`` for fiberrl's pickler's dispatch table."""
    return {torch.Tensor: _reduce_tensor, torch.UntypedStorage: _reduce_storage}
