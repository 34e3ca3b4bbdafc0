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
import secrets
import socket
from typing import Any, Optional, Tuple

logger = logging.getLogger(__name__)

#: entries at least this large are shared through host segments
SEGMENT_MIN_BYTES = 1024 * 1024
TAG_BYTES = 16

#: ``(host, pid, fd, size, tag)``: where a segment can be opened, and how to check it
Reference = Tuple[str, int, int, int, bytes]

AVAILABLE = hasattr(os, "memfd_create") and os.path.isdir("/proc/self/fd")


class Segment:
    """One segment held open by this process: made from bytes, or attached by reference."""

    __slots__ = ("fd", "size", "tag", "__weakref__")

    def __init__(self, fd: int, size: int, tag: bytes) -> None:
        self.fd, self.size, self.tag = fd, size, tag

    @classmethod
    def from_bytes(cls, data: Any) -> "Segment":
        """A new segment holding a copy of ``data`` (any buffer); ``OSError`` if it cannot
        be made (no memfd, no memory, no descriptor)."""
        if not AVAILABLE:
            raise OSError("host segments need Linux memfd_create and /proc")
        view = memoryview(data).cast("B")
        tag = secrets.token_bytes(TAG_BYTES)
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

    def inode(self) -> int:
        """The segment's inode: the same in every process that maps it."""
        return os.fstat(self.fd).st_ino

    def close(self) -> None:
        """Release this process's descriptor (mappings still in use stay valid)."""
        fd, self.fd = self.fd, -1
        if fd >= 0:
            os.close(fd)

    def __len__(self) -> int:
        return self.size

    def __del__(self) -> None:
        if getattr(self, "fd", -1) >= 0:
            self.close()


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
