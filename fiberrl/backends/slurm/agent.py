"""``python -m fiberrl.backends.slurm.agent TASK_DIR``: a warm host of fiberrl jobs.

What a Slurm host job runs (see :mod:`.warm` for the files and the master's side).
Data flow, all in this one process, one thread::

    TASK_DIR/workers.json --> start the local fork server (fiberrl and the pool worker
                              imported once) --> one fork per job, its stdout to
                              w<n>.out and its stderr to w<n>.err,
                              at most max_starting of them not yet connected to the
                              master (each says so on a pipe: FIBERRL_STARTED_FD)
    every POLL s: w<n>.kill<SIG> files --> signal job n;  jobs that ended --> w<n>.exit

It exits once every job it started has ended and been recorded. A job is forked by
the local backend's fork server (:mod:`fiberrl.backends.local.forkserver`), reused
as it is; if that server cannot start or fork, the job is started as a new
interpreter instead (slower, and logged). Jobs die with the fork server
(``PR_SET_PDEATHSIG``), the fork server is one of this job's processes, and Slurm ends
them all when the host job ends (``scancel``, a node lost, its time limit); on
SIGTERM the agent kills its jobs itself before it exits.
"""
from __future__ import annotations

import logging
import os
import select
import signal
import subprocess
import sys
import time
from typing import Any, Dict, List, Optional, Set, Tuple

from ..._runtime.jobenv import ERROR_FILE_ENV, STARTED_ENV
from ...errors import ForkServerError
from ..local.forkserver_client import ForkServer, forkable, set_preload
from . import warm

logger = logging.getLogger(__name__)

#: imported once by the fork server, so each forked pool worker shares its pages
PRELOAD = ["fiberrl.pool.worker"]
READY_TIMEOUT = 120.0  # seconds the fork server may take to import fiberrl
FORK_TIMEOUT = 60.0


class _Agent:
    """Forks the jobs of one task directory, forwards kill requests, records exits."""

    def __init__(self, task_dir: str) -> None:
        self.dir = task_dir
        self.request = warm.read_request(task_dir)
        self.jobs: List[Dict[str, Any]] = self.request["jobs"]
        self.running: Dict[int, Any] = {}   # index -> ForkedJob or subprocess.Popen
        self.starting: Dict[int, int] = {}  # index -> read end of its "started" pipe
        self.ended: Set[int] = set()
        self.max_starting = int(self.request.get("max_starting") or len(self.jobs) or 1)
        self.delivered: Set[Tuple[int, int]] = set()
        self.server: Optional[ForkServer] = None

    def run(self) -> int:
        """Start every job (at most ``max_starting`` at a time), then watch them until
        all have ended; the exit code."""
        started = time.monotonic()
        self.server = self._warm_server()
        waiting = list(range(len(self.jobs)))
        while waiting or self.running:
            self._deliver_kills()   # a job killed before it started is not started
            waiting = [i for i in waiting if i not in self.ended]
            while waiting and len(self.starting) < self.max_starting:
                index = waiting.pop(0)
                self.running[index] = self._start(index, self.jobs[index])
                if not waiting:
                    logger.info("%d job(s) started in %.2f s (%s)", len(self.jobs),
                                time.monotonic() - started,
                                "forked" if self.server else "exec'd")
            self._wait_for_starts(warm.POLL)
            self._record_exits()
        if self.server is not None:
            self.server.close()
        return 0

    def _wait_for_starts(self, timeout: float) -> None:
        """Wait up to ``timeout`` s for starting jobs to connect (or end)."""
        if not self.starting:
            time.sleep(timeout)
            return
        poller = select.poll()
        for fd in self.starting.values():
            poller.register(fd, select.POLLIN)
        ready = {fd for fd, _ in poller.poll(timeout * 1000)}
        for index, fd in list(self.starting.items()):
            if fd in ready:   # a byte: connected; end of file: it ended first
                os.close(fd)
                del self.starting[index]

    def _warm_server(self) -> Optional[ForkServer]:
        """The fork server, once its imports are done; None if it does not come up."""
        python = self.jobs[0]["command"][0] if self.jobs else sys.executable
        if not all(forkable(job["command"]) and job["command"][0] == python
                   for job in self.jobs):
            logger.warning("jobs are not all `%s -m fiberrl.spawn`: exec'ing them", python)
            return None
        set_preload(PRELOAD)
        try:
            server = ForkServer(python)
        except OSError as exc:
            logger.warning("cannot start the fork server (%s): exec'ing the jobs", exc)
            return None
        deadline = time.monotonic() + READY_TIMEOUT
        while not server.ready():
            if not server.alive() or time.monotonic() > deadline:
                logger.warning("the fork server did not come up: exec'ing the jobs")
                server.close()
                return None
            time.sleep(0.01)
        return server

    def _start(self, index: int, job: Dict[str, Any]) -> Any:
        started_r, started_w = os.pipe()
        self.starting[index] = started_r
        errors_path = warm.error_path(self.dir, index)
        # a forked job points its stderr at its file itself (fiberrl.spawn), as a
        # Docker job does: the fork server gives it one descriptor for both streams
        env = {**os.environ, **job["env"], STARTED_ENV: str(started_w),
               ERROR_FILE_ENV: errors_path}
        log, errors = (os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
                       for path in (warm.log_path(self.dir, index), errors_path))
        try:
            if self.server is not None and self.server.serves(env):
                try:
                    return self.server.start_job(env, self.request["cwd"], (started_w,),
                                                 FORK_TIMEOUT, output=log)
                except ForkServerError as exc:
                    logger.warning("job %d: the fork server failed (%s); exec'ing it",
                                   index, exc)
            return subprocess.Popen(job["command"], env=env, cwd=self.request["cwd"],
                                    stdin=subprocess.DEVNULL, stdout=log, stderr=errors,
                                    pass_fds=(started_w,))
        except OSError as exc:   # it cannot run here at all: say so in its own log
            os.write(errors, f"fiberrl host job: cannot start this job: {exc}\n".encode())
            return _NeverStarted()
        finally:
            os.close(log)
            os.close(errors)
            os.close(started_w)  # the job holds its own copy: its end closes the pipe

    def _deliver_kills(self) -> None:
        try:
            names = os.listdir(self.dir)
        except OSError:
            return
        for index, sig in warm.kill_requests(names):
            if (index, sig) in self.delivered:
                continue
            self.delivered.add((index, sig))
            handle = self.running.get(index)
            if handle is None:
                if index < len(self.jobs) and not os.path.exists(warm.exit_path(self.dir, index)):
                    self._record(index, -sig)   # asked to die before it started
                continue
            try:
                handle.send_signal(sig)
            except OSError:  # it has just ended: its exit is recorded next
                pass

    def _record_exits(self) -> None:
        for index, handle in list(self.running.items()):
            code = handle.poll()
            if code is not None:
                del self.running[index]
                self._record(index, code)

    def _record(self, index: int, code: int) -> None:
        self.ended.add(index)
        path = warm.exit_path(self.dir, index)
        with open(path + ".tmp", "w") as fh:
            fh.write(f"{code}\n")
        os.replace(path + ".tmp", path)

    def kill_all(self) -> None:
        """SIGKILL every job still running (the agent is going away)."""
        for handle in self.running.values():
            try:
                handle.send_signal(signal.SIGKILL)
            except OSError:
                pass


class _NeverStarted:
    """A job that could not be started: it has ended with exit code 1."""

    def poll(self) -> int:
        return 1

    def send_signal(self, sig: int) -> None:
        pass


def _stop(signum: int, frame: Any) -> None:
    raise SystemExit(128 + signum)


def main(argv: Optional[List[str]] = None) -> int:
    """Run the host job of the task directory ``argv[0]``; the agent's exit code."""
    argv = sys.argv[1:] if argv is None else argv
    job_id = os.environ.get("SLURM_ARRAY_JOB_ID", os.environ.get("SLURM_JOB_ID", "?"))
    task = os.environ.get("SLURM_ARRAY_TASK_ID")
    logging.basicConfig(level=logging.WARNING, format=f"%(asctime)s fiberrl host job {job_id}"
                        f"{'_' + task if task else ''} %(levelname)s: %(message)s")
    signal.signal(signal.SIGTERM, _stop)
    agent = _Agent(argv[0])
    try:
        return agent.run()
    finally:
        agent.kill_all()


if __name__ == "__main__":
    sys.exit(main())
