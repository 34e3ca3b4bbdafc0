"""``fiberrl.heap``: the stdlib's heap of shared blocks, on arenas other jobs can map.

The stdlib's arenas are anonymous memory handed to children by file descriptor when
they are spawned, which a job (started by a backend, perhaps on another machine)
cannot receive. Here an :class:`Arena` is a named shared-memory segment
(:class:`fiberrl.shm_ctypes.Segment`): it pickles by name, any job on the same host
maps the same memory, and a job on another host gets
:class:`fiberrl.errors.SharedMemoryHostError` naming both hosts. :class:`Heap` is
the stdlib's allocator drawing its arenas from here; :class:`BufferWrapper` is a
block of it, as in the stdlib.
"""
from __future__ import annotations

import mmap
import weakref
from multiprocessing import heap as _mp_heap
from typing import Any, Optional, Tuple

from .shm_ctypes import Segment

__all__ = ["Arena", "Heap", "BufferWrapper", "rebuild_arena", "reduce_arena"]


class Arena:
    """``size`` bytes of shared memory (``buffer`` is its mmap), picklable to jobs of this host."""

    def __init__(self, size: int, _segment: Optional[Segment] = None) -> None:
        self.size = size
        self._segment = _segment if _segment is not None else Segment(size)
        self.buffer = self._segment.mmap

    def __reduce__(self):
        return reduce_arena(self)


def reduce_arena(arena: Arena) -> Tuple[Any, tuple]:
    """How an arena pickles: its size, segment name and host."""
    return rebuild_arena, (arena.size, arena._segment.name, arena._segment.host)


def rebuild_arena(size: int, name: str, host: str) -> Arena:
    """Map the arena ``name`` (raises SharedMemoryHostError on another host)."""
    return Arena(size, Segment(size, name, host))


class Heap(_mp_heap.Heap):
    """The stdlib's heap allocator, with arenas from :class:`Arena`."""

    def _new_arena(self, size: int) -> Tuple[Arena, int, int]:
        length = self._roundup(max(self._size, size), mmap.PAGESIZE)
        if self._size < self._DOUBLE_ARENA_SIZE_UNTIL:
            self._size *= 2  # arenas grow as the stdlib's do
        arena = Arena(length)
        self._arenas.append(arena)
        return arena, 0, length


class BufferWrapper:
    """A block of ``size`` bytes of the shared heap; ``create_memoryview()`` maps it."""

    _heap = Heap()

    def __init__(self, size: int) -> None:
        if size < 0:
            raise ValueError(f"Size {size} out of range")
        block = BufferWrapper._heap.malloc(size)
        self._state = (block, size)
        weakref.finalize(self, BufferWrapper._heap.free, block)  # in the creator only

    def create_memoryview(self) -> memoryview:
        """A view of the block's bytes."""
        (arena, start, _stop), size = self._state
        return memoryview(arena.buffer)[start:start + size]
