"""The backend interface: how fiberrl asks a cluster for a job.

A backend turns a :class:`JobSpec` (a command, its environment and resource hints)
into a running job and answers questions about it. Adding a backend means writing
one subclass of :class:`Backend` and registering it (in :mod:`fiberrl.backends` or
through the ``fiberrl.backends`` entry-point group); nothing else in fiberrl changes.
"""
from __future__ import annotations

import abc
import enum
import getpass
import os
import secrets
import socket
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Generic, List, Optional, TypeVar


#: every job of one run (a root process and all it starts) carries the run's id here
RUN_ENV = "FIBERRL_RUN_ID"


def run_id() -> str:
    """This run's id: inherited by jobs, made up (``host-pid-xxxx``) in a root process."""
    value = os.environ.get(RUN_ENV)
    if not value:
        value = f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(2)}"
        os.environ[RUN_ENV] = value
    return value


def user_name() -> str:
    """The user this process runs as (the owner of the jobs it starts)."""
    try:
        return getpass.getuser()
    except Exception:  # no name for this uid (containers)
        return str(os.getuid())


_T = TypeVar("_T")


class PerProcess(Generic[_T]):
    """One object per process, made by ``factory`` on first use and shared by every
    backend of the process (a forked child makes its own: the parent's threads, which
    such an object runs, are not inherited)."""

    def __init__(self, factory: Callable[[], _T]) -> None:
        self._factory = factory
        self._lock = threading.Lock()
        self._pid: Optional[int] = None
        self._value: Optional[_T] = None

    def get(self) -> _T:
        """This process's object."""
        with self._lock:
            if self._pid != os.getpid():
                self._value, self._pid = self._factory(), os.getpid()
            return self._value


class JobState(enum.Enum):
    """Life-cycle states common to every backend."""

    PENDING = "pending"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"
    UNKNOWN = "unknown"

    @property
    def finished(self) -> bool:
        """True for states a job never leaves."""
        return self in (JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED)


@dataclass
class JobSpec:
    """What to run and what it needs.

    ``cpu`` is a number of CPUs, ``mem`` bytes, ``gpu`` a number of GPUs; ``None``
    leaves the backend's default. ``env`` holds the variables to *add* to the job's
    environment (the run's secret travels here, never in ``command``).
    ``pass_fds`` are file descriptors a same-machine backend may hand to the job.
    """

    command: List[str]
    env: Dict[str, str] = field(default_factory=dict)
    name: str = "fiberrl-job"
    cpu: Optional[float] = None
    mem: Optional[int] = None
    gpu: int = 0
    image: Optional[str] = None
    cwd: Optional[str] = None
    pass_fds: tuple = ()
    extra: Dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class JobInfo:
    """One fiberrl job as ``fiberrl ps`` lists it."""

    id: str
    backend: str
    name: str
    run: str
    state: str
    host: str = ""
    created: str = ""


@dataclass
class Job:
    """A handle on a submitted job. ``data`` is the backend's private state."""

    id: str
    backend: str
    spec: JobSpec
    host: Optional[str] = None
    pid: Optional[int] = None
    data: Any = None


@dataclass(frozen=True)
class JobStatus:
    """A job's state; for finished jobs, its exit code and a human-readable reason.

    ``exit_code`` follows ``multiprocessing``: 0, the ``sys.exit`` code, 1 for an
    uncaught exception, ``-N`` for death by signal N. ``reason`` says why a job
    ended abnormally (``"signal 9 (SIGKILL)"``, ``"OOMKilled"``, ``"TIMEOUT"``...).
    """

    state: JobState
    exit_code: Optional[int] = None
    reason: str = ""


class Backend(abc.ABC):
    """The handful of operations fiberrl needs from a cluster."""

    #: Registered name (``fiberrl.init(backend=name)``).
    name: str = ""
    #: True when jobs run on this machine and inherit ``JobSpec.pass_fds``.
    shares_host: bool = False
    #: True when jobs compute on this machine's CPUs, sharing its cores with this
    #: process (those of ``shares_host``, and containers of a dockerd on this machine).
    uses_local_cores: bool = False
    #: True when the jobs' output is forwarded to this process's stdout as it comes.
    forwards_output: bool = False

    @abc.abstractmethod
    def create_job(self, spec: JobSpec) -> Job:
        """Start a job for ``spec``; raise :class:`~fiberrl.errors.BackendError` if refused."""

    def create_jobs(self, specs: List[JobSpec]) -> List[Job]:
        """Start one job per spec, in one request where the backend can (Slurm: a job
        array); the default starts them one by one. All or nothing: if one is refused,
        those already started are killed and the error is raised."""
        jobs: List[Job] = []
        try:
            for spec in specs:
                jobs.append(self.create_job(spec))
        except BaseException:
            for job in jobs:
                self.terminate(job, force=True)
            raise
        return jobs

    @abc.abstractmethod
    def status(self, job: Job) -> JobStatus:
        """The job's current state (cheap enough to call a few times a second)."""

    def wait(self, job: Job, timeout: Optional[float] = None) -> Optional[JobStatus]:
        """Block until the job finishes or ``timeout`` passes; None on timeout."""
        deadline = None if timeout is None else time.monotonic() + timeout
        delay = 0.01
        while True:
            status = self.status(job)
            if status.state.finished:
                return status
            if deadline is not None and time.monotonic() >= deadline:
                return None
            pause = delay if deadline is None else min(delay, max(0.0, deadline - time.monotonic()))
            time.sleep(pause)
            delay = min(delay * 2, 0.5)

    @abc.abstractmethod
    def terminate(self, job: Job, force: bool = False) -> None:
        """Ask the job to stop (SIGTERM-like); ``force`` kills it (SIGKILL-like)."""

    @abc.abstractmethod
    def logs(self, job: Job, tail: int = 50) -> str:
        """The last ``tail`` lines of the job's output, as far as the backend kept them."""

    def notify_end(self, job: Job, callback: Callable[[], Any]) -> bool:
        """Call ``callback()`` (from any thread) once ``job`` has ended, if this backend
        hears of its jobs' ends as they happen; False if it does not (the default: the
        job watch then watches the job's process on this host, or asks :meth:`status`)."""
        return False

    def time_left(self, job: Job) -> Optional[float]:
        """Seconds until the backend stops ``job`` for its time limit (None: no limit)."""
        return None

    @abc.abstractmethod
    def listen_host(self) -> str:
        """The address this process's hub should bind so that this backend's jobs reach it."""

    # -- what the command line needs (jobs of earlier runs, known by id) ----------
    @abc.abstractmethod
    def list_jobs(self) -> List[JobInfo]:
        """This user's fiberrl jobs that the backend still knows (running or finished)."""

    @abc.abstractmethod
    def attach(self, job_id: str) -> Job:
        """A handle on an existing job (for ``logs``, ``status``, ``terminate``)."""

    def retire(self) -> None:
        """This backend stopped being the process's default (the configuration changed):
        free what only new jobs would use; the jobs it started keep working."""

    def close(self) -> None:
        """Release the backend's resources (threads, clients)."""
