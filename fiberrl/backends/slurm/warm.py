"""Warm worker hosts: many fiberrl jobs forked from one Slurm job (the master's side).

With ``workers_per_job=K`` (a ``Pool``/``Process`` keyword or ``@fiberrl.meta`` hint,
or the ``slurm_workers_per_job`` setting; default 1: one Slurm job per worker), a
submission of N jobs becomes ceil(N/K) *host jobs* (one ``sbatch`` array), each asking
for K times one job's CPUs and memory, so that Slurm places it on one node. A host job
runs :mod:`.agent`: it starts the local backend's fork server there, which imports
fiberrl once, and forks its K jobs from it. A forked job costs what its own pages
cost (a few MiB), not a whole interpreter, and a node starts two interpreters instead
of K at once (the start storm of ``docs/scale.md``).

Data flow (files in the run's log directory, on a file system the nodes share, as the
jobs' logs already are)::

    master                                              host job on a node
    <task dir>/workers.json (0600) ---- sbatch ---->   agent: fork server, K forks
    status(job):   <task dir>/w<n>.exit  <---------    written when job n is reaped
                   + squeue of the host job             (its end ends all its jobs)
    terminate(job): <task dir>/w<n>.kill<SIG> ------>  seen within POLL s: signal job n
    logs(job):     <task dir>/w<n>.out   <---------    job n's stdout
                   <task dir>/w<n>.err   <---------    job n's stderr

Each forked job is still a job to the runtime, with its own id
``<host job id>.<n>`` (``1234_5.3``: job 3 of array task 5; not a Slurm step), its own
one-time token, connection and heartbeats: ``kill()`` of one signals that process
alone, and its siblings run on. The host job's end (``scancel``, a node lost, its time
limit) ends every job it forked, and each is reported with the host job's reason.
``workers.json`` is JSON (never a pickle) and holds each job's variables but the
ones common to all (the run's secret among them), which reach the host job through
``sbatch``'s environment, as for plain jobs.

Start storms: a host job starts at most ``slurm_starting_per_job`` of its workers at a
time (default: one per CPU it holds, as the local backend does, and no more than
:data:`MASTER_STARTING` over all host jobs of one submission), the next when one
has connected to the master (it says so on a pipe, ``FIBERRL_STARTED_FD``) or ended:
a master on a few cores is not asked for thousands of handshakes at once.

Where warm hosts are not used although asked for: a single job (a lone ``Process``, a
replacement for one lost worker: a host job for one would start two interpreters).
Inside an allocation (see :func:`~.allocation_for_steps`) each host job is a job step
of it, ``srun --exact``, whose status is its ``srun``'s.
"""
from __future__ import annotations

import json
import math
import os
import re
from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional, Sequence

from ...errors import ConfigError
from ..base import JobSpec, JobState, JobStatus

#: the Pool/Process keyword (resource hint) and the setting that default it
HINT = "workers_per_job"
SETTING = "slurm_workers_per_job"
#: the setting for how many of a host job's workers may be starting (not yet connected
#: to the master) at once; default: one per CPU of the host job, as the local backend
#: does, but no more than MASTER_STARTING over all the host jobs of one submission
STARTING_SETTING = "slurm_starting_per_job"
#: handshakes one submission asks of the master at once by default: 1,024 workers
#: starting together overran a master on 2 cores (docs/scale.md); 64 did not
MASTER_STARTING = 64
#: what a host job runs (``python -m`` this module, the task directory)
AGENT_MODULE = "fiberrl.backends.slurm.agent"
REQUEST_FILE = "workers.json"
#: beside a host job's log: ``<host job id>.warm`` holds its task directory
HOST_MARKER = ".warm"
#: seconds between the agent's looks for kill requests and ended jobs
POLL = 0.1
_KILL = re.compile(r"^w(\d+)\.kill(\d+)$")


def check_workers_per_job(value: Any, where: str = HINT) -> int:
    """``value`` as a number of jobs per host job: a positive int, else TypeError
    (not an int) or ValueError (below 1), naming ``where`` it came from."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{where} must be a positive int (jobs per Slurm job), got {value!r}")
    if value < 1:
        raise ValueError(f"{where} must be at least 1, got {value!r}")
    return value


def workers_per_job(spec: JobSpec, config_extra: Mapping[str, Any]) -> int:
    """How many jobs like ``spec`` share one host job: its hint, else the setting, else 1."""
    if HINT in spec.extra:
        return check_workers_per_job(spec.extra[HINT])
    value = config_extra.get(SETTING, 1)
    try:
        return check_workers_per_job(value, SETTING)
    except (TypeError, ValueError) as exc:
        raise ConfigError(str(exc)) from None


def starting_per_job(config_extra: Mapping[str, Any], host: Optional[JobSpec],
                     hosts: int = 1) -> int:
    """How many of ``host``'s workers it starts at once: the setting, else its CPUs but
    at most a share of :data:`MASTER_STARTING` among the ``hosts`` host jobs submitted
    with it."""
    value = config_extra.get(STARTING_SETTING)
    if value is None:
        cpus = max(1, int(host.cpu or 1)) if host is not None else 1
        return max(1, min(cpus, MASTER_STARTING // max(1, hosts)))
    try:
        return check_workers_per_job(value, STARTING_SETTING)
    except (TypeError, ValueError) as exc:
        raise ConfigError(str(exc)) from None


def groups(specs: Sequence[JobSpec], per_job: int) -> List[List[JobSpec]]:
    """``specs`` cut into host jobs of ``per_job`` (the last may hold fewer)."""
    return [list(specs[i:i + per_job]) for i in range(0, len(specs), per_job)]


def host_spec(group: Sequence[JobSpec], task_dir: str, shared: Mapping[str, str],
              python: str) -> JobSpec:
    """The host job for ``group``: the sum of its jobs' resources, the agent's command."""
    first = group[0]
    count = len(group)
    cpu = count * math.ceil(first.cpu) if first.cpu else count
    return JobSpec(command=[python, "-m", AGENT_MODULE, task_dir], env=dict(shared),
                   name=f"{first.name}+{count - 1}" if count > 1 else first.name,
                   cpu=cpu, mem=count * first.mem if first.mem else None,
                   gpu=count * first.gpu, cwd=first.cwd,
                   extra={k: v for k, v in first.extra.items() if k != HINT})


def write_request(task_dir: str, group: Sequence[JobSpec], shared: Mapping[str, str],
                  max_starting: int) -> None:
    """Write what the agent of ``task_dir`` forks: each job's own variables and command,
    and how many may be starting at once."""
    os.makedirs(task_dir, mode=0o700)
    request = {"cwd": group[0].cwd or os.getcwd(), "max_starting": max_starting,
               "jobs": [{"command": list(spec.command),
                         "env": {k: v for k, v in spec.env.items() if k not in shared}}
                        for spec in group]}
    path = os.path.join(task_dir, REQUEST_FILE)
    with open(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w") as fh:
        json.dump(request, fh)


def read_request(task_dir: str) -> Dict[str, Any]:
    """The agent's side of :func:`write_request` (checked: it is JSON from a file)."""
    with open(os.path.join(task_dir, REQUEST_FILE)) as fh:
        request = json.load(fh)
    jobs = request.get("jobs") if isinstance(request, dict) else None
    if not isinstance(jobs, list) or not all(
            isinstance(j, dict) and isinstance(j.get("env"), dict)
            and isinstance(j.get("command"), list) for j in jobs):
        raise ValueError(f"malformed {REQUEST_FILE} in {task_dir}")
    return request


def log_path(task_dir: str, index: int) -> str:
    """Where job ``index`` of a host job writes its stdout."""
    return os.path.join(task_dir, f"w{index}.out")


def error_path(task_dir: str, index: int) -> str:
    """Where job ``index`` of a host job writes its stderr."""
    return os.path.join(task_dir, f"w{index}.err")


def exit_path(task_dir: str, index: int) -> str:
    """Where the agent records job ``index``'s exit code."""
    return os.path.join(task_dir, f"w{index}.exit")


def kill_requests(names: Sequence[str]) -> List[tuple]:
    """``(index, signal)`` for each kill request among a task directory's file names."""
    found = []
    for name in names:
        match = _KILL.match(name)
        if match:
            found.append((int(match.group(1)), int(match.group(2))))
    return found


@dataclass
class WarmSlot:
    """Where one forked job lives: its host job, that job's directory, its index."""

    host: str
    task_dir: str
    index: int
    stop_asked: bool = False

    def exit_code(self) -> Optional[int]:
        """The exit code the agent recorded, or None while the job runs (or if never)."""
        try:
            with open(exit_path(self.task_dir, self.index)) as fh:
                return int(fh.read().strip())
        except (OSError, ValueError):
            return None

    def request_signal(self, sig: int) -> None:
        """Ask the agent to send ``sig`` to this job (it looks every :data:`POLL` s)."""
        path = os.path.join(self.task_dir, f"w{self.index}.kill{int(sig)}")
        try:
            os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
        except FileExistsError:
            pass

    def status(self, host: Optional[JobStatus], killed: bool = False) -> JobStatus:
        """This job's status, from its exit file and ``host`` (the host job's status,
        None while Slurm does not list it yet)."""
        code = self.exit_code()
        if code is None and host is not None and host.state.finished:
            code = self.exit_code()  # the agent writes exit files before it exits
            if code is None:
                return JobStatus(JobState.FAILED, host.exit_code if (host.exit_code or 0) < 0
                                 else -9, f"its host job {self.host} ended: "
                                 f"{host.reason or host.state.value}")
        if code is not None:
            if code == 0:
                return JobStatus(JobState.SUCCEEDED, 0)
            from ..local import describe_exit
            reason = describe_exit(code)
            if killed and code < 0:
                reason += " (killed by fiberrl)"
            return JobStatus(JobState.FAILED, code, reason)
        if host is None or host.state is JobState.PENDING:
            return JobStatus(JobState.PENDING, reason=host.reason if host else "")
        return JobStatus(JobState.RUNNING)


_FORKED_ID = re.compile(r"^(\d+(?:_\d+)?)\.(\d+)$")


def parse_forked_id(job_id: str) -> Optional[tuple]:
    """``(host job id, index)`` of a forked job's id (``1234_5.3``), else None."""
    match = _FORKED_ID.match(job_id)
    return (match.group(1), int(match.group(2))) if match else None


def remember_host(run_dir: str, host_id: str, task_dir: str) -> None:
    """Note which task directory host job ``host_id`` serves, beside its log, so that
    ``fiberrl ps``/``logs``/``cancel`` in another process find its forked jobs."""
    path = os.path.join(run_dir, f"{host_id}{HOST_MARKER}")
    with open(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as fh:
        fh.write(task_dir)


def remembered_task_dir(run_dir: str, host_id: str) -> Optional[str]:
    """The task directory :func:`remember_host` noted for ``host_id``, if any."""
    try:
        with open(os.path.join(run_dir, f"{host_id}{HOST_MARKER}")) as fh:
            return fh.read().strip() or None
    except OSError:
        return None


def forked_count(task_dir: str) -> int:
    """How many jobs the host job of ``task_dir`` forks (0 if its request is unreadable)."""
    try:
        return len(read_request(task_dir)["jobs"])
    except (OSError, ValueError):
        return 0


def task_dirs(run_dir: str, key: str, count: int) -> List[str]:
    """The task directories of one submission of ``count`` host jobs."""
    return [os.path.join(run_dir, f"warm-{key}", f"t{i}") for i in range(count)]
