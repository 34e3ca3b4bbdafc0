"""The pool's view of one connected worker, and the message that hands it tasks.

Used by the dispatcher (:mod:`.dispatch`) on the I/O loop only: no locks. The message's
layout is documented in :mod:`.worker`.
"""
from __future__ import annotations

import time
from typing import Any, List, Optional, Tuple

from .segments import SEGMENT_MIN_BYTES
from .shared import LinkCache, SharedBuffer
from .tasks import MAP, Task
from .wire import PoolChannel


class WorkerLink:
    """The pool's view of one connected worker."""

    __slots__ = ("id", "channel", "pid", "host", "maps", "relayed", "quota_left", "known",
                 "drops", "cache", "last_seen", "idle_since", "retiring", "dead", "solo",
                 "hungry", "stop_sent", "job_token")

    def __init__(self, worker_id: int, channel: PoolChannel, pid: int, host: str,
                 quota: Optional[int], cache_bytes: int, maps: bool = False,
                 relayed: bool = False) -> None:
        self.id = worker_id
        self.channel = channel
        self.pid = pid
        self.host = host
        self.maps = maps   # it maps this process's host segments (see .segments)
        self.relayed = relayed   # on another host: it maps what a worker there received
        self.quota_left = quota
        self.known: set = set()
        self.drops: List[int] = []
        self.cache = LinkCache(cache_bytes, worker_id, host)   # its large arguments (.shared)
        self.last_seen = time.monotonic()
        self.idle_since = self.last_seen
        self.retiring = False
        self.dead = False
        self.solo = False
        self.hungry = False
        self.stop_sent = False
        self.job_token: Optional[str] = None   # its job's token, for the job watch

    def task_message(self, batch: List[Task]) -> Tuple[tuple, List[Any], int, int, int]:
        """The ``"tasks"`` message handing ``batch`` to this worker (see :mod:`.worker`):
        ``(header, buffers, large arguments sent into its cache, cache hits, how many of
        those it maps from host memory instead of receiving their bytes)``.

        Functions it lacks go with it; map tasks of one scalar each go as runs.
        """
        funcs, func_buffers, tasks, task_buffers, added, runs = [], [], [], [], [], []
        cache, known, append = self.cache, self.known, tasks.append
        function = run_ids = run_items = None
        hits = 0
        for task in batch:
            if task.call.function is not function:
                function, run_ids = task.call.function, None   # a run has one function
                if function.id not in known:
                    known.add(function.id)
                    funcs.append((function.id, function.frames[0], len(function.frames) - 1))
                    func_buffers.extend(function.frames[1:])
            frames = task.frames
            if len(frames) == 1:   # the common small task: no buffers at all
                stream = frames[0]
                if type(stream) is tuple and len(stream) == 1 and task.mode == MAP:
                    if run_ids is None:
                        run_ids, run_items = [], []
                        runs.append((function.id, run_ids, run_items))
                    run_ids.append(task.id)
                    run_items.append(stream[0])
                else:
                    append((task.id, function.id,
                            task.mode if task.rerun is None else task.wire_mode(), stream, ()))
                continue
            layout, new, got = cache.encode(task.id, frames, task_buffers)
            added.extend(new)
            hits += got
            append((task.id, function.id, task.mode if task.rerun is None else task.wire_mode(),
                    frames[0], layout))
        if added:
            cache.evict()
        solo = batch[0].suspect
        self.solo = self.solo or solo
        drops, self.drops = self.drops, []
        cache_drops, cache.drops = cache.drops, []
        adds, add_buffers, mapped = self.cache_adds(added)
        buffers = [*func_buffers, *add_buffers, *task_buffers]
        header = ("tasks", funcs, drops, tasks, solo, adds, cache_drops, runs)
        return header, buffers, len(added), hits, mapped

    def cache_adds(self, entries: List[Any]) -> Tuple[List[tuple], List[Any], int]:
        """How ``entries`` reach the worker's cache: ``([(key, reference or None)], the
        bytes of those without a reference, how many have one)``. A worker that maps
        this process's host segments gets a reference to the segment (see
        :mod:`.segments`); one on another host gets a reference to the segment a worker
        of its host made of the bytes it received, if one did (its host's relay); others
        get the bytes (and are their host's relay for large ones)."""
        adds, data, mapped = [], [], 0
        for entry in entries:
            ref = None
            if self.maps:
                segment = entry.host_segment()
                ref = segment.reference() if segment is not None else None
            elif self.relayed and entry.nbytes >= SEGMENT_MIN_BYTES:
                relay = entry.relays.get(self.host)
                if type(relay) is tuple and relay[0] != self.id:
                    ref = relay[1]
                elif relay is None:
                    entry.relays[self.host] = self.id   # it receives them for its host
            if ref is not None:
                adds.append((entry.key, ref))
                mapped += 1
            else:
                adds.append((entry.key, None))
                data.append(entry.data)
        return adds, data, mapped

    def awaits_relay(self, task: Task) -> bool:
        """Whether ``task`` uses a large argument that another worker of this worker's host
        is receiving now: better to wait for it and map its copy than to get another."""
        if not self.relayed or len(task.frames) == 1:
            return False
        held = self.cache.held
        for frame in task.frames[1:]:
            if type(frame) is SharedBuffer and frame.key not in held:
                relay = frame.relays.get(self.host)
                if type(relay) is int and relay != self.id:
                    return True
        return False
