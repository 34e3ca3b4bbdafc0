"""``fiberrl.shared_memory``: the stdlib's ``SharedMemory`` and ``ShareableList`` for jobs.

Blocks are the stdlib's POSIX shared memory, so every fiberrl job on the creating
host maps the same bytes. Two differences make them work between jobs:

- pickled, a block carries its host; unpickled on another host it raises
  :class:`fiberrl.errors.SharedMemoryHostError` naming both hosts, instead of
  failing with a bare ``FileNotFoundError`` (or, worse, finding an unrelated block
  of the same name);
- a process that only *attaches* does not register the block with its resource
  tracker (Python 3.11 does, and a job's tracker would then unlink the creator's
  block when the job exits, see CPython gh-82300).

:class:`SharedMemoryManager` is the stdlib's: blocks it creates are unlinked when it
shuts down. Its server is a fiberrl job that records them; on a backend whose jobs
run elsewhere, blocks of the caller's host are unlinked by the caller.
"""
from __future__ import annotations

import socket
from multiprocessing import resource_tracker
from multiprocessing import shared_memory as _mp_shared_memory
from typing import Any, Iterable, List, Optional, Tuple

import _posixshmem

from ._sync import serving as managers
from .errors import SharedMemoryHostError

__all__ = ["SharedMemory", "ShareableList", "SharedMemoryManager", "SharedMemoryServer"]


def _check_host(name: str, host: str) -> None:
    here = socket.gethostname()
    if host != here:
        raise SharedMemoryHostError(
            f"shared memory block {name!r} was created on host {host!r} and cannot be "
            f"attached on host {here!r}: shared memory does not cross machines")


def _untrack(name: str) -> None:
    """Forget an attached block in this process's resource tracker (it is not ours)."""
    try:
        resource_tracker.unregister("/" + name.lstrip("/"), "shared_memory")
    except Exception:  # noqa: BLE001 - no tracker running: nothing to forget
        pass


#: the stdlib module's constants, which code written for it reads
_SHM_NAME_PREFIX = _mp_shared_memory._SHM_NAME_PREFIX
_USE_POSIX = _mp_shared_memory._USE_POSIX


def _make_filename() -> str:
    """A fresh random block name, as the stdlib module's helper of the same name makes
    (looked up here at each creation, so code that replaces it sees its names used)."""
    return _mp_shared_memory._make_filename()


class SharedMemory(_mp_shared_memory.SharedMemory):
    """The stdlib's ``SharedMemory(name=None, create=False, size=0)``, picklable to jobs."""

    def __init__(self, name: Optional[str] = None, create: bool = False, size: int = 0) -> None:
        if name is None and create and size > 0:
            while True:   # as the stdlib: a name that exists already is skipped
                try:
                    super().__init__(_make_filename().lstrip("/"), True, size)
                    break
                except FileExistsError:
                    continue
        else:
            super().__init__(name, create, size)
        self.host = socket.gethostname()
        if not create:
            _untrack(self._name)

    def __reduce__(self):
        return _attach_block, (self.name, self.host)


def _attach_block(name: str, host: str) -> SharedMemory:
    _check_host(name, host)
    return SharedMemory(name)


class ShareableList(_mp_shared_memory.ShareableList):
    """The stdlib's ``ShareableList(sequence=None, *, name=None)``, picklable to jobs."""

    def __init__(self, sequence: Optional[Iterable[Any]] = None, *,
                 name: Optional[str] = None) -> None:
        super().__init__(sequence, name=name)
        self.host = socket.gethostname()
        if sequence is None and name is not None:
            _untrack(self.shm._name)

    def __reduce__(self):
        return _attach_list, (self.shm.name, self.host)


def _attach_list(name: str, host: str) -> ShareableList:
    _check_host(name, host)
    return ShareableList(name=name)


class SegmentTracker:
    """Server side: the blocks a :class:`SharedMemoryManager` created, by host."""

    def __init__(self) -> None:
        self.blocks: List[Tuple[str, str]] = []

    def track(self, name: str, host: str) -> None:
        """Record a block to unlink at shutdown."""
        self.blocks.append((name, host))

    def unlink_all(self) -> List[Tuple[str, str]]:
        """Unlink the blocks of this host (the server's); return every block recorded."""
        here, blocks = socket.gethostname(), self.blocks
        for name, host in blocks:
            if host == here:
                _unlink_block(name, untrack=False)  # this job never registered it
        self.blocks = []
        return blocks


def _unlink_block(name: str, untrack: bool = True) -> None:
    """Unlink ``name`` if it still exists (and forget it in this process's tracker)."""
    if untrack:
        _untrack(name)
    try:
        _posixshmem.shm_unlink("/" + name.lstrip("/"))
    except FileNotFoundError:
        pass


_tracker: Optional[SegmentTracker] = None


def _server_tracker() -> SegmentTracker:
    global _tracker
    if _tracker is None:
        _tracker = SegmentTracker()
    return _tracker


class SharedMemoryManager(managers.BaseManager):
    """The stdlib's ``SharedMemoryManager``: ``SharedMemory(size)`` and
    ``ShareableList(sequence)`` made through it are unlinked when it shuts down."""

    def start(self, initializer: Any = None, initargs: tuple = ()) -> None:
        """Start the server job (see :meth:`fiberrl.managers.BaseManager.start`)."""
        super().start(initializer, initargs)
        self._tracker = self.SegmentTracker()
        stop_server = self.shutdown

        def shutdown() -> None:
            if getattr(self, "_tracker", None) is not None:
                for name, host in self._tracker.unlink_all():  # the creator's tracker too
                    if host == socket.gethostname():
                        _unlink_block(name)
                self._tracker = None
            stop_server()
        self.shutdown = shutdown

    def _started_tracker(self) -> Any:
        tracker = getattr(self, "_tracker", None)
        if tracker is None:
            raise ValueError("the SharedMemoryManager is not running: call start() first "
                             "(or use it in a with statement)")
        return tracker

    def SharedMemory(self, size: int) -> SharedMemory:  # noqa: N802 - the stdlib's name
        """A new block of ``size`` bytes, unlinked when the manager shuts down."""
        tracker = self._started_tracker()
        block = SharedMemory(None, create=True, size=size)
        tracker.track(block.name, block.host)
        return block

    def ShareableList(self, sequence: Iterable[Any]) -> ShareableList:  # noqa: N802
        """A new ``ShareableList`` of ``sequence``, unlinked when the manager shuts down."""
        tracker = self._started_tracker()
        shared = ShareableList(sequence)
        tracker.track(shared.shm.name, shared.host)
        return shared


SharedMemoryManager.register("SegmentTracker", _server_tracker, exposed=("track", "unlink_all"))

#: The stdlib's name for the server of a SharedMemoryManager; here the manager's
#: server job holds a :class:`SegmentTracker` instead of a subclassed server.
SharedMemoryServer = managers.Server
