"""The argument cache: a large argument shared by many tasks is sent once per host.

Data flow (ES's parameter vector, passed to all 64 tasks of a ``map``)::

    caller thread                    I/O thread (dispatch.py)            worker (worker.py)
    task 1: params -> SharedBuffer   per link: does the worker hold #k?  cache[#k] = bytes
      #k (one snapshot copy)           yes: send the key only            each task gets its
    tasks 2..64: params -> #k          no, and other tasks use #k: send  own writable copy
      (same object in the call)          its bytes once, into the cache
                                       no, and only this task: inline
    a task finishes: #k.users -= 1;  at 0: the pool drops #k and tells its holders to drop it

Semantics:

- **What is shared**: every out-of-band buffer of a task's arguments (a numpy array,
  ``bytearray``, CPU tensor of at least :data:`fiberrl.reduction.OUT_OF_BAND_MIN_BYTES`,
  64 KiB) becomes an entry: a snapshot of its bytes, taken in the caller's thread when
  the task is submitted. Tasks that pass the same object (by identity) while an entry
  for it lives share the entry: all tasks of one ``map`` call, and tasks of later calls
  submitted while an earlier task using it is still queued or running. Identification is
  cheap: no hashing; across calls one ``memcmp`` against the snapshot.
- **A changed object is never served stale.** Every task's arguments are its objects'
  bytes when it was submitted (the stdlib pickles later and may see later changes). An
  entry is reused by a later call only if the object still holds exactly the snapshot's
  bytes; a changed object gets a new entry with a new key, sent anew.
- **Lifetime**: an entry lives while a queued or running task uses it. When the last
  finishes, the pool drops its copy and tells every worker holding it to drop it (with
  its next message, or within a tick, ~0.1 s, if the worker is idle). So sequential
  ``apply`` calls that each wait for the last send the object each time; submit them
  together (``map``, or many ``apply_async``) to share it. The master holds one copy of
  each entry: a ``map`` over many distinct large arrays holds copies of those queued.
- **Memory bound**: each worker holds at most ``arg_cache_bytes`` (Pool argument,
  default 256 MiB) of entries; the pool evicts the least recently used entries no task on
  that worker holds. Entries needed by the tasks a worker holds are kept even above the
  bound (a task's arguments must be there), so one task bigger than the bound still runs.
  An entry used by a single task goes inline, outside the cache.
- **Workers replaced**: a new worker starts with an empty cache and gets the bytes with its
  first task that needs them (the pool keeps its copy while any task uses the entry).
- **Tasks see private copies**: a task may modify its arguments in place, as in the
  stdlib; the worker copies the cached bytes for each task (a ``memcpy``, ~20 us per
  400 KB), never exposing the cache itself; an entry kept in a segment (below) is mapped
  copy-on-write instead, so a task pays only for the pages it writes.
- **Once per host** (entries of :data:`~.segments.SEGMENT_MIN_BYTES`, 1 MiB, or more;
  :mod:`.segments`): on the pool's host the bytes are written once into a segment of
  shared memory that every worker there maps, and no worker receives them; on another
  host, the first worker sent them keeps them in a segment of its own and tells the
  pool (``"have"``), and the others of its host map that one (they wait for it rather
  than receive a copy of their own). A worker that cannot map a segment asks for the
  bytes (``"need"``). The relay is forgotten when its worker drops the entry or dies.
"""
from __future__ import annotations

import collections
import itertools
import logging
import threading
from typing import Any, Callable, Dict, Iterable, List, Optional

from .segments import SEGMENT_MIN_BYTES, Segment

logger = logging.getLogger(__name__)

#: the default bound of each worker's cache (``Pool(arg_cache_bytes=...)``)
DEFAULT_ARG_CACHE_BYTES = 256 * 1024 * 1024


class SharedBuffer:
    """One cached argument: its key, an immutable copy of its bytes, who uses and holds it."""

    __slots__ = ("key", "data", "nbytes", "users", "source", "holders", "segment", "relays")

    def __init__(self, key: int, data: bytes, source: Any) -> None:
        self.key = key
        self.data = data
        self.nbytes = len(data)
        self.users = 0                       # tasks (queued or running) that use it
        self.source = source                 # the caller's object, while the entry lives
        self.holders: "set[LinkCache]" = set()  # worker links that hold a copy
        self.segment: Optional[Segment] = None  # its bytes in host memory, once mapped
        #: per other host: the id of the worker there receiving its bytes, then (that
        #: id, the reference to the segment it made of them): its host's relay
        self.relays: Dict[str, Any] = {}

    def host_segment(self) -> Optional[Segment]:
        """Its bytes in a segment that workers of this host map (made on first use, in
        the I/O thread); None if no segment can be made (the bytes go on the wire)."""
        if self.segment is None and self.nbytes >= SEGMENT_MIN_BYTES:
            try:
                self.segment = Segment.from_bytes(self.data)
            except OSError as exc:
                logger.debug("shared argument #%d goes on the wire: %s", self.key, exc)
        return self.segment

    def __repr__(self) -> str:
        return f"<SharedBuffer #{self.key} {self.nbytes} B, {self.users} user(s)>"


class BufferTable:
    """The pool's entries, by the identity of the object they were copied from.

    :meth:`share` runs in callers' threads, :meth:`release` in the I/O thread; both take
    the table's lock. ``on_free(entry)`` is called (outside the lock) when no task uses
    an entry any more.
    """

    def __init__(self, on_free: Callable[[SharedBuffer], None], min_bytes: int) -> None:
        self._lock = threading.Lock()
        self._on_free = on_free
        self._min_bytes = min_bytes
        self._by_object: Dict[int, SharedBuffer] = {}
        self._keys = itertools.count(1)
        self.live = 0          # entries alive
        self.live_bytes = 0    # their bytes (the pool's copies)

    def share(self, frames: List[Any], memo: Optional[dict]) -> tuple:
        """``frames`` (from :func:`fiberrl.reduction.dumps`) as a tuple, with large buffers
        replaced by entries; ``memo`` spans the tasks of one call (None: this task only)."""
        if len(frames) == 1:
            return (frames[0],)
        memo = {} if memo is None else memo
        with self._lock:
            return (frames[0], *(self._intern(view, memo) for view in frames[1:]))

    def _intern(self, view: Any, memo: dict) -> Any:
        source = getattr(view, "obj", None)
        if source is None or view.nbytes < self._min_bytes:
            return view
        ident = id(source)
        seen = memo.get(ident)
        entry = seen[1] if seen is not None and seen[0] is source else None
        if entry is None or entry.users == 0:  # not yet in this call, or freed meanwhile
            data = bytes(view)
            entry = self._by_object.get(ident)
            if entry is None or entry.source is not source or entry.data != data:
                entry = SharedBuffer(next(self._keys), data, source)
                self._by_object[ident] = entry
                self.live += 1
                self.live_bytes += entry.nbytes
            memo[ident] = (source, entry)  # keeps ``source`` alive: its id stays its own
        entry.users += 1
        return entry

    def release(self, frames: Iterable[Any]) -> None:
        """A task that used ``frames`` finished or was dropped: one use less of each entry."""
        freed = []
        with self._lock:
            for frame in frames:
                if type(frame) is SharedBuffer:
                    frame.users -= 1
                    if frame.users == 0:
                        if self._by_object.get(id(frame.source)) is frame:
                            del self._by_object[id(frame.source)]
                        frame.source = None
                        if frame.segment is not None:   # workers keep their mappings
                            frame.segment.close()
                            frame.segment = None
                        self.live -= 1
                        self.live_bytes -= frame.nbytes
                        freed.append(frame)
        for entry in freed:
            self._on_free(entry)


class LinkCache:
    """What one worker holds: entries in least-recently-used order, pinned by its tasks.

    Used by the I/O thread only. ``drops`` collects the keys the worker must forget; they
    go with the next message to it.
    """

    __slots__ = ("limit", "held", "pins", "by_task", "nbytes", "drops", "owner", "host")

    def __init__(self, limit: int, owner: int = 0, host: str = "") -> None:
        self.limit = limit
        self.owner, self.host = owner, host   # the worker's id and host
        self.held: "collections.OrderedDict[int, SharedBuffer]" = collections.OrderedDict()
        self.pins: Dict[int, int] = {}              # key -> tasks held that use it
        self.by_task: Dict[int, List[SharedBuffer]] = {}
        self.nbytes = 0
        self.drops: List[int] = []

    def encode(self, task_id: int, frames: List[Any], inline: List[Any]) -> tuple:
        """A task's buffer layout for the wire: ``(layout, new entries, hits)``.

        ``layout`` has, per out-of-band buffer, None (it is appended to ``inline``) or the
        key of an entry sent by reference: one the worker holds, or one other tasks use
        too (it joins the worker's cache: ``new``). An entry only this task uses goes inline.
        """
        if len(frames) == 1:
            return (), [], 0   # the common small task: no buffers at all
        layout, refs = [], []
        for frame in frames[1:]:
            if type(frame) is not SharedBuffer:
                layout.append(None)
                inline.append(frame)
            elif frame.key in self.held or frame.users > 1:
                layout.append(frame.key)
                refs.append(frame)
            else:
                layout.append(None)
                inline.append(frame.data)
        new = self.plan(task_id, refs) if refs else []
        return tuple(layout), new, len(refs) - len(new)

    def plan(self, task_id: int, entries: List[SharedBuffer]) -> List[SharedBuffer]:
        """Pin the entries a task sent by reference uses; return those the worker lacks."""
        new: List[SharedBuffer] = []
        self.by_task[task_id] = entries
        for entry in entries:
            key = entry.key
            self.pins[key] = self.pins.get(key, 0) + 1
            if key in self.held:
                self.held.move_to_end(key)
            else:
                self.held[key] = entry
                self.nbytes += entry.nbytes
                entry.holders.add(self)
                new.append(entry)
        return new

    def unpin(self, task_id: int) -> None:
        """A task this worker held finished."""
        for entry in self.by_task.pop(task_id, ()):
            left = self.pins.get(entry.key, 0) - 1
            if left > 0:
                self.pins[entry.key] = left
            else:
                self.pins.pop(entry.key, None)

    def forget(self, entry: SharedBuffer) -> None:
        """No task uses ``entry`` any more: the worker drops it."""
        if self.held.pop(entry.key, None) is not None:
            self.nbytes -= entry.nbytes
            self.drops.append(entry.key)
        self._unrelay(entry)
        entry.holders.discard(self)

    def _unrelay(self, entry: SharedBuffer) -> None:
        """The worker no longer holds ``entry``: it is not its host's relay for it."""
        relay = entry.relays.get(self.host)
        if relay == self.owner or (type(relay) is tuple and relay[0] == self.owner):
            del entry.relays[self.host]

    def evict(self) -> None:
        """Drop least recently used, unpinned entries while over the bound."""
        if self.nbytes <= self.limit:
            return
        for key in list(self.held):
            if self.nbytes <= self.limit:
                return
            if self.pins.get(key):
                continue
            entry = self.held.pop(key)
            self.nbytes -= entry.nbytes
            self._unrelay(entry)
            entry.holders.discard(self)
            self.drops.append(key)

    def close(self) -> None:
        """The worker is gone: its entries no longer list it as a holder."""
        for entry in self.held.values():
            self._unrelay(entry)
            entry.holders.discard(self)
        self.held.clear()
        self.pins.clear()
        self.by_task.clear()
        self.nbytes = 0
