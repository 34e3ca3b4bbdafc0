"""Host segments: a large shared argument written once into memory that every worker of
the host maps (Linux ``memfd``), instead of one copy per worker through its socket.

Data flow::

    pool process                                   worker on the same host
    entry #k (bytes) --pwrite once--> memfd        open /proc/<pid>/fd/<fd>, check
      reference (host, pid, fd, size, tag) ------>   size and tag; keep the descriptor
      in the "tasks" message (signed)              per task: a private copy-on-write
                                                     mapping (MAP_PRIVATE): reading
                                                     shares the pages, a write copies
                                                     only the pages it touches

A reference names the process that holds the descriptor, so a worker maps the pool
process's segment, or (across hosts) a segment another worker of its host made from
the bytes it received. The 16-byte ``tag`` after the data proves it is the segment
meant (a descriptor number can be reused once its segment is closed); a reference
that cannot be opened or checked raises ``OSError`` and the worker asks for the bytes
instead. A segment's memory is freed when its last descriptor and mapping are gone:
nothing is left in ``/dev/shm`` by a process that is killed.

Only entries of at least :data:`SEGMENT_MIN_BYTES` use segments (each holds a
descriptor in every process that keeps it); smaller ones travel as bytes.
"""
from __future__ import annotations

import logging
import mmap
import os
import socket
import sys
from typing import Any, List, Optional, Tuple

logger = logging.getLogger(__name__)

#: entries at least this large are shared through host segments
SEGMENT_MIN_BYTES = 1024 * 1024
TAG_BYTES = 16

#: ``(host, pid, fd, size, tag)``: where a segment can be opened, and how to check it
Reference = Tuple[str, int, int, int, bytes]

AVAILABLE = hasattr(os, "memfd_create") and os.path.isdir("/proc/self/fd")


class Segment:
    """One segment held open by this process: made from bytes, or attached by reference."""

    __slots__ = ("fd", "size", "tag", "_spare", "__weakref__")

    def __init__(self, fd: int, size: int, tag: bytes) -> None:
        self.fd, self.size, self.tag = fd, size, tag
        self._spare: Optional[mmap.mmap] = None   # the last mapping lent (see lend)

    @classmethod
    def from_bytes(cls, data: Any) -> "Segment":
        """A new segment holding a copy of ``data`` (any buffer); ``OSError`` if it cannot
        be made (no memfd, no memory, no descriptor)."""
        if not AVAILABLE:
            raise OSError("host segments need Linux memfd_create and /proc")
        view = memoryview(data).cast("B")
        tag = os.urandom(TAG_BYTES)   # (what secrets.token_bytes returns)
        fd = os.memfd_create("fiberrl-arg", os.MFD_CLOEXEC)
        try:
            os.ftruncate(fd, view.nbytes + TAG_BYTES)
            _write_all(fd, view, 0)
            _write_all(fd, memoryview(tag), view.nbytes)
        except BaseException:
            os.close(fd)
            raise
        return cls(fd, view.nbytes, tag)

    @classmethod
    def attach(cls, ref: Reference) -> "Segment":
        """Open the segment ``ref`` names (on this host); ``OSError`` if it is not there
        or not the one meant."""
        host, pid, fd_number, size, tag = ref
        if host != socket.gethostname():
            raise OSError(f"segment of host {host!r} is not on this host")
        fd = os.open(f"/proc/{pid}/fd/{fd_number}", os.O_RDONLY | os.O_CLOEXEC)
        try:
            if (os.fstat(fd).st_size != size + TAG_BYTES
                    or os.pread(fd, TAG_BYTES, size) != tag):
                raise OSError(f"descriptor {fd_number} of process {pid} is not the segment meant")
        except BaseException:
            os.close(fd)
            raise
        return cls(fd, size, tag)

    def reference(self) -> Reference:
        """How another process of this host opens it."""
        return socket.gethostname(), os.getpid(), self.fd, self.size, self.tag

    def private_view(self) -> memoryview:
        """A writable copy-on-write mapping of the data: its own to modify, sharing the
        pages it only reads."""
        if self.size == 0:
            return memoryview(bytearray())
        return memoryview(mmap.mmap(self.fd, self.size, flags=mmap.MAP_PRIVATE,
                                    prot=mmap.PROT_READ | mmap.PROT_WRITE))

    def lend(self) -> memoryview:
        """A private view for one task: the mapping lent to the previous task again if
        nothing refers to it any more and no page of it was written (so it reads as the
        segment does, with its pages mapped already: a fresh mapping faults each page in
        as the task reads it, ~5 ms per 40 MB); otherwise a fresh one."""
        # (getrefcount counts its argument too: 2 is this segment's own reference alone)
        if (self._spare is not None and sys.getrefcount(self._spare) == 2
                and not _written(self._spare)):
            ARG_MAPPINGS["reused"] += 1
            return memoryview(self._spare)
        view = self.private_view()
        self._spare = view.obj if isinstance(view.obj, mmap.mmap) else None
        ARG_MAPPINGS["made"] += 1
        return view

    def inode(self) -> int:
        """The segment's inode: the same in every process that maps it."""
        return os.fstat(self.fd).st_ino

    def close(self) -> None:
        """Release this process's descriptor (mappings still in use stay valid)."""
        fd, self.fd = self.fd, -1
        self._spare = None   # (a task may still use it: it is unmapped with its last view)
        if fd >= 0:
            os.close(fd)

    def __len__(self) -> int:
        return self.size

    def __del__(self) -> None:
        if getattr(self, "fd", -1) >= 0:
            self.close()


#: this process's task views of segments: mappings made, and mappings lent again
ARG_MAPPINGS = {"made": 0, "reused": 0}

_PAGE = mmap.PAGESIZE
#: a pagemap entry's top byte (bit 63 present, 62 swapped, 61 a file or shared page)
#: -> b"\x01" for a page of this process's own (written), else b"\x00"
_WRITTEN = bytes(int(bool(top & 0x40 or (top & 0x80 and not top & 0x20))) for top in range(256))
_pagemap: List[int] = []   # this process's /proc/self/pagemap, opened once


def _written(mapping: mmap.mmap) -> bool:
    """Whether any page of a private mapping of a segment was written (it is then a
    page of this process's own: present or swapped out, and not the segment's page).
    True where ``/proc/self/pagemap`` cannot tell."""
    import ctypes   # here: a worker that never maps a segment does not load it (~2 ms)
    try:
        if not _pagemap:
            _pagemap.append(os.open("/proc/self/pagemap", os.O_RDONLY | os.O_CLOEXEC))
        anchor = (ctypes.c_char * 1).from_buffer(mapping)
        try:
            address = ctypes.addressof(anchor)
        finally:
            del anchor
        pages = -(-len(mapping) // _PAGE)
        entries = os.pread(_pagemap[0], pages * 8, address // _PAGE * 8)
    except (OSError, ValueError, TypeError, BufferError):
        return True
    if len(entries) != pages * 8 or sys.byteorder != "little":
        return True
    return b"\x01" in entries[7::8].translate(_WRITTEN)   # the entries' top bytes


def _write_all(fd: int, view: memoryview, offset: int) -> None:
    while view.nbytes:
        written = os.pwrite(fd, view, offset)
        view, offset = view[written:], offset + written


def make_probe() -> Optional[Segment]:
    """A tiny segment whose reference workers try at start: whoever can open it can map
    this process's segments. None where segments are not available."""
    if not AVAILABLE:
        return None
    try:
        return Segment.from_bytes(b"")
    except OSError as exc:
        logger.debug("no host segments: %s", exc)
        return None


def can_attach(ref: Optional[Reference]) -> bool:
    """Whether this process can open the probe ``ref`` (so, its owner's segments)."""
    if ref is None or not AVAILABLE:
        return False
    try:
        Segment.attach(ref).close()
        return True
    except OSError:
        return False
