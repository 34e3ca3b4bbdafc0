"""The parent's side of the local fork server (:mod:`fiberrl.backends.local.forkserver`).

One :class:`ForkServer` per (process, interpreter path), started on first use and
shared by every local backend of this process; :meth:`ForkServer.start_job` sends one
request and returns a :class:`ForkedJob`, which answers as a ``subprocess.Popen`` does
(``poll``, ``wait``, ``send_signal``, ``pid``) from what the server reports on the
job's own socket.
"""
from __future__ import annotations

import contextlib
import json
import logging
import os
import select
import signal
import socket
import subprocess
import threading
from typing import Dict, List, Optional, Sequence, Tuple

from ..._runtime import interrupts
from ...errors import ForkServerError
from .forkserver import MARKER_ENV, MAX_FDS, MAX_REQUEST, READY

logger = logging.getLogger(__name__)

#: environment variables an interpreter reads only when it starts
_START_UP_PREFIXES = ("PYTHON", "LD_")
_SPAWN_ARGS = ["-m", "fiberrl.spawn"]


def forkable(command: Sequence[str]) -> bool:
    """Whether ``command`` runs fiberrl's job entry point (what a fork server runs)."""
    return list(command[1:]) == _SPAWN_ARGS


def _start_up_env(env: Dict[str, str]) -> Dict[str, str]:
    return {k: v for k, v in env.items() if k.startswith(_START_UP_PREFIXES)}


class ForkedJob:
    """A job forked by the server, with the ``subprocess.Popen`` methods the local
    backend uses."""

    def __init__(self, pid: int, report: socket.socket) -> None:
        self.pid = pid
        self.returncode: Optional[int] = None
        self._report: Optional[socket.socket] = report
        self._lock = threading.Lock()

    def poll(self) -> Optional[int]:
        """The exit code if the job has ended (and been reaped), else None."""
        return self._read(0.0)

    def wait(self, timeout: Optional[float] = None) -> int:
        """Wait for the exit code; ``subprocess.TimeoutExpired`` after ``timeout`` s."""
        code = self._read(timeout)
        if code is None:
            raise subprocess.TimeoutExpired(f"forked job {self.pid}", timeout)
        return code

    def send_signal(self, sig: int) -> None:
        """Signal the job, unless it is known to have ended."""
        if self.poll() is None:
            os.kill(self.pid, sig)

    def _read(self, timeout: Optional[float]) -> Optional[int]:
        with self._lock:
            if self.returncode is not None or self._report is None:
                return self.returncode
            if not _readable(self._report, timeout):
                return None
            try:
                message = self._report.recv(64)
            except OSError:
                message = b""
            self._report.close()
            self._report = None
            if message.startswith(b"X"):
                self.returncode = int(message[1:])
            else:  # the server died: the kernel killed the job with it (PR_SET_PDEATHSIG);
                # where that is not available, kill it here: nobody could reap it
                logger.warning("the fork server of job %d died; the job dies with it", self.pid)
                with contextlib.suppress(OSError):  # already gone
                    os.kill(self.pid, signal.SIGKILL)
                self.returncode = -signal.SIGKILL
            return self.returncode

    def __del__(self) -> None:
        if getattr(self, "_report", None) is not None:
            self._report.close()


class ForkServer:
    """A running fork server and the control socket to it."""

    def __init__(self, python: str) -> None:
        self.python = python
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        env = dict(os.environ)
        env[MARKER_ENV] = "1"
        self._start_up = _start_up_env(os.environ)
        try:
            with interrupts.held():  # so that a Ctrl-C during its start-up is quiet too
                self.process = subprocess.Popen(
                    [python, "-m", "fiberrl.backends.local", str(theirs.fileno()), *_preload],
                    pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL, env=env)
        except OSError:
            ours.close()
            raise
        finally:
            theirs.close()
        self._control = ours
        self._ready = False
        self._send_lock = threading.Lock()
        logger.debug("started fork server %d for %s", self.process.pid, python)

    def serves(self, env: Dict[str, str]) -> bool:
        """Whether a job with ``env`` can be forked here now: its start-up variables
        match the server's, and the server has finished its imports (until then,
        forking would wait for them)."""
        return _start_up_env(env) == self._start_up and self.ready()

    def ready(self) -> bool:
        """Whether the server has imported what jobs need and takes requests."""
        with self._send_lock:
            if not self._ready and self._control is not None:
                with contextlib.suppress(OSError):  # nothing yet, or the server is gone
                    self._ready = self._control.recv(16, socket.MSG_DONTWAIT) == READY
        return self._ready and self.alive()

    def alive(self) -> bool:
        """Whether the server process is running and still takes requests."""
        return self._control is not None and self.process.poll() is None

    def start_job(self, env: Dict[str, str], cwd: Optional[str], pass_fds: Sequence[int],
                  timeout: float, output: Optional[int] = None
                  ) -> Tuple[ForkedJob, Optional[int], Optional[int]]:
        """Fork a job; returns it and the read ends of its stdout and stderr pipes.

        With ``output`` (a descriptor open for writing, e.g. a log file), the job writes
        both streams there instead and no pipes are made (the read ends are None).
        Raises :class:`ForkServerError` when the server cannot (it died, or did not
        answer within ``timeout`` s).
        """
        # the job's SIGINT disposition is the parent's now, as for an exec'd job
        request = json.dumps({"env": env, "cwd": cwd or os.getcwd(), "fds": list(pass_fds),
                              "sigint_ignored": interrupts.ignored()}).encode()
        if len(request) > MAX_REQUEST or len(pass_fds) + 3 > MAX_FDS:
            raise ForkServerError("request too large for the fork server")
        report, report_theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        if output is None:
            out_r, out_w = os.pipe()
            err_r, err_w = os.pipe()
        else:  # our own duplicates: closed below like the pipes' write ends
            out_r, out_w, err_r, err_w = None, os.dup(output), None, os.dup(output)
        try:
            fds: List[int] = [report_theirs.fileno(), out_w, err_w, *pass_fds]
            with self._send_lock:
                if self._control is None:
                    raise ForkServerError("the fork server was closed")
                socket.send_fds(self._control, [request], fds)
        except OSError as exc:
            report.close()
            _close(out_r, err_r)
            raise ForkServerError(f"cannot reach the fork server: {exc}") from exc
        finally:
            report_theirs.close()  # in flight or delivered: the server holds it now
            os.close(out_w)
            os.close(err_w)
        try:
            pid = _read_pid(report, timeout)
        except ForkServerError:
            report.close()
            _close(out_r, err_r)
            raise
        return ForkedJob(pid, report), out_r, err_r

    def close(self) -> None:
        """Stop taking requests; the server exits once its running jobs have ended."""
        with self._send_lock:
            control, self._control = self._control, None
        if control is not None:
            control.close()


def _close(*fds: Optional[int]) -> None:
    for fd in fds:
        if fd is not None:
            os.close(fd)


def _readable(sock: socket.socket, timeout: Optional[float]) -> bool:
    """Wait up to ``timeout`` s (None: forever) for ``sock`` to be readable or closed
    (``poll``, not ``select``: a process with many jobs has descriptors above 1024)."""
    poller = select.poll()
    poller.register(sock, select.POLLIN)
    return bool(poller.poll(None if timeout is None else max(0.0, timeout) * 1000))


def _read_pid(report: socket.socket, timeout: float) -> int:
    if not _readable(report, timeout):
        raise ForkServerError(f"the fork server did not answer within {timeout:.0f} s")
    answer = report.recv(4096).decode(errors="replace")
    if answer.startswith("P"):
        return int(answer[1:])
    raise ForkServerError(f"the fork server could not fork: {answer[1:] or 'it exited'}")


_preload: List[str] = []


def set_preload(module_names: Sequence[str]) -> None:
    """Extra modules for fork servers started from now on to import before forking."""
    if isinstance(module_names, str) or not all(isinstance(m, str) for m in module_names):
        raise TypeError("module_names must be a list of strings")
    _preload[:] = list(module_names)


_servers: Dict[Tuple[int, str], ForkServer] = {}
_servers_lock = threading.Lock()
_jobs_asked = {"pid": None, "count": 0}


def fork_server(python: str) -> Optional[ForkServer]:
    """This process's fork server for ``python``, started (or restarted) as needed.

    None for this process's first job: a program that starts one process should not
    pay for a server (its start competes with that job's for the CPU); the second
    job starts the server, and jobs are forked once it is ready.
    """
    key = (os.getpid(), python)
    with _servers_lock:
        if _jobs_asked["pid"] != os.getpid():
            _jobs_asked["pid"], _jobs_asked["count"] = os.getpid(), 0
        _jobs_asked["count"] += 1
        server = _servers.get(key)
        if server is None and _jobs_asked["count"] < 2:
            return None
        if server is None or not server.alive():
            if server is not None:
                server.close()
            server = _servers[key] = ForkServer(python)
        return server


def running_servers() -> List[ForkServer]:
    """The fork servers this process started that still run."""
    with _servers_lock:
        return [s for (pid, _), s in _servers.items() if pid == os.getpid() and s.alive()]


def close_all() -> None:
    """Close every fork server of this process (each exits once its jobs have ended)."""
    with _servers_lock:
        servers = [s for (pid, _), s in _servers.items() if pid == os.getpid()]
        _servers.clear()
    for server in servers:
        server.close()
