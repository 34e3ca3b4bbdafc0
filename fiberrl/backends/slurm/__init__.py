"""The Slurm backend: each fiberrl process is a Slurm job (or a job step).

- ``create_job``: a batch script (``exec python -m fiberrl.spawn``) through
  ``sbatch --parsable``; the run's secret reaches the job through ``sbatch``'s
  environment (``--export=ALL``), never its command line or script.
- ``create_jobs`` (a pool starting N workers): one ``sbatch --array=0-(N-1)``; each
  array task picks its own token by ``SLURM_ARRAY_TASK_ID``. With ``workers_per_job=K``
  (a ``Pool`` keyword, or the ``slurm_workers_per_job`` setting), one array task per K
  jobs instead, each forking its K jobs from a warm fork server (:mod:`.warm`).
- Inside an allocation that a person made (``salloc``/``sbatch`` running the master),
  jobs are job steps (``srun --exact``) of that allocation: no queue wait.
- ``status``: one cached ``squeue`` for all jobs (:mod:`.slurm_jobs`), mapped to
  fiberrl's states with Slurm's reason (FAILED with exit code, CANCELLED, TIMEOUT,
  NODE_FAIL, out of memory, PREEMPTED); ``sacct`` when Slurm has forgotten a job.
- ``terminate``: ``scancel`` (SIGTERM, then SIGKILL after the cluster's KillWait);
  ``force``: ``scancel --signal=KILL``.
- ``logs``: each job writes its stdout and its stderr to two files under the run's
  log directory (on a file system the nodes share); their new lines are forwarded to
  this process's stdout and stderr, as the local backend does, unless the
  ``slurm_forward_output`` setting is false.

Settings (``fiberrl.init(extra={...})`` or ``FIBERRL_EXTRA``): ``slurm_partition``,
``slurm_account``, ``slurm_qos``, ``slurm_time_limit``, ``slurm_options`` (see
:mod:`.slurm_submit`), ``slurm_log_dir`` (default ``~/.fiberrl/slurm``),
``slurm_array`` (default true), ``slurm_steps`` (``auto``: steps inside an
allocation; ``never``), ``slurm_forward_output`` (default true),
``slurm_workers_per_job`` (default 1) and ``slurm_starting_per_job`` (see :mod:`.warm`).
"""
from __future__ import annotations

import logging
import os
import re
import shutil
import signal
import socket
import subprocess
import threading
import uuid
from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional

from ...config import get_config
from ...errors import BackendError
from .. import addresses
from . import submit as slurm_submit
from . import warm
from .. import output_files
from ..base import Backend, Job, JobInfo, JobSpec, JobState, JobStatus
from .jobs import UNKNOWN_JOB, JobTable, parse_duration, run_slurm, status_of

logger = logging.getLogger(__name__)

#: set in the environment of jobs this backend submitted with sbatch; a process that
#: has it runs in an allocation made by fiberrl, so it submits jobs, not steps
SUBMITTED_ENV = "FIBERRL_SLURM_SUBMITTED"


@dataclass
class _JobData:
    """The backend's private state for one job."""

    log: str                                 # the file its stdout goes to
    errors: Optional[str] = None             # the file its stderr goes to (None: log)
    step: Optional[subprocess.Popen] = None  # the srun client of a job step
    step_name: str = ""
    killed: bool = False
    final: Optional[JobStatus] = None
    warm: Optional[warm.WarmSlot] = None  # a job forked by a host job (see .warm)


def allocation_for_steps(setting: str = "auto") -> Optional[str]:
    """The allocation whose steps new jobs should be, or None to submit jobs.

    Steps are used inside an allocation a person made (``SLURM_JOB_ID`` set, not a job
    fiberrl submitted) unless the ``slurm_steps`` setting is ``never``.
    """
    if setting == "never" or SUBMITTED_ENV in os.environ:
        return None
    return os.environ.get("SLURM_JOB_ID") or None


#: slurmstepd's notice in a job's output when the job is cancelled; the job's exit
#: reason says the same, so it is not forwarded
_CANCEL_NOTICE = re.compile(rb"^slurmstepd[^:]*: error: \*\*\* (JOB|STEP) \S+ ON \S+ "
                            rb"CANCELLED AT \S+ .*\*\*\*\s*$")




class SlurmBackend(Backend):
    """Jobs through ``sbatch``/``srun``, watched with ``squeue``, stopped with ``scancel``."""

    name = "slurm"
    shares_host = False

    def __init__(self, listen_host: Optional[str] = None) -> None:
        if shutil.which("sbatch") is None:
            raise BackendError("the Slurm backend needs Slurm's client commands (sbatch, "
                               "squeue, scancel) on PATH; scripts/slurm-up.sh starts a "
                               "one-machine test cluster")
        cfg = get_config()
        self._extra: Mapping[str, Any] = cfg.extra
        self._listen_host = listen_host
        self._allocation = allocation_for_steps(str(self._extra.get("slurm_steps", "auto")))
        self._use_arrays = bool(self._extra.get("slurm_array", True))
        warm.workers_per_job(JobSpec(command=[]), self._extra)  # bad settings fail here
        warm.starting_per_job(self._extra, None)
        base = (self._extra.get("slurm_log_dir") or cfg.log_dir
                or os.path.join(os.path.expanduser("~"), ".fiberrl", "slurm"))
        self.run_dir = os.path.join(base, f"{socket.gethostname()}-{os.getpid()}-"
                                          f"{uuid.uuid4().hex[:6]}")
        os.makedirs(self.run_dir, exist_ok=True)
        self._table = JobTable()
        self._hosts: Dict[str, List[Job]] = {}  # host job id -> the jobs it forks
        self._step_hosts: Dict[str, Job] = {}   # host jobs that are steps of the allocation
        self._follower = (output_files.follower.get()
                          if self._extra.get("slurm_forward_output", True)
                          else None)
        self.forwards_output = self._follower is not None
        self._lock = threading.Lock()

    # -- submitting ---------------------------------------------------------------
    def create_job(self, spec: JobSpec) -> Job:
        return self.create_jobs([spec])[0]

    def create_jobs(self, specs: List[JobSpec]) -> List[Job]:
        if not specs:
            return []
        if len(specs) > 1 and slurm_submit.same_request(specs, self._extra):
            per_job = warm.workers_per_job(specs[0], self._extra)
            if per_job > 1:
                return self._submit_warm(specs, per_job)
            if self._use_arrays and not self._allocation:
                return self._submit(specs)
        if self._allocation:
            return super().create_jobs(specs) if len(specs) > 1 else [self._start_step(specs[0])]
        jobs: List[Job] = []
        try:
            for spec in specs:
                jobs += self._submit([spec])
        except BaseException:
            for job in jobs:
                self.terminate(job, force=True)
            raise
        return jobs

    def _submit(self, specs: List[JobSpec]) -> List[Job]:
        """One ``sbatch``: a single job, or an array with one task per spec."""
        shared = slurm_submit.shared_env(specs)
        script = os.path.join(self.run_dir, f"{uuid.uuid4().hex[:12]}.sh")
        with open(os.open(script, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o700), "w") as fh:
            fh.write(slurm_submit.batch_script(specs, shared))
        array = len(specs) > 1
        pattern = os.path.join(self.run_dir, "%A_%a" if array else "%j")
        command = slurm_submit.sbatch_command(specs, script, pattern + ".out", self._extra,
                                              error_pattern=pattern + ".err")
        env = {**os.environ, **shared, SUBMITTED_ENV: "1"}
        try:
            out = run_slurm(command, env=env)
        except BackendError as exc:
            os.unlink(script)
            asked = " ".join(slurm_submit.resource_options(specs[0], self._extra))
            slurm_says = str(exc).split(": ", 1)[-1]
            raise BackendError(f"Slurm refused {specs[0].name!r} "
                               f"({asked or 'no resource options'}): {slurm_says}") from None
        base_id = out.strip().split(";")[0]
        ids = [f"{base_id}_{i}" for i in range(len(specs))] if array else [base_id]
        self._table.track(ids, base_id)
        jobs = []
        for job_id, spec in zip(ids, specs):
            data = _JobData(log=os.path.join(self.run_dir, f"{job_id}.out"),
                            errors=os.path.join(self.run_dir, f"{job_id}.err"))
            jobs.append(Job(id=job_id, backend=self.name, spec=spec, data=data))
            self._follow(data)
        logger.debug("submitted %s (%d job(s)) for %s", base_id, len(ids), specs[0].name)
        return jobs

    def _submit_warm(self, specs: List[JobSpec], per_job: int) -> List[Job]:
        """Host jobs of ``per_job`` jobs each (see :mod:`.warm`): one array for the
        full ones, one more job for a remainder that asks for less; inside an
        allocation, one job step each."""
        shared = slurm_submit.shared_env(specs)
        groups = warm.groups(specs, per_job)
        dirs = warm.task_dirs(self.run_dir, uuid.uuid4().hex[:12], len(groups))
        hosts = []
        for group, task_dir in zip(groups, dirs):
            host = warm.host_spec(group, task_dir, shared, specs[0].command[0])
            warm.write_request(task_dir, group, shared,
                               warm.starting_per_job(self._extra, host, len(groups)))
            hosts.append(host)
        full = [h for g, h in zip(groups, hosts) if len(g) == per_job]
        submitted: List[Job] = []
        try:
            for batch in (full, hosts[len(full):]):
                if batch and self._allocation:
                    for host in batch:
                        submitted.append(self._start_step(host))
                        self._step_hosts[submitted[-1].id] = submitted[-1]
                elif batch:
                    submitted += self._submit(batch)
        except BaseException:
            for host in submitted:
                self.terminate(host, force=True)
            raise
        jobs = []
        for host, group, task_dir in zip(submitted, groups, dirs):
            warm.remember_host(self.run_dir, host.id, task_dir)
            forked = []
            for index, spec in enumerate(group):
                slot = warm.WarmSlot(host=host.id, task_dir=task_dir, index=index)
                data = _JobData(log=warm.log_path(task_dir, index),
                                errors=warm.error_path(task_dir, index), warm=slot)
                forked.append(Job(id=f"{host.id}.{index}", backend=self.name, spec=spec,
                                  data=data))
                self._follow(data)
            with self._lock:
                self._hosts[host.id] = forked
            jobs += forked
        logger.debug("%d job(s) on %d warm host job(s)", len(jobs), len(submitted))
        return jobs

    def _start_step(self, spec: JobSpec) -> Job:
        """A job step of the allocation this process runs in (``srun --exact``)."""
        step_name = f"{slurm_submit.job_name(spec)}-{uuid.uuid4().hex[:8]}"
        log = os.path.join(self.run_dir, f"{self._allocation}-{step_name}.out")
        errors = log[:-len(".out")] + ".err"
        step_spec = JobSpec(**{**spec.__dict__, "name": step_name})
        command = slurm_submit.srun_command(step_spec, self._allocation, log,
                                            slurm_submit.allocation_mem_per_cpu(os.environ),
                                            error_path=errors)
        try:
            srun = subprocess.Popen(command, env={**os.environ, **spec.env}, cwd=spec.cwd,
                                    stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                    stderr=subprocess.PIPE)
        except OSError as exc:
            raise BackendError(f"could not run srun for {spec.name!r}: {exc}") from exc
        job = Job(id=f"{self._allocation}:{step_name}", backend=self.name, spec=spec,
                  data=_JobData(log=log, errors=errors, step=srun, step_name=step_name))
        self._follow(job.data)
        return job

    def _follow(self, data: _JobData) -> None:
        """Forward a new job's stdout and stderr files as they grow (Slurm's own notice
        of a cancel left out: the job's end is reported, not printed)."""
        if self._follower is not None:
            self._follower.follow(data.log, drop=_CANCEL_NOTICE)
            if data.errors is not None:
                self._follower.follow(data.errors, drop=_CANCEL_NOTICE, to_fd=2)

    # -- watching -------------------------------------------------------------------
    def status(self, job: Job) -> JobStatus:
        data: _JobData = job.data
        if data.final is not None:
            return data.final
        if data.warm is not None:
            status = self._warm_status(job)
        elif data.step is not None:
            status = self._step_status(job)
        else:
            status = self._job_status(job)
        if status.state.finished:
            data.final = status
            self._job_ended(job)
        return status

    def _job_status(self, job: Job) -> JobStatus:
        data: _JobData = job.data
        record = self._table.record(job.id)
        if record is None:
            return JobStatus(JobState.PENDING)
        status = status_of(record, killed=data.killed)
        if status.state is JobState.RUNNING and job.host is None:
            job.host = record.get("NodeList") or None
        if status.state is JobState.FAILED and self._log_says_oom(data):
            status = status_of(record, killed=data.killed, oom=True)
        if status.state.finished:
            self._table.finished(job.id, record)
        return status

    def _warm_status(self, job: Job) -> JobStatus:
        slot: warm.WarmSlot = job.data.warm
        step = self._step_hosts.get(slot.host)
        if step is not None:   # a host job that is a step of the allocation
            host = self.status(step)
            if host.state.finished:
                with self._lock:
                    self._hosts.pop(slot.host, None)
            return slot.status(host, killed=job.data.killed)
        record = self._table.record(slot.host)
        host = None if record is None else status_of(record)
        if host is not None and host.state.finished:
            self._table.finished(slot.host, record)
            with self._lock:
                self._hosts.pop(slot.host, None)
            if self._follower is not None:
                for suffix in (".out", ".err"):
                    self._follower.finish(os.path.join(self.run_dir, slot.host + suffix))
        elif host is not None and host.state is JobState.RUNNING and job.host is None:
            job.host = record.get("NodeList") or None
        return slot.status(host, killed=job.data.killed)

    def _step_status(self, job: Job) -> JobStatus:
        data: _JobData = job.data
        code = data.step.poll()
        if code is None:
            return JobStatus(JobState.RUNNING)
        message = data.step.stderr.read().decode("utf-8", "replace").strip() if data.step.stderr else ""
        if code > 128:
            sig = code - 128
            reason = f"step killed by signal {sig} ({signal.Signals(sig).name})" if sig in \
                signal.valid_signals() else f"srun exit code {code}"
            if self._log_says_oom(data):
                reason = "out of memory: Slurm killed the step for using more than its --mem"
            return JobStatus(JobState.FAILED, -sig, reason)
        if code == 0:
            return JobStatus(JobState.SUCCEEDED, 0)
        return JobStatus(JobState.FAILED, code, message.splitlines()[-1] if message else
                         f"exit code {code}")

    @staticmethod
    def _log_says_oom(data: _JobData) -> bool:
        """Whether Slurm wrote that it killed the job for its memory (slurmstepd writes
        to the job's stderr file; to its one file when it has one)."""
        for path in filter(None, (data.errors, data.log)):
            try:
                with open(path, "rb") as fh:
                    fh.seek(0, os.SEEK_END)
                    fh.seek(max(0, fh.tell() - 8192))
                    tail = fh.read()
            except OSError:
                continue
            if b"exceeded memory limit" in tail or b"oom-kill" in tail.lower():
                return True
        return False

    def _job_ended(self, job: Job) -> None:
        data: _JobData = job.data
        if self._follower is not None:
            self._follower.finish(data.log)
            if data.errors is not None:
                self._follower.finish(data.errors)

    def wait(self, job: Job, timeout: Optional[float] = None) -> Optional[JobStatus]:
        data: _JobData = job.data
        if data.step is not None and data.final is None:
            try:
                data.step.wait(timeout)
            except subprocess.TimeoutExpired:
                return None
        return super().wait(job, timeout)

    def time_left(self, job: Job) -> Optional[float]:
        data: _JobData = job.data
        if data.final is not None:
            return None
        if data.step is not None or (data.warm and data.warm.host in self._step_hosts):
            job_id = self._allocation
            record = self._table.record(job_id, max_age=5.0) if job_id else None
            if record is None and job_id:
                self._table.track([job_id], job_id)
                record = self._table.record(job_id)
        else:
            record = self._table.record(data.warm.host if data.warm else job.id)
        if record is None or record.get("State", "").split()[0] != "RUNNING":
            return None
        if parse_duration(record.get("TimeLimit", "")) is None:
            return None
        left = parse_duration(record.get("TimeLeft", ""))
        return None if left is None else max(0.0, left - self._table.age())

    # -- stopping -------------------------------------------------------------------
    def terminate(self, job: Job, force: bool = False) -> None:
        data: _JobData = job.data
        if data.final is not None:
            return
        if force:
            data.killed = True
        if data.warm is not None:  # its host job signals it alone
            data.warm.request_signal(signal.SIGKILL if force else signal.SIGTERM)
            data.warm.stop_asked = True
            self._cancel_idle_host(data.warm.host)
            return
        target = job.id
        if data.step is not None:
            target = self._step_id(data.step_name)
            if target is None:  # not running yet (or already gone): stop its srun
                if data.step.poll() is None:
                    data.step.send_signal(signal.SIGKILL if force else signal.SIGTERM)
                return
        command = ["scancel", "--signal=KILL", "--full", target] if force else ["scancel", target]
        try:
            run_slurm(command, timeout=30.0)
        except BackendError as exc:
            if UNKNOWN_JOB in str(exc):   # it ended and Slurm forgot it, or the whole
                # array was cancelled while pending (squeue then lists only the array)
                logger.debug("Slurm job %s is already gone: %s", target, exc)
            else:
                logger.warning("could not cancel Slurm job %s: %s", target, exc)

    def _cancel_idle_host(self, host_id: str) -> None:
        """Cancel a host job that has not started yet once all its jobs were asked to
        stop (nobody would read their requests until it starts, maybe never)."""
        with self._lock:
            forked = self._hosts.get(host_id, [])
            if not forked or not all(j.data.warm.stop_asked for j in forked):
                return
            del self._hosts[host_id]
        step = self._step_hosts.get(host_id)
        if step is not None:   # a step starts at once: stop it if its agent never ran
            if step.data.step.poll() is None and self._step_id(step.data.step_name) is None:
                self.terminate(step, force=True)
            return
        record = self._table.record(host_id)
        if record is None or status_of(record).state is JobState.PENDING:
            try:
                run_slurm(["scancel", host_id], timeout=30.0)
            except BackendError as exc:
                logger.warning("could not cancel Slurm host job %s: %s", host_id, exc)

    def _step_id(self, step_name: str) -> Optional[str]:
        try:
            out = run_slurm(["squeue", "-h", "-s", f"--jobs={self._allocation}", "-o", "%i|%j"],
                            timeout=30.0)
        except BackendError:
            return None
        for line in out.splitlines():
            step_id, _, name = line.partition("|")
            if name.strip() == step_name:
                return step_id.strip()
        return None

    # -- the command line ---------------------------------------------------------------
    def list_jobs(self) -> List[JobInfo]:
        out = run_slurm(["squeue", "--me", "-h", "-t", "all", "-o", "%i|%j|%T|%N|%k|%V|%o"])
        jobs = []
        for line in out.splitlines():
            job_id, name, state, nodes, comment, submitted, command = (line.split("|") + [""] * 7)[:7]
            if comment.startswith(slurm_submit.COMMENT_PREFIX):
                info = JobInfo(id=job_id, backend=self.name, name=name, state=state,
                               run=comment[len(slurm_submit.COMMENT_PREFIX):], host=nodes,
                               created=submitted)
                jobs.append(info)
                jobs += self._forked_infos(info, command)
        return jobs

    def _forked_infos(self, host: JobInfo, command: str) -> List[JobInfo]:
        """Rows for the jobs a warm host job forks (``<host>.<n>``), found beside its log."""
        task_dir = warm.remembered_task_dir(os.path.dirname(command), host.id) if command else None
        if task_dir is None:
            return []
        rows = []
        for index in range(warm.forked_count(task_dir)):
            slot = warm.WarmSlot(host=host.id, task_dir=task_dir, index=index)
            code = slot.exit_code()
            state = host.state if code is None else ("COMPLETED" if code == 0 else "FAILED")
            rows.append(JobInfo(id=f"{host.id}.{index}", backend=self.name, name=host.name,
                                run=host.run, state=state, host=host.host, created=host.created))
        return rows

    def attach(self, job_id: str) -> Job:
        forked = warm.parse_forked_id(job_id)
        host_id = forked[0] if forked else job_id
        try:
            out = run_slurm(["scontrol", "-o", "show", "job", host_id])
        except BackendError as exc:
            raise BackendError(f"no Slurm job {host_id!r}: {exc}") from None
        fields = dict(token.split("=", 1) for token in out.split() if "=" in token)
        self._table.track([host_id], host_id.split("_")[0])
        spec = JobSpec(command=[], name=fields.get("JobName", job_id))
        if forked is None:
            out, err = fields.get("StdOut", ""), fields.get("StdErr", "")
            return Job(id=job_id, backend=self.name, spec=spec,
                       data=_JobData(log=out, errors=err if err and err != out else None))
        run_dir = os.path.dirname(fields.get("StdOut", ""))
        task_dir = warm.remembered_task_dir(run_dir, host_id)
        if task_dir is None or forked[1] >= warm.forked_count(task_dir):
            raise BackendError(f"Slurm job {host_id} forks no fiberrl job {job_id!r}")
        slot = warm.WarmSlot(host=host_id, task_dir=task_dir, index=forked[1])
        return Job(id=job_id, backend=self.name, spec=spec,
                   data=_JobData(log=warm.log_path(task_dir, forked[1]),
                                 errors=warm.error_path(task_dir, forked[1]), warm=slot))

    # -- the rest ---------------------------------------------------------------------
    def logs(self, job: Job, tail: int = 50) -> str:
        data: _JobData = job.data
        tails = [output_files.file_tail(path, tail) for path in (data.log, data.errors) if path]
        return "\n".join("\n".join(filter(None, tails)).splitlines()[-tail:])

    def listen_host(self) -> str:
        """See :mod:`.addresses`; outside a job, the address of the default route (what
        other nodes reach)."""
        from ..._wire.sockets import default_listen_host
        return addresses.listen_host(self._listen_host, default_listen_host)

    def close(self) -> None:
        try:
            os.rmdir(self.run_dir)  # only if the run left nothing in it
        except OSError:
            pass

