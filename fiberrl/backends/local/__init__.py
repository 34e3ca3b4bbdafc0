"""The local backend: each job is a subprocess of this machine.

Jobs that run fiberrl's own entry point (every ``Process`` and pool worker) are
forked from a warm fork server (:mod:`fiberrl.backends.local.forkserver`) unless the
``forkserver`` setting is off (the first job of a process is started as a new
interpreter, or given to the spare interpreter ``Pool()`` started for it:
:mod:`fiberrl._runtime.spare`; the second starts the server and waits for it); other
commands, and any job the server cannot take, are started with ``subprocess``.
Either way a job of fiberrl's entry point starts with SIGINT blocked until it is ready to take it (:mod:`fiberrl._runtime.interrupts`). A
job's stdout and stderr (its own pipes, or for a forked job what its fork server
relays on its one control socket) are pumped by one selector thread
(``fiberrl-output``) to this process's own stdout/stderr, so ``print`` in a child
shows up as it does with ``multiprocessing``, while the last lines are kept for
error messages.
"""
from __future__ import annotations

import collections
import contextlib
import logging
import os
import selectors
import signal
import subprocess
import threading
import time
from typing import Any, Callable, Dict, List, Optional, Set

from ..._runtime import interrupts, spare
from ...config import get_config
from ...errors import BackendError
from .. import addresses
from ..base import RUN_ENV, Backend, Job, JobInfo, JobSpec, JobState, JobStatus, PerProcess
from .forkserver import MARKER_ENV, JobTable, read_table
from .forkserver_client import ForkedJob, ForkServer, fork_server, forkable

logger = logging.getLogger(__name__)

_TAIL_LINES = 200
#: seconds a job waits for a fork server that is still importing before it is started
#: as a new interpreter instead (the server is usually ready within ~0.1 s)
SERVER_WAIT = 5.0


def describe_exit(code: Optional[int]) -> str:
    """``-9`` -> ``"killed by signal 9 (SIGKILL)"``; ``3`` -> ``"exit code 3"``."""
    if code is None:
        return ""
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = "unknown signal"
        return f"killed by signal {-code} ({name})"
    return f"exit code {code}"


class _OutputPump:
    """Forwards every job's output to our stdout/stderr and keeps a tail per job.

    A job started as a new interpreter writes into two pipes of its own, read here; a
    forked job's output comes relayed by its fork server, on the server's one control
    socket (:class:`~.forkserver_client.ForkServer`), which this thread reads too.
    """

    def __init__(self) -> None:
        self._selector = selectors.DefaultSelector()
        self._lock = threading.Lock()
        self._wake_r, self._wake_w = os.pipe()
        self._selector.register(self._wake_r, selectors.EVENT_READ, None)
        self.tails: Dict[str, collections.deque] = {}
        self._open: Dict[str, int] = {}
        self._done: Dict[str, threading.Event] = {}
        self._servers: Dict[int, ForkServer] = {}   # id -> a fork server whose reports we read
        self._thread = threading.Thread(target=self._run, name="fiberrl-output", daemon=True)
        self._thread.start()

    def add(self, job_id: str, stdout, stderr) -> None:
        """Pump the output pipes of a job started as a new interpreter."""
        with self._lock:
            self._tail(job_id)
            self._open[job_id] = 2
            self._selector.register(stdout, selectors.EVENT_READ, (job_id, 1))
            self._selector.register(stderr, selectors.EVENT_READ, (job_id, 2))
        os.write(self._wake_w, b"x")

    def attach(self, server: ForkServer) -> None:
        """Read ``server``'s reports: its jobs' output, and their ends."""
        with self._lock:
            if id(server) in self._servers or server.gone:
                return
            server.on_output = self._relayed
            server.on_output_done = self._relayed_done
            self._servers[id(server)] = server
            self._selector.register(server.fileno(), selectors.EVENT_READ, server)
        os.write(self._wake_w, b"x")

    def _tail(self, job_id: str) -> collections.deque:
        tail = self.tails.get(job_id)
        if tail is None:
            tail = self.tails[job_id] = collections.deque(maxlen=_TAIL_LINES)
            self._done[job_id] = threading.Event()
        return tail

    def drained(self, job_id: str, timeout: float) -> None:
        """Wait (briefly) until the job's pipes reached EOF, so its tail is complete."""
        done = self._done.get(job_id)
        if done is not None:
            done.wait(timeout)

    def _relayed(self, pid: int, stream: int, chunk: bytes) -> None:
        self._forward(f"local-{pid}", stream, chunk)

    def _relayed_done(self, pid: int) -> None:
        self._tail(f"local-{pid}")
        self._done[f"local-{pid}"].set()

    def _forward(self, job_id: str, target_fd: int, chunk: bytes) -> None:
        try:
            os.write(target_fd, chunk)
        except OSError:
            pass
        self._tail(job_id).extend(chunk.decode("utf-8", "replace").splitlines())

    def _run(self) -> None:
        while True:
            for key, _ in self._selector.select():
                if key.data is None:
                    os.read(self._wake_r, 4096)
                    continue
                if isinstance(key.data, ForkServer):
                    self._read_server(key)
                    continue
                job_id, target_fd = key.data
                try:
                    chunk = os.read(key.fd, 65536)
                except OSError:
                    chunk = b""
                if not chunk:
                    with self._lock:
                        self._selector.unregister(key.fileobj)
                        key.fileobj.close()
                        self._open[job_id] -= 1
                        if self._open[job_id] == 0:
                            self._done[job_id].set()
                    continue
                self._forward(job_id, target_fd, chunk)

    def _read_server(self, key: selectors.SelectorKey) -> None:
        server = key.data
        server.drain()
        if server.gone:   # it exited: stop watching, then free its descriptor
            with self._lock:
                self._selector.unregister(key.fd)
                self._servers.pop(id(server), None)
                server.release()


#: this process's one output pump, shared by every local backend (a fork server is read
#: by one thread only, whichever backend started its jobs)
_pump = PerProcess(_OutputPump)


class _Attached:
    """A local job of another run: ``psutil`` stands in for its ``Popen``."""

    def __init__(self, proc) -> None:
        self.proc = proc

    def poll(self) -> Optional[int]:
        return None if self.proc.is_running() and self.proc.status() != "zombie" else 0

    def wait(self, timeout: Optional[float] = None) -> Optional[int]:
        import psutil
        try:
            return self.proc.wait(timeout) or 0
        except psutil.TimeoutExpired:
            raise subprocess.TimeoutExpired("job", timeout) from None

    def send_signal(self, sig: int) -> None:
        self.proc.send_signal(sig)


class LocalBackend(Backend):
    """Jobs as subprocesses of this machine (the default backend)."""

    name = "local"
    shares_host = True
    uses_local_cores = True
    forwards_output = True

    def __init__(self, listen_host: Optional[str] = None) -> None:
        self._listen_host = listen_host
        self._spare_jobs: Set[int] = set()   # pids of jobs given to a spare interpreter

    @staticmethod
    def _output() -> _OutputPump:
        """This process's one output pump."""
        return _pump.get()

    def create_job(self, spec: JobSpec) -> Job:
        env = dict(os.environ)
        env.update(spec.env)
        handle = self._fork(spec, env)
        if handle is not None:
            spare.discard()   # this process's jobs are forked: none would take it
        else:
            if forkable(spec.command):
                handle = spare.take(spec.command[0], env, spec.cwd, spec.pass_fds)
                if handle is not None:
                    self._spare_jobs.add(handle.pid)
                    JobTable().record(handle.pid, env)
            if handle is None:
                handle = self._exec(spec, env)
            self._output().add(f"local-{handle.pid}", handle.stdout, handle.stderr)
        job = Job(id=f"local-{handle.pid}", backend=self.name, spec=spec, host="localhost",
                  pid=handle.pid, data=handle)
        logger.debug("started job %s: %s", job.id, spec.name)
        return job

    @staticmethod
    def _exec(spec: JobSpec, env: Dict[str, str]) -> subprocess.Popen:
        """Start the job as a new process."""
        # fiberrl's own jobs start with Ctrl-C held until fiberrl.spawn is ready for it
        # (see interrupts); any other command gets the terminal's Ctrl-C as usual
        holding = interrupts.held() if forkable(spec.command) else contextlib.nullcontext()
        try:
            with holding:
                return subprocess.Popen(spec.command, env=env, cwd=spec.cwd,
                                        pass_fds=spec.pass_fds, stdin=subprocess.DEVNULL,
                                        stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        except OSError as exc:
            raise BackendError(f"local backend could not start {spec.command[0]!r}: "
                               f"{exc}") from exc

    def _fork(self, spec: JobSpec, env: Dict[str, str]) -> Optional[ForkedJob]:
        """Fork the job from the fork server; None if it should be exec'd instead."""
        cfg = get_config()
        if not cfg.forkserver or not forkable(spec.command):
            return None
        try:
            server = fork_server(spec.command[0])
            if server is None:
                return None
            self._output().attach(server)   # before its first job can print
            if not server.matches(env):
                return None
            if not server.wait_ready(SERVER_WAIT):
                logger.info("fork server not ready after %.0f s; starting %s as a new "
                            "interpreter", SERVER_WAIT, spec.name)
                return None
            return server.start_job(env, spec.cwd, spec.pass_fds, timeout=cfg.start_timeout)
        except OSError as exc:  # ForkServerError, or the server could not be started
            logger.warning("fork server unavailable (%s); starting %s as a new interpreter",
                           exc, spec.name)
            return None

    def notify_end(self, job: Job, callback: Callable[[], Any]) -> bool:
        """A forked job's end comes in its fork server's reports: told at once."""
        if isinstance(job.data, ForkedJob):
            job.data.on_end(callback)
            return True
        return False

    def status(self, job: Job) -> JobStatus:
        return self._status(job, job.data.poll())

    def _status(self, job: Job, code: Optional[int]) -> JobStatus:
        if code is None:
            return JobStatus(JobState.RUNNING)
        if job.pid in self._spare_jobs:   # its line for `fiberrl ps` is no longer needed
            self._spare_jobs.discard(job.pid)
            JobTable().forget(job.pid)
        state = JobState.SUCCEEDED if code == 0 else JobState.FAILED
        return JobStatus(state, code, "" if code == 0 else describe_exit(code))

    def wait(self, job: Job, timeout: Optional[float] = None) -> Optional[JobStatus]:
        try:
            code = job.data.wait(timeout)
        except subprocess.TimeoutExpired:
            return None
        return self._status(job, code)

    def terminate(self, job: Job, force: bool = False) -> None:
        if job.data.poll() is not None:
            return
        try:
            job.data.send_signal(signal.SIGKILL if force else signal.SIGTERM)
        except ProcessLookupError:
            pass

    def logs(self, job: Job, tail: int = 50) -> str:
        pump = self._output()
        pump.drained(job.id, timeout=1.0 if job.data.poll() is not None else 0.0)
        lines = list(pump.tails.get(job.id, ()))
        return "\n".join(lines[-tail:])

    def listen_host(self) -> str:
        return addresses.listen_host(self._listen_host, lambda: "127.0.0.1")

    # -- the command line: jobs of any run of this user, found by their environment --
    def list_jobs(self) -> List[JobInfo]:
        import psutil
        jobs = []
        for proc in psutil.process_iter(["pid", "username", "status", "create_time"]):
            try:
                env = proc.environ()
            except (psutil.Error, OSError):
                continue
            if proc.info["username"] != psutil.Process().username() or proc.pid == os.getpid():
                continue
            if MARKER_ENV in env or spare.SPARE_ENV in env:
                # the fork server (not a job), a job it forked, or a spare's job (whose
                # environment here is the spare's start, from before its run had an id)
                recorded = read_table(proc.pid)
                if recorded is None:
                    continue
                name, run = recorded["name"], recorded["run"] or env.get(RUN_ENV, "")
            elif RUN_ENV in env:
                name, run = env.get("FIBERRL_JOB_NAME", "main"), env[RUN_ENV]
            else:
                continue
            created = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(proc.info["create_time"]))
            jobs.append(JobInfo(id=f"local-{proc.pid}", backend=self.name, name=name, run=run,
                                state=proc.info["status"], host="localhost", created=created))
        return jobs

    def attach(self, job_id: str) -> Job:
        import psutil
        pid = job_id.rsplit("-", 1)[-1]
        if not pid.isdigit():
            raise BackendError(f"no local fiberrl job {job_id!r}: a local job's id is "
                               "local-<pid>")
        try:
            proc = psutil.Process(int(pid))
            if RUN_ENV not in proc.environ():
                raise ValueError("not a fiberrl job")
        except (psutil.Error, ValueError, OSError) as exc:
            raise BackendError(f"no local fiberrl job {job_id!r}: {exc}") from None
        return Job(id=job_id, backend=self.name, spec=JobSpec(command=[], name=job_id),
                   host="localhost", pid=proc.pid, data=_Attached(proc))
