"""``Pool(error_handling=...)``: a task that raises runs again (Uber Fiber's meaning).

With the stdlib's default a task's exception goes to the caller at once. A pool made
with ``error_handling`` runs a task that raised again instead, up to
:data:`DEFAULT_ERROR_RETRIES` more times (or the int given), at the front of the
task queue, on whichever worker takes it; the caller gets the last run's exception
only when every run raised. Data flow (the dispatcher's I/O thread)::

    worker result (raised) --> Rerun.after() --> queue front --> any worker
                                   '--> (every run raised) --> the call, as an error

A map chunk is run item by item in such a pool's workers: an item that raises does
not stop its chunk-mates, the worker reports a :class:`ChunkErrors`, the chunk's
successful results wait in its :class:`Rerun`, and the next run sends only the
offsets of the items that raised. Worker deaths are counted apart, by the pending
table (``max_task_retries``): a task being run again is pending like any other task,
and is re-queued if its worker dies.
"""
from __future__ import annotations

import logging
from typing import Any, List, Optional, Tuple

from .tasks import Task, add_note

logger = logging.getLogger(__name__)

#: How many more times a pool with ``error_handling=True`` runs a task that raised.
#: Uber Fiber ran it again without limit, so a task that always raises ran forever;
#: five more runs let a task that raises on 5% of its runs through with a chance of
#: 1 in 64 million of six raises in a row, and show a real bug after six runs.
DEFAULT_ERROR_RETRIES = 5


def error_retries_of(error_handling: Any) -> int:
    """How many more times a task that raised runs, for ``Pool(error_handling=...)``:
    0 for False (the stdlib's behaviour), :data:`DEFAULT_ERROR_RETRIES` for True, or
    the non-negative int given."""
    if error_handling is True:
        return DEFAULT_ERROR_RETRIES
    if error_handling is False or error_handling is None:
        return 0
    if not isinstance(error_handling, int):
        raise TypeError("error_handling must be a bool or an int (how many more times a task "
                        f"that raised runs), got {type(error_handling).__name__}")
    if error_handling < 0:
        raise ValueError(f"error_handling must not be negative, got {error_handling}")
    return error_handling


class ChunkErrors:
    """A worker's report of a map chunk in which some items raised: every item it was
    asked to run ran; ``offsets`` are their places in the chunk, ``values`` their
    results (None where one raised) and ``errors`` maps the offset of each item that
    raised to its exception (with its traceback)."""

    __slots__ = ("offsets", "values", "errors")

    def __init__(self, offsets: List[int], values: List[Any], errors: dict) -> None:
        self.offsets = offsets
        self.values = values
        self.errors = errors

    def __reduce__(self):
        return ChunkErrors, (self.offsets, self.values, self.errors)


class Rerun:
    """A task that raised in a pool with ``error_handling`` (the I/O thread's only).

    ``runs_raised`` counts its runs that raised; for a chunk, ``results`` holds its
    items' results so far (by offset) and ``offsets`` the items the next run is to run.
    """

    __slots__ = ("runs_raised", "results", "offsets")

    def __init__(self) -> None:
        self.runs_raised = 0
        self.results: Optional[dict] = None
        self.offsets: Optional[List[int]] = None

    @staticmethod
    def after(task: Task, ok: bool, value: Any, error_retries: int) -> Optional[Tuple[bool, Any]]:
        """What to finish ``task`` with after a run that returned ``(ok, value)``:
        ``(ok, value)``, or None when it is to run again (the caller queues it)."""
        rerun = task.rerun
        if ok:   # a run after one that raised: the chunk's earlier results join in
            task.rerun = None
            return True, rerun._completed(task.size, value)
        if rerun is None:
            rerun = task.rerun = Rerun()
        rerun.runs_raised += 1
        error = rerun._took(value) if isinstance(value, ChunkErrors) else value
        if rerun.runs_raised > error_retries:
            add_note(error, f"error_handling: it raised on each of its {rerun.runs_raised} runs; "
                            "this is the last run's exception")
            return False, error
        logger.info("%s raised %s: running it again (run %d of at most %d)", task.describe(),
                    type(error).__name__, rerun.runs_raised + 1, error_retries + 1)
        return None

    def _took(self, report: ChunkErrors) -> BaseException:
        """Keep the results of the items that succeeded in ``report``; the ones that
        raised run next. Returns the exception of the first item that raised."""
        if self.results is None:
            self.results = {}
        for offset, value in zip(report.offsets, report.values):
            if offset not in report.errors:
                self.results[offset] = value
        self.offsets = sorted(report.errors)
        return report.errors[self.offsets[0]]

    def _completed(self, size: int, values: List[Any]) -> List[Any]:
        """The chunk's whole result list, once a run of the items at :attr:`offsets`
        returned ``values`` (in that order)."""
        if self.offsets is None:   # the whole task ran again (it raised as a whole)
            return values
        results = self.results
        results.update(zip(self.offsets, values))
        return [results[offset] for offset in range(size)]
