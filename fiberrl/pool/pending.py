"""The pending table: every task handed to a worker, until its result arrives.

When a worker is lost, all of its pending tasks go back to the front of the queue.
Which of them was *running* is certain only when the worker held one task: a worker
runs its tasks in order but may hold finished results for up to a millisecond before
sending them. So a death is counted against a task only when the task was alone on
its worker; every task of a lost worker is marked *suspect* and is next dispatched
alone, where a second death is attributed exactly. A task that was running on
``max_task_retries`` workers that died fails with :class:`~fiberrl.TaskRetryError`.

A task that *raised* in a pool with ``error_handling`` is not counted here: its result
completes it, and :mod:`.rerun` queues it again; once handed out again it is pending
like any other task, so a death while it runs again is a death as above.

Used only by the pool's I/O thread: no locks.
"""
from __future__ import annotations

from typing import Dict, List, Optional, Tuple

from .tasks import Task


class PendingTable:
    """Task id -> task, with each worker's tasks in the order they were handed out."""

    def __init__(self, max_task_retries: int) -> None:
        self.max_task_retries = max_task_retries
        self._tasks: Dict[int, Task] = {}
        self._by_worker: Dict[int, Dict[int, Task]] = {}
        self.retried = 0

    def __len__(self) -> int:
        return len(self._tasks)

    def held_by(self, worker_id: int) -> int:
        """How many tasks ``worker_id`` holds."""
        return len(self._by_worker.get(worker_id, ()))

    def assign_all(self, tasks: List[Task], worker_id: int) -> None:
        """Record that ``tasks`` were handed to ``worker_id``, in this order."""
        every = self._tasks
        mine = self._by_worker.get(worker_id)
        if mine is None:
            mine = self._by_worker[worker_id] = {}
        for task in tasks:
            task.worker = worker_id
            every[task.id] = task
            mine[task.id] = task

    def complete(self, task_id: int, worker_id: int) -> Optional[Task]:
        """Remove a finished task; None for a result of a task that was re-queued meanwhile."""
        task = self._tasks.get(task_id)
        if task is None or task.worker != worker_id:
            return None
        del self._tasks[task_id]
        del self._by_worker[worker_id][task_id]
        task.worker = None
        return task

    def worker_lost(self, worker_id: int, how: str) -> Tuple[List[Task], List[Task]]:
        """Take back a lost worker's tasks: ``(to_requeue, exhausted)``, in hand-out order."""
        held = list(self._by_worker.pop(worker_id, {}).values())
        for task in held:
            del self._tasks[task.id]
            task.worker = None
        if len(held) == 1:
            held[0].deaths += (how,)
        requeue, exhausted = [], []
        for task in held:
            if len(task.deaths) >= self.max_task_retries:
                exhausted.append(task)
            else:
                task.suspect = True
                requeue.append(task)
        self.retried += len(requeue)
        return requeue, exhausted

    def drain(self) -> List[Task]:
        """Remove and return every pending task (the pool is terminating)."""
        tasks = list(self._tasks.values())
        self._tasks.clear()
        self._by_worker.clear()
        return tasks
