"""The pool's view of one connected worker, and the message that hands it tasks.

Used by the dispatcher (:mod:`.dispatch`) on the I/O loop only: no locks. The message's
layout is documented in :mod:`.worker`.
"""
from __future__ import annotations

import time
from typing import Any, List, Optional, Tuple

from .shared import LinkCache
from .tasks import MAP, Task
from .wire import PoolChannel


class WorkerLink:
    """The pool's view of one connected worker."""

    __slots__ = ("id", "channel", "pid", "host", "maps", "quota_left", "known", "drops", "cache",
                 "last_seen", "idle_since", "retiring", "dead", "solo", "hungry", "stop_sent",
                 "job_token")

    def __init__(self, worker_id: int, channel: PoolChannel, pid: int, host: str,
                 quota: Optional[int], cache_bytes: int, maps: bool = False) -> None:
        self.id = worker_id
        self.channel = channel
        self.pid = pid
        self.host = host
        self.maps = maps   # it maps this process's host segments (see .segments)
        self.quota_left = quota
        self.known: set = set()
        self.drops: List[int] = []
        self.cache = LinkCache(cache_bytes)   # the large arguments it holds (see .shared)
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
                    append((task.id, function.id, task.mode, stream, ()))
                continue
            layout, new, got = cache.encode(task.id, frames, task_buffers)
            added.extend(new)
            hits += got
            append((task.id, function.id, task.mode, frames[0], layout))
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
        :mod:`.segments`); others get the bytes."""
        adds, data, mapped = [], [], 0
        for entry in entries:
            segment = entry.host_segment() if self.maps else None
            if segment is not None:
                adds.append((entry.key, segment.reference()))
                mapped += 1
            else:
                adds.append((entry.key, None))
                data.append(entry.data)
        return adds, data, mapped
