"""The supervisor's workers, indexed so that its loop does not walk all of them.

The supervisor (:mod:`.supervisor`) loops every ``POLL`` seconds and on every event
(a hello, a loss): it needs how many workers are active and how many are still
starting, the workers to poll now (each still starting or stopping, and a slice of
the connected ones), and the record of a worker by id. Walking every record for that
made each new worker cost a pass over all the others: a pool's start-up grew with the
square of its size. Here each of those is O(1), or O(what is polled); a pass over
every worker (:meth:`Roster.all`) is left to what is rare (a shrink, close, terminate)
or timed (time limits, once a second), and counted in :attr:`Roster.scans`.
"""
from __future__ import annotations

import collections
import math
import time
from typing import Dict, Iterator, List, Optional, Set

from ..process import Process


class WorkerRecord:
    """The supervisor's view of one worker job."""

    def __init__(self, worker_id: int, process: Process) -> None:
        self.id = worker_id
        self.process = process
        self.started = time.monotonic()
        self.hello = False
        self.hello_at: Optional[float] = None
        self.retiring = False
        self.expected_exit = False
        self.stop_asked: Optional[float] = None
        self.init_error = ""
        self.lost_at: Optional[float] = None   # its connection closed; its job still runs
        self.lost_hint = ""


class Roster:
    """Worker records by id, with the sets the supervisor's loop reads."""

    def __init__(self) -> None:
        self.records: Dict[int, WorkerRecord] = {}
        self._no_hello: Set[int] = set()      # started, not said hello yet
        self._stopping: Set[int] = set()      # said hello, asked to stop
        self._connected: "collections.deque[int]" = collections.deque()  # polled in turn
        self.retiring = 0                     # records retiring (not counted as active)
        self.up = 0                           # said hello and not retiring
        self.scans = 0                        # passes over every record

    def __len__(self) -> int:
        return len(self.records)

    def get(self, worker_id: int) -> Optional[WorkerRecord]:
        """The record of ``worker_id``, if it is still on the roster."""
        return self.records.get(worker_id)

    def all(self) -> List[WorkerRecord]:
        """Every record (a pass over all workers: counted)."""
        self.scans += 1
        return list(self.records.values())

    def __iter__(self) -> Iterator[WorkerRecord]:
        return iter(self.all())

    @property
    def active(self) -> int:
        """Workers not retiring."""
        return len(self.records) - self.retiring

    @property
    def starting(self) -> int:
        """Workers that have not said hello yet (retiring ones included)."""
        return len(self._no_hello)

    # -- changes ----------------------------------------------------------------------
    def add(self, record: WorkerRecord) -> None:
        """A worker was started."""
        self.records[record.id] = record
        self._no_hello.add(record.id)

    def said_hello(self, record: WorkerRecord) -> None:
        """``record`` said hello: polled in turn from now on, unless asked to stop."""
        if not record.hello and not record.retiring:
            self.up += 1
        record.hello = True
        record.hello_at = time.monotonic()
        self._no_hello.discard(record.id)
        if record.stop_asked is None:
            self._connected.append(record.id)
        else:
            self._stopping.add(record.id)

    def retire(self, record: WorkerRecord) -> None:
        """``record`` is to finish what it holds and stop (no longer active)."""
        if not record.retiring:
            record.retiring = True
            self.retiring += 1
            if record.hello:
                self.up -= 1
        record.expected_exit = True
        self.ask_to_stop(record)

    def ask_to_stop(self, record: WorkerRecord) -> None:
        """``record`` was asked to stop: polled every loop from now on."""
        if record.stop_asked is None:
            record.stop_asked = time.monotonic()
        if record.hello:
            self._stopping.add(record.id)

    def remove(self, record: WorkerRecord) -> None:
        """``record`` is gone (its place in the polling turn is dropped lazily)."""
        if self.records.pop(record.id, None) is None:
            return
        if record.retiring:
            self.retiring -= 1
        elif record.hello:
            self.up -= 1
        self._no_hello.discard(record.id)
        self._stopping.discard(record.id)

    def clear(self) -> None:
        """Everyone is gone."""
        self.__init__()

    # -- the loop -----------------------------------------------------------------------
    def to_poll(self, share: float) -> List[WorkerRecord]:
        """Every worker still starting or stopping, and the next ``share`` of the
        connected ones (a fraction: each connected one once per ``1 / share`` calls)."""
        records = self.records
        polled = [records[i] for i in (*self._no_hello, *self._stopping)]
        turn = self._connected
        count = min(len(turn), math.ceil(len(turn) * share))
        for _ in range(count):
            worker_id = turn.popleft()
            record = records.get(worker_id)
            if record is None or record.stop_asked is not None:
                continue   # gone, or polled every loop now
            turn.append(worker_id)
            polled.append(record)
        return polled
