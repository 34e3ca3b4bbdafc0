"""Run a function over small task objects on a ``fiberrl.Pool`` or in this process.

Data flow::

    coordinator ──task (paths, numbers)──> pool worker: reads its shard, writes files
         ^                                      │
         └──────── small result object ─────────┘   (counts, ids; never rows)

Results come back in completion order through ``apply_async`` callbacks (run on the
pool's I/O thread, which only puts them on a queue). When a task fails, a pool this
module started is terminated at once; a pool passed in by the caller is left running,
and the runner waits for the tasks it submitted before raising, so no task is
still writing into a directory the caller is about to remove.
"""
from __future__ import annotations

import logging
import queue
from typing import Any, Callable, Iterable, Iterator, Optional

logger = logging.getLogger(__name__)


def progress_bar(total: int, desc: str, enabled: bool):
    """A tqdm bar on stderr (tqdm turns itself off when stderr is not a terminal),
    or a silent stand-in when ``enabled`` is false or tqdm is not installed."""
    if enabled:
        try:
            from tqdm import tqdm
        except ImportError:  # pragma: no cover - tqdm is a listed dependency
            logger.info("tqdm is not installed; no progress bars")
        else:
            return tqdm(total=total, desc=desc, unit="task", disable=None, leave=False)
    return _NoBar()


class _NoBar:
    def update(self, n: int = 1) -> None:
        """Nothing to draw."""

    def close(self) -> None:
        """Nothing to close."""


class TaskRunner:
    """Runs ``func(task)`` for many tasks: on ``pool``, on a pool of ``workers``
    processes it starts itself (``workers > 1``), or in this process (``workers == 1``).

    Use as a context manager; a pool it started is closed and joined on exit
    (terminated if the block raised).
    """

    def __init__(self, workers: int = 1, pool: Any = None, progress: bool = False) -> None:
        if pool is None and (not isinstance(workers, int) or workers < 1):
            raise ValueError(f"workers must be a positive integer, got {workers!r}")
        self.workers = workers
        self.pool = pool
        self.progress = progress
        self._own = False

    def __enter__(self) -> "TaskRunner":
        if self.pool is None and self.workers > 1:
            import fiberrl
            self.pool = fiberrl.Pool(processes=self.workers)
            self._own = True
        return self

    def __exit__(self, exc_type: Any, *exc_info: Any) -> None:
        if self._own:
            pool, self.pool, self._own = self.pool, None, False
            if exc_type is None:
                pool.close()
            else:
                pool.terminate()
            pool.join()

    def imap(self, func: Callable[[Any], Any], tasks: Iterable[Any],
             desc: str = "") -> Iterator[Any]:
        """Results of ``func`` over ``tasks`` in completion order; the first task
        error is raised (after the other submitted tasks have settled)."""
        tasks = list(tasks)
        bar = progress_bar(len(tasks), desc, self.progress)
        try:
            if self.pool is None:
                for task in tasks:
                    result = func(task)
                    bar.update(1)
                    yield result
                return
            done: "queue.SimpleQueue" = queue.SimpleQueue()
            handles = [self.pool.apply_async(func, (task,), callback=lambda r: done.put((True, r)),
                                             error_callback=lambda e: done.put((False, e)))
                       for task in tasks]
            for _ in handles:
                ok, value = done.get()
                if not ok:
                    self._settle(handles)
                    raise value
                bar.update(1)
                yield value
        finally:
            bar.close()

    def _settle(self, handles: list) -> None:
        """Wait for submitted tasks of a caller's pool (ours is terminated instead)."""
        if self._own:
            return
        for handle in handles:
            handle.wait()


def run_all(runner: TaskRunner, func: Callable[[Any], Any], tasks: Iterable[Any],
            desc: str = "", key: Optional[Callable[[Any], Any]] = None) -> list:
    """Every result of ``runner.imap``, sorted by ``key`` when given."""
    results = list(runner.imap(func, tasks, desc))
    return sorted(results, key=key) if key is not None else results
