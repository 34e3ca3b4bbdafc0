"""What Slurm says about fiberrl's jobs: one cached ``squeue`` for all of them.

Every status question (the job watcher asks for each job several times a second)
is answered from a table refreshed by at most one ``squeue`` call per
:data:`REFRESH` seconds, asking only for the jobs this process submitted (finished
jobs stay visible for the cluster's ``MinJobAge``). A finished job's status is kept
and never asked for again. A job Slurm no longer knows is looked up in ``sacct``
when accounting exists.

:func:`status_of` maps Slurm's states to fiberrl's, with the exit code
``multiprocessing`` would give and a reason a person can act on.
"""
from __future__ import annotations

import logging
import signal
import subprocess
import threading
import time
from typing import Dict, Iterable, List, Mapping, Optional

from ...errors import BackendError
from ..base import JobState, JobStatus

logger = logging.getLogger(__name__)

REFRESH = 0.2
COMMAND_TIMEOUT = 60.0
FIELDS = ("JobArrayID", "State", "Reason", "exit_code", "TimeLeft", "TimeLimit", "NodeList")

_PENDING = {"PENDING", "CONFIGURING", "REQUEUED", "REQUEUE_FED", "REQUEUE_HOLD", "RESIZING",
            "SUSPENDED", "STOPPED", "SIGNALING", "STAGE_OUT", "RESV_DEL_HOLD"}
_RUNNING = {"RUNNING", "COMPLETING"}
GONE = "FIBERRL_GONE"  # our marker: Slurm has forgotten the job
#: what squeue and scancel say of a job id Slurm does not (or no longer) know
UNKNOWN_JOB = "Invalid job id"
_UNLIMITED = ("UNLIMITED", "INFINITE", "NOT_SET", "INVALID", "N/A", "")


def run_slurm(args: List[str], env: Optional[Mapping[str, str]] = None,
              timeout: float = COMMAND_TIMEOUT) -> str:
    """Run a Slurm command; its stdout, or a :class:`BackendError` with its stderr."""
    try:
        done = subprocess.run(args, env=env, stdin=subprocess.DEVNULL, capture_output=True,
                              text=True, timeout=timeout)
    except FileNotFoundError as exc:
        raise BackendError(f"{args[0]} not found: the Slurm backend needs Slurm's client "
                           "commands on PATH (scripts/slurm-up.sh starts a test cluster)") from exc
    except subprocess.TimeoutExpired as exc:
        raise BackendError(f"{args[0]} did not answer within {timeout:.0f} s "
                           "(is slurmctld up?)") from exc
    if done.returncode != 0:
        message = (done.stderr or done.stdout).strip() or f"exit code {done.returncode}"
        raise BackendError(f"{args[0]} failed: {message}")
    return done.stdout


def parse_duration(text: str) -> Optional[float]:
    """Slurm's ``[days-]hours:minutes:seconds`` (or ``minutes:seconds``) in seconds;
    None for unlimited or unknown."""
    text = text.strip()
    if text.upper() in _UNLIMITED:
        return None
    days = 0
    if "-" in text:
        head, text = text.split("-", 1)
        days = int(head)
    parts = [int(p) for p in text.split(":")]
    while len(parts) < 3:
        parts.insert(0, 0)
    hours, minutes, seconds = parts[-3:]
    return float(((days * 24 + hours) * 60 + minutes) * 60 + seconds)


def parse_squeue(text: str) -> Dict[str, Dict[str, str]]:
    """``squeue -O`` output (fields of :data:`FIELDS`, ``|``-terminated) by job id."""
    records = {}
    for line in text.splitlines():
        values = line.split("|")
        if len(values) < len(FIELDS):
            continue
        record = dict(zip(FIELDS, (v.strip() for v in values)))
        records[record["JobArrayID"]] = record
    return records


def signal_name(number: int) -> str:
    """``9`` -> ``"SIGKILL"``."""
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def status_of(record: Mapping[str, str], killed: bool = False,
              oom: bool = False) -> JobStatus:
    """fiberrl's view of one ``squeue`` record.

    ``killed``: fiberrl itself cancelled the job with SIGKILL (report ``-9`` as the
    stdlib does after ``Process.kill()``); ``oom``: the job's log shows Slurm killed
    it for going over ``--mem``.
    """
    state = record["State"].split()[0].rstrip("+")
    if state in _PENDING:
        return JobStatus(JobState.PENDING, reason=record.get("Reason", ""))
    if state in _RUNNING:
        return JobStatus(JobState.RUNNING)
    raw = int(record.get("exit_code") or 0)
    code, sig = raw >> 8, raw & 0x7F
    reason = record.get("Reason", "")
    if state == "COMPLETED":
        return JobStatus(JobState.SUCCEEDED, code)
    if state == "CANCELLED":
        sig = signal.SIGKILL if killed else (sig or signal.SIGTERM)
        return JobStatus(JobState.CANCELLED, -int(sig), f"CANCELLED (scancel, {signal_name(sig)})")
    if state == "OUT_OF_MEMORY" or oom:
        return JobStatus(JobState.FAILED, -(sig or signal.SIGKILL),
                         "out of memory: Slurm killed the job for using more than its --mem")
    if state == "TIMEOUT":
        return JobStatus(JobState.FAILED, -(sig or signal.SIGTERM),
                         "TIMEOUT: the job reached its time limit (--time)")
    if state == "NODE_FAIL":
        return JobStatus(JobState.FAILED, -int(signal.SIGKILL),
                         f"NODE_FAIL: node {record.get('NodeList') or '?'} failed")
    if state == "PREEMPTED":
        return JobStatus(JobState.FAILED, -(sig or signal.SIGTERM),
                         "PREEMPTED: a higher-priority job took the resources")
    if state == "FAILED":
        if sig:
            return JobStatus(JobState.FAILED, -sig, f"FAILED: killed by signal {sig} "
                             f"({signal_name(sig)}), Slurm reason {reason}")
        return JobStatus(JobState.FAILED, code or 1, f"FAILED with exit code {code}")
    if state == GONE:
        return JobStatus(JobState.FAILED, None, reason)  # the job's own report decides
    # BOOT_FAIL, DEADLINE, REVOKED, SPECIAL_EXIT: the job never ran or was removed
    return JobStatus(JobState.FAILED, 1, f"{state}: {reason}" if reason and reason != "None"
                     else state)


def sacct_record(job_id: str) -> Optional[Dict[str, str]]:
    """The job's record from Slurm's accounting, or None where accounting is off."""
    try:
        out = run_slurm(["sacct", "-n", "-P", "-X", "-j", job_id,
                         "-o", "JobID,State,ExitCode,NodeList"], timeout=20.0)
    except BackendError:
        return None
    for line in out.splitlines():
        job, state, exit_code, nodes = (line.split("|") + ["", "", "", ""])[:4]
        if job == job_id:
            code, _, sig = exit_code.partition(":")
            raw = (int(code or 0) << 8) | int(sig or 0)
            return {"JobArrayID": job, "State": state, "Reason": "", "exit_code": str(raw),
                    "TimeLeft": "", "TimeLimit": "", "NodeList": nodes}
    return None


class JobTable:
    """A cache of ``squeue`` records for the jobs this process submitted."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._tracked: Dict[str, str] = {}  # job id -> the id squeue is asked for
        self._records: Dict[str, Dict[str, str]] = {}
        self._finished: Dict[str, Dict[str, str]] = {}
        self._fetched_at = 0.0
        self._missing_since: Dict[str, float] = {}

    def track(self, job_ids: Iterable[str], query_id: str) -> None:
        """Follow ``job_ids``; ``query_id`` is what ``squeue --jobs`` needs (an array's id)."""
        with self._lock:
            for job_id in job_ids:
                self._tracked[job_id] = query_id
            self._fetched_at = 0.0

    def record(self, job_id: str, max_age: float = REFRESH) -> Optional[Dict[str, str]]:
        """The latest record of ``job_id`` (refreshed if older than ``max_age``)."""
        with self._lock:
            if job_id in self._finished:
                return self._finished[job_id]
            if time.monotonic() - self._fetched_at >= max_age:
                self._refresh()
            return self._records.get(job_id)

    def age(self) -> float:
        """Seconds since the last refresh."""
        return time.monotonic() - self._fetched_at

    def finished(self, job_id: str, record: Dict[str, str]) -> None:
        """Keep ``record`` for good and stop asking Slurm about ``job_id``."""
        with self._lock:
            self._finished[job_id] = record
            self._tracked.pop(job_id, None)
            self._records.pop(job_id, None)

    def _refresh(self) -> None:
        queries = sorted(set(self._tracked.values()))
        self._fetched_at = time.monotonic()
        if not queries:
            return
        try:
            out = run_slurm(["squeue", "-h", "-r", "-t", "all", f"--jobs={','.join(queries)}",
                             "-O", ",".join(f"{f}:|" for f in FIELDS)], timeout=30.0)
        except BackendError as exc:
            if UNKNOWN_JOB not in str(exc):
                logger.warning("squeue failed: %s", exc)
                return
            out = ""
        self._records = parse_squeue(out)
        now = time.monotonic()
        for job_id in list(self._tracked):
            if job_id in self._records:
                self._missing_since.pop(job_id, None)
                continue
            # Slurm forgets finished jobs after MinJobAge (and loses all on a restart
            # without state): ask accounting, else report the job as gone.
            first = self._missing_since.setdefault(job_id, now)
            if now - first < 2.0:
                continue
            record = sacct_record(job_id) or {
                "JobArrayID": job_id, "State": GONE, "exit_code": "0",
                "Reason": "Slurm no longer knows this job (and has no accounting)",
                "TimeLeft": "", "TimeLimit": "", "NodeList": ""}
            self._records[job_id] = record
