"""The pool's supervisor thread: starts workers, declares deaths, scales.

It owns the worker :class:`fiberrl.Process` objects (every backend call that may
block happens here, never in the I/O thread). It learns about workers from three
sources and turns each into one decision:

- the I/O thread's events (hello, connection closed, heartbeat missed, retiring);
- the backend's view, polled every 50 ms (a job that ended without a word), and
  every second the time left before each worker's job hits its time limit: a
  worker close to it is retired (it finishes its task) and a replacement started,
  so a long run outlives the backend's per-job walltime;
- the pool's API (resize, close, terminate, start_workers).

Callers of ``Pool.wait_until_workers_up`` wait on :attr:`Supervisor.changed`, which
is notified whenever a worker says hello, is lost, or fails to start.

A lost worker is declared to the I/O thread with the backend's reason (e.g. "killed
by signal 9 (SIGKILL)"), which re-queues its pending tasks; a replacement is started
at once. Workers that keep dying before they say hello (a broken initializer, a
missing module, a backend that refuses jobs) back off exponentially, and after
``max_task_retries`` such failures in a row the queued tasks fail with the reason
instead of waiting forever.
"""
from __future__ import annotations

import functools
import itertools
import logging
import os
import queue
import secrets
import signal
import threading
import time
from multiprocessing import process as _mp_process
from typing import Any, Callable, Dict, List, Optional, Sequence

from ..errors import JobFailedError
from ..popen import submit_together
from ..process import Process
from .roster import Roster, WorkerRecord
from .worker import INTERRUPTED_EXIT, run_worker

logger = logging.getLogger(__name__)

POLL = 0.05
#: seconds between polls of a connected worker's job: its death closes its connection,
#: which the I/O thread reports at once; polling all every POLL cost ~20 us per worker
#: 20 times a second (0.4 ms/s per worker idle, 4 CPU-s/s at 10,000 workers)
CONNECTED_POLL = 1.0
#: seconds a worker whose connection closed may take to end before it is declared lost
#: without the backend's reason (so that a lost node's workers are declared together,
#: within about this long, instead of one after the other)
LOST_GRACE = 2.0
STOP_GRACE = 10.0  # seconds a worker asked to stop may take before it is killed
UNREAPED_WAIT = 1.0  # seconds terminate() waits, in all, for workers killed when lost


class Supervisor:
    """Keeps ``target`` workers alive and tells the I/O thread about every loss."""

    def __init__(self, dispatcher: Any, target: int, name: str, worker_options: Dict[str, Any],
                 max_task_retries: int, idle_timeout: Optional[float],
                 time_limit_margin: float = 120.0) -> None:
        self.dispatcher = dispatcher
        self.events: "queue.SimpleQueue" = dispatcher.events
        self.target = target
        self.name = name
        self.worker_options = worker_options
        self.max_task_retries = max_task_retries
        self.idle_timeout = idle_timeout
        self.roster = Roster()
        self.unreaped: List[Process] = []  # declared lost, killed, not yet ended
        self.losing: Dict[int, WorkerRecord] = {}  # connection closed, job not yet ended
        self.worker_deaths = 0
        self.time_limit_replacements = 0
        self.time_limit_margin = time_limit_margin
        self._next_time_check = 0.0
        self.closing = False
        self.shutting_down = False
        self.terminating = False
        # Jobs on this host compete for its CPUs while their interpreters start: start
        # at most one per CPU at a time, so the first worker is up (and tasks flow)
        # sooner. Cluster backends start every worker at once.
        from ..backends import default_backend
        self.backend = default_backend()
        self.max_starting = (os.cpu_count() or 1) if self.backend.shares_host else None
        self._ids = itertools.count(1)
        self._start_failures = 0
        self._backoff_until = 0.0
        self.started_total = 0  # workers ever started (the stdlib starts ``processes``)
        self.eager = False      # start_workers(): bring every worker up without work
        self.start_error: Optional[BaseException] = None  # workers keep failing to start
        self.changed = threading.Condition()   # a worker came up, was lost or failed
        self.thread = threading.Thread(target=self._run, name="fiberrl-pool-supervisor", daemon=True)

    # -- API-side requests (any thread) -------------------------------------------
    def request(self, kind: str, value: Any = None) -> None:
        self.events.put((kind, 0, value))

    def processes(self) -> List[Process]:
        return [r.process for r in self.roster]

    def workers_up(self) -> int:
        """Workers that said hello and are not being retired (any thread)."""
        return self.roster.up

    def wait_changed(self, timeout: float) -> None:
        """Block until :attr:`changed` is notified or ``timeout`` seconds pass."""
        with self.changed:
            self.changed.wait(timeout)

    def _notify(self) -> None:
        with self.changed:
            self.changed.notify_all()

    # -- the thread ------------------------------------------------------------------
    def _run(self) -> None:
        try:
            self._scale()   # the first workers start now, not after a first poll
            while True:
                self._handle_events()
                if not self.dispatcher.running():
                    self.terminating = True  # nothing can reach workers any more
                if self.terminating:
                    self._kill_all()
                    break
                self._reap()
                self._replace_expiring()
                if self.shutting_down:
                    self._start_owed()
                    self._wind_down()
                    if not len(self.roster):
                        break
                else:
                    self._scale()
        except Exception:
            logger.exception("the pool's supervisor failed; killing its workers")
            self._kill_all()
        finally:
            self.dispatcher.stop()
            self._notify()

    def _handle_events(self) -> None:
        try:
            event = self.events.get(timeout=POLL)
        except queue.Empty:
            return
        while True:
            self._on_event(*event)
            try:
                event = self.events.get_nowait()
            except queue.Empty:
                return

    def _on_event(self, kind: str, worker_id: int, value: Any) -> None:
        record = self.roster.get(worker_id)
        if kind == "hello" and record is not None:
            self.roster.said_hello(record)
            self._start_failures = 0
            self.start_error = None
            self._notify()
        elif kind == "disconnected" and record is not None:
            self._lost(record, value)
        elif kind == "unresponsive" and record is not None:
            logger.warning("pool worker %d (job %s): %s; killing it", worker_id,
                           record.process.job_id, value)
            record.process.kill()
            self._lost(record, value)
        elif kind in ("retiring", "released") and record is not None:
            self.roster.retire(record)
        elif kind == "init_failed" and record is not None:
            record.init_error = value
        elif kind == "start_workers":
            self.eager = True
        elif kind == "resize":
            self.target = value
        elif kind == "close":
            self.closing = True
        elif kind == "drained" and self.closing:
            self.shutting_down = True
        elif kind == "terminate":
            self.terminating = True

    def _describe(self, record: WorkerRecord) -> str:
        process = record.process
        reason = process.exit_reason or f"exit code {process.exitcode}"
        return f"worker {record.id} (job {process.job_id}) {reason}"

    def _lost(self, record: WorkerRecord, hint: str) -> None:
        """Declare ``record`` gone, with the backend's reason when it has one.

        A worker whose job has not ended yet (its connection just closed) gets
        LOST_GRACE seconds to end, checked by :meth:`_reap`; the supervisor never
        waits on one worker, so a node's many workers are declared together.
        """
        process = record.process
        if process.exitcode is None and record.lost_at is None:
            record.lost_at, record.lost_hint = time.monotonic(), hint
            self.losing[record.id] = record
            return
        self.losing.pop(record.id, None)
        if process.exitcode is None:
            process.kill()  # its tasks are re-run now; the job is reaped later
        interrupted = process.exitcode in (INTERRUPTED_EXIT, -signal.SIGINT)
        if "heartbeat" in hint:
            how = f"worker {record.id} (job {process.job_id}) sent {hint} and was killed"
        elif interrupted:
            how = f"worker {record.id} (job {process.job_id}) interrupted (SIGINT)"
        elif process.exitcode is not None:
            how = self._describe(record)
        else:
            how = f"worker {record.id} (job {process.job_id}): {hint}"
        # Ctrl-C reaches every process of the terminal's group: the caller is being
        # interrupted too, so an interrupted worker is no loss to warn about
        unexpected = not record.expected_exit and not self.shutting_down and not interrupted
        if unexpected:
            self.worker_deaths += 1
            logger.warning("pool %s: %s", self.name, how)
        if not record.hello and not self.shutting_down and not self.terminating:
            self._start_failed(record, how)
        self.roster.remove(record)
        self._notify()
        self.dispatcher.call_soon(lambda: self.dispatcher.worker_lost(record.id, how, unexpected))
        if process.exitcode is None:
            self.unreaped.append(process)
            return
        _forget(process)

    def _start_failed(self, record: WorkerRecord, how: str) -> None:
        try:
            log_tail = record.init_error or record.process.job_logs(20)
        except Exception:
            log_tail = record.init_error
        self._count_start_failure(lambda: JobFailedError(
            f"pool workers keep failing to start ({self._start_failures} in a row)",
            job_id=record.process.job_id, reason=how, log_tail=log_tail))

    def _count_start_failure(self, make_error: Callable[[], BaseException]) -> None:
        """Back off after a worker that never came up; after ``max_task_retries`` such
        failures in a row, fail the queued tasks with the error ``make_error`` builds."""
        self._start_failures += 1
        self._backoff_until = time.monotonic() + min(10.0, 0.25 * 2 ** self._start_failures)
        if self._start_failures >= self.max_task_retries:
            error = make_error()
            logger.error("%s", error)
            self.start_error = error
            self._notify()
            self.dispatcher.call_soon(lambda: self.dispatcher.fail_queued(error))

    def _reap(self) -> None:
        now = time.monotonic()
        for record in list(self.losing.values()):
            if record.process.exitcode is not None or now - record.lost_at > LOST_GRACE:
                self._lost(record, record.lost_hint)
        for process in list(self.unreaped):
            if process.exitcode is not None:
                self.unreaped.remove(process)
                _forget(process)
        # every worker starting or stopping, and each connected one once per CONNECTED_POLL
        for record in self.roster.to_poll(POLL / CONNECTED_POLL):
            if record.lost_at is not None:
                continue
            if record.process.exitcode is not None:
                self._lost(record, "the job ended")
            elif record.stop_asked and time.monotonic() - record.stop_asked > STOP_GRACE:
                logger.warning("pool worker %d did not stop within %.0f s; killing it",
                               record.id, STOP_GRACE)
                record.process.kill()

    def _active(self) -> List[WorkerRecord]:
        return [r for r in self.roster if not r.retiring]

    def _scale(self) -> None:
        roster = self.roster
        active = roster.active
        desired = self.target
        if self.eager and active - roster.starting >= desired:
            self.eager = False   # all up: from now on idle workers may be released again
        if (self.idle_timeout is not None and not self.eager
                and not self.dispatcher.has_work()):
            desired = min(desired, active)
        if active < desired and time.monotonic() >= self._backoff_until:
            wanted = desired - active
            if self.max_starting is not None:   # (retiring workers that never said
                wanted = min(wanted, self.max_starting - roster.starting)   # hello count)
            if wanted > 0:
                self._start_workers(wanted)
        elif active > desired:
            self._retire(sorted(self._active(), key=lambda r: (
                r.hello, self.dispatcher.pending.held_by(r.id)))[:active - desired])

    def _retire(self, records: Sequence[WorkerRecord]) -> None:
        for record in records:
            self.roster.retire(record)
            if not record.hello:
                record.process.terminate()
            else:
                self.dispatcher.call_soon(functools.partial(self.dispatcher.retire, record.id))

    def _start_workers(self, count: int) -> None:
        """Start ``count`` workers in one submission (one job array on Slurm)."""
        options = self.worker_options
        started: List[WorkerRecord] = []
        try:
            with submit_together():
                for _ in range(count):
                    worker_id, token = next(self._ids), secrets.token_hex(8)
                    self.dispatcher.call_soon(functools.partial(
                        self.dispatcher.expect, worker_id, token, options["maxtasks"]))
                    process = Process(target=run_worker, name=f"{self.name}-worker-{worker_id}",
                                      daemon=True, **options.get("resources", {}),
                                      args=(self.dispatcher.address, worker_id, token,
                                            options["initializer"], options["initargs"],
                                            options["maxtasks"], options["heartbeat_interval"],
                                            options["error_handling"],
                                            self.dispatcher.broadcast.probe_ref))
                    process.start()
                    self.dispatcher.call_soon(functools.partial(
                        self.dispatcher.job_started, worker_id, process._popen._token))
                    started.append(WorkerRecord(worker_id, process))
        except Exception as exc:
            logger.error("pool %s could not start %d worker(s): %s", self.name, count, exc)
            message = f"the backend cannot start pool workers: {exc}"
            self._count_start_failure(lambda: JobFailedError(message))
            return
        for record in started:
            self.roster.add(record)
        self.started_total += len(started)

    def _start_owed(self) -> None:
        """After close(): start the workers the pool owes, so that, as in the stdlib,
        each of its ``processes`` workers starts and runs the initializer even when no
        task was submitted (they are stopped as soon as they say hello)."""
        owed = self.target - self.started_total
        if owed <= 0 or time.monotonic() < self._backoff_until:
            return
        if self.max_starting is not None:
            owed = min(owed, self.max_starting - self.roster.starting)
        if owed > 0:
            self._start_workers(owed)

    def _replace_expiring(self) -> None:
        """Retire workers whose job nears its time limit; ``_scale`` starts replacements.

        A worker is retired when its job has less than ``time_limit_margin`` seconds
        left (at most half its whole time limit, so short limits do not churn)."""
        now = time.monotonic()
        if now < self._next_time_check or self.shutting_down:
            return
        self._next_time_check = now + 1.0
        for record in self._active():
            job = record.process._popen.job if record.process._popen is not None else None
            if not record.hello or job is None:
                continue
            left = self.backend.time_left(job)
            if left is None:
                continue
            margin = min(self.time_limit_margin, (now - record.hello_at + left) / 2)
            if left <= margin:
                logger.info("pool %s: worker %d (job %s) reaches its time limit in %.0f s; "
                            "replacing it", self.name, record.id, job.id, left)
                self.time_limit_replacements += 1
                self._retire([record])

    def _wind_down(self) -> None:
        """After close(): workers that said hello are told to stop (and killed if they
        linger); a worker still starting is left to run its initializer and say hello
        first, as the stdlib's workers do. One that dies before is reaped as usual."""
        for record in self.roster:
            if record.stop_asked is None and record.hello:
                record.expected_exit = True
                self.roster.ask_to_stop(record)

    def _kill_all(self) -> None:
        # those killed when declared lost get one second, together, to end: a node's
        # worth of workers on a node that vanished must not hold the pool a second each
        deadline = time.monotonic() + UNREAPED_WAIT
        for process in self.unreaped:
            process.join(max(0.0, deadline - time.monotonic()))
            if process.exitcode is not None:
                _forget(process)
        self.unreaped.clear()
        for record in self.roster:
            record.expected_exit = True
            try:
                record.process.kill()
            except Exception:
                logger.debug("kill of worker %d failed", record.id, exc_info=True)
        deadline = time.monotonic() + 10.0
        for record in self.roster:
            record.process.join(max(0.1, deadline - time.monotonic()))
            if record.process.exitcode is None:
                logger.warning("pool worker %d (job %s) did not exit after SIGKILL", record.id,
                               record.process.job_id)
            else:
                _forget(record.process)
        self.roster.clear()


def _forget(process: Process) -> None:
    """Drop an ended worker from the stdlib's set of children, as ``close()`` would,
    but leave its object usable: as the stdlib's pool, this pool never closes its
    workers, whose objects callers may still hold (``pool._pool``) and ask
    ``is_alive()``. Its descriptors, if any were made, go with the object."""
    _mp_process._children.discard(process)
