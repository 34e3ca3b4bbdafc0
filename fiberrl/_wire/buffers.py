"""The bytes-like arguments of the ``Connection`` API, checked as the stdlib checks them.

Shared by fiberrl's pipe ends and the relayed stdlib connections, so both refuse a bad
``offset``/``size`` with the same ``ValueError``.
"""
from __future__ import annotations

from typing import Any, Optional


def byte_view(buf: Any) -> memoryview:
    """``buf`` as a flat view of bytes."""
    view = memoryview(buf)
    return view.cast("B") if view.itemsize > 1 else view


def send_slice(buf: Any, offset: int = 0, size: Optional[int] = None) -> bytes:
    """A copy of ``buf[offset:offset + size]`` (bytes), for ``send_bytes``."""
    view = byte_view(buf)
    n = view.nbytes
    if offset < 0:
        raise ValueError("offset is negative")
    if n < offset:
        raise ValueError("buffer length < offset")
    if size is None:
        size = n - offset
    elif size < 0:
        raise ValueError("size is negative")
    elif offset + size > n:
        raise ValueError("buffer length < offset + size")
    return bytes(view[offset:offset + size])


def receive_target(buf: Any, offset: int) -> memoryview:
    """``buf`` as a flat writable view for ``recv_bytes_into``, its ``offset`` checked."""
    view = byte_view(buf)
    if offset < 0 or offset > view.nbytes:
        raise ValueError("offset out of bounds")
    return view


__all__ = ["byte_view", "send_slice", "receive_target"]
