"""The parent's side of the local fork server (:mod:`fiberrl.backends.local.forkserver`).

One :class:`ForkServer` per (process, interpreter path), started on first use and
shared by every local backend of this process; :meth:`ForkServer.start_job` sends one
request and returns a :class:`ForkedJob`, which answers as a ``subprocess.Popen`` does
(``poll``, ``wait``, ``send_signal``, ``pid``) from what the server reports on the
control socket: one descriptor for all the server's jobs, their output included.
"""
from __future__ import annotations

import contextlib
import json
import logging
import os
import select
import signal
import socket
import struct
import subprocess
import threading
import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from ..._runtime import interrupts, jobenv
from ..._runtime.spare import start_up_env
from ...errors import ForkServerError
from .forkserver import MARKER_ENV, MAX_FDS, MAX_REQUEST, READY

#: the largest report from the server: a chunk of a job's output and its header
MAX_REPORT = 65536 + 16

logger = logging.getLogger(__name__)

_SPAWN_ARGS = ["-m", "fiberrl.spawn"]


def forkable(command: Sequence[str]) -> bool:
    """Whether ``command`` runs fiberrl's job entry point (what a fork server runs)."""
    return list(command[1:]) == _SPAWN_ARGS


class ForkedJob:
    """A job forked by the server, with the ``subprocess.Popen`` methods the local
    backend uses; its exit code comes from the server's reports (:meth:`ForkServer.drain`)."""

    def __init__(self, pid: int, server: "ForkServer") -> None:
        self.pid = pid
        self.returncode: Optional[int] = None
        self._server = server
        self._ended = threading.Event()
        self._on_end: List[Callable[[], Any]] = []

    def poll(self) -> Optional[int]:
        """The exit code if the job has ended (and been reaped), else None."""
        if self.returncode is None:
            self._server.drain()
        return self.returncode

    def wait(self, timeout: Optional[float] = None) -> int:
        """Wait for the exit code; ``subprocess.TimeoutExpired`` after ``timeout`` s."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise subprocess.TimeoutExpired(f"forked job {self.pid}", timeout)
            # (another thread may read the report first: look again at least every 50 ms)
            self._server.wait_readable(0.05 if left is None else min(left, 0.05))
        return self.returncode

    def send_signal(self, sig: int) -> None:
        """Signal the job, unless it is known to have ended."""
        if self.poll() is None:
            os.kill(self.pid, sig)

    def on_end(self, callback: Callable[[], Any]) -> None:
        """Call ``callback()`` once the job has ended (at once if it has; else in the
        thread that reads its exit report)."""
        with self._server._recv_lock:
            if self.returncode is None:
                self._on_end.append(callback)
                return
        callback()

    def _ended_with(self, code: int) -> None:   # under the server's receive lock
        self.returncode = code
        self._ended.set()
        callbacks, self._on_end = self._on_end, []
        for callback in callbacks:
            try:
                callback()
            except Exception:
                logger.exception("a forked job's end callback failed")


class ForkServer:
    """A running fork server and the control socket to it.

    The socket carries requests to the server and its reports back: each job's output
    (handed to :attr:`on_output`, ``(pid, 1 or 2, bytes)``, and :attr:`on_output_done`,
    ``(pid)``) and exit code. Whoever holds a job reads them (:meth:`drain`): the local
    backend's output thread when the socket is readable, and ``poll`` or ``wait``.
    """

    def __init__(self, python: str) -> None:
        self.python = python
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        env = dict(os.environ)
        env[MARKER_ENV] = "1"
        self._start_up = start_up_env(os.environ)
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
        self._control: Optional[socket.socket] = ours
        self._accepting = True     # False once closed: the server takes no more requests
        self.gone = False          # the control socket ended: the server exited
        self._early: Dict[int, int] = {}   # exits read before start_job saw the pid
        self._ready = False
        self._send_lock = threading.Lock()
        self._recv_lock = threading.RLock()
        self._jobs: Dict[int, ForkedJob] = {}   # jobs not known to have ended
        self.on_output: Optional[Callable[[int, int, bytes], Any]] = None
        self.on_output_done: Optional[Callable[[int], Any]] = None
        logger.debug("started fork server %d for %s", self.process.pid, python)

    def fileno(self) -> int:
        """The control socket (readable when reports wait, or the server ended); -1 once
        :meth:`release` d."""
        control = self._control
        return control.fileno() if control is not None else -1

    def release(self) -> None:
        """Close the control socket of a server that is :attr:`gone` (whoever watches it
        for reports stops first: its descriptor number is free afterwards)."""
        control, self._control = self._control, None
        if control is not None:
            control.close()

    def serves(self, env: Dict[str, str]) -> bool:
        """Whether a job with ``env`` can be forked here now: its start-up variables
        match the server's, and the server has finished its imports (until then,
        forking would wait for them)."""
        return self.matches(env) and self.ready()

    def matches(self, env: Dict[str, str]) -> bool:
        """Whether a job with ``env`` can be forked here: its interpreter start-up
        variables are the server's."""
        return start_up_env(env) == self._start_up

    def wait_ready(self, timeout: float) -> bool:
        """Wait up to ``timeout`` s for the server's imports; whether it is ready."""
        deadline = time.monotonic() + timeout
        while not self.ready():
            left = deadline - time.monotonic()
            if left <= 0 or not self.alive():
                return False
            self.wait_readable(min(left, 0.05))
        return True

    def ready(self) -> bool:
        """Whether the server has imported what jobs need and takes requests."""
        if not self._ready:
            self.drain()
        return self._ready and self.alive()

    def alive(self) -> bool:
        """Whether the server process is running and still takes requests."""
        return self._accepting and not self.gone and self.process.poll() is None

    def wait_readable(self, timeout: float) -> None:
        """Wait up to ``timeout`` s for reports (or the server's end)."""
        control = self._control
        if control is not None and not self.gone:
            _readable(control, timeout)

    def drain(self) -> None:
        """Read every report waiting on the control socket and act on it (any thread)."""
        with self._recv_lock:
            while self._control is not None and not self.gone:
                try:
                    record = self._control.recv(MAX_REPORT, socket.MSG_DONTWAIT)
                except (BlockingIOError, InterruptedError):
                    return
                except OSError:
                    record = b""
                if not record:
                    self._server_gone()
                    return
                self._on_report(record)

    def _on_report(self, record: bytes) -> None:
        kind = record[:1]
        if kind == b"O":
            pid, stream = struct.unpack_from("!iB", record, 1)
            if self.on_output is not None:
                self.on_output(pid, stream, record[6:])
        elif kind == b"X":
            pid, code = struct.unpack_from("!ii", record, 1)
            job = self._jobs.pop(pid, None)
            if job is not None:
                job._ended_with(code)
            else:   # start_job has not read its pid yet
                self._early[pid] = code
        elif kind == b"C":
            if self.on_output_done is not None:
                self.on_output_done(struct.unpack_from("!i", record, 1)[0])
        elif record == READY:
            self._ready = True

    def _server_gone(self) -> None:
        """The control socket ended: the server exited (after its last job, if we
        closed it; otherwise it died, and the kernel killed its jobs with it:
        PR_SET_PDEATHSIG; where that is not available, kill them here: nobody could
        reap them)."""
        self.gone = True
        jobs, self._jobs = self._jobs, {}
        if jobs:
            logger.warning("the fork server of %d job(s) died; the jobs die with it", len(jobs))
        for pid, job in jobs.items():
            with contextlib.suppress(OSError):  # already gone
                os.kill(pid, signal.SIGKILL)
            job._ended_with(-signal.SIGKILL)
        for pid in jobs:
            if self.on_output_done is not None:
                self.on_output_done(pid)

    def start_job(self, env: Dict[str, str], cwd: Optional[str], pass_fds: Sequence[int],
                  timeout: float, output: Optional[int] = None) -> ForkedJob:
        """Fork a job and return it. Its output is relayed to :attr:`on_output`, or, with
        ``output`` (a descriptor open for writing, e.g. a log file), written there.
        Raises :class:`ForkServerError` when the server cannot (it died, or did not
        answer within ``timeout`` s).
        """
        # the job's SIGINT disposition is the parent's now, as for an exec'd job
        request = json.dumps({**jobenv.job_request(env, cwd), "fds": list(pass_fds),
                              "output": output is not None}).encode()
        if len(request) > MAX_REQUEST or len(pass_fds) + 2 > MAX_FDS:
            raise ForkServerError("request too large for the fork server")
        report, report_theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            fds: List[int] = [report_theirs.fileno(), *([output] if output is not None else []),
                              *pass_fds]
            with self._send_lock:
                if self._control is None or not self._accepting:
                    raise ForkServerError("the fork server was closed")
                socket.send_fds(self._control, [request], fds)
        except OSError as exc:
            report.close()
            raise ForkServerError(f"cannot reach the fork server: {exc}") from exc
        finally:
            report_theirs.close()  # in flight or delivered: the server holds it now
        try:
            pid = _read_pid(report, timeout)
        finally:
            report.close()
        job = ForkedJob(pid, self)
        with self._recv_lock:
            code = self._early.pop(pid, None)
            if code is None and self.gone:
                code = -signal.SIGKILL   # the server died meanwhile, and the job with it
            if code is None:
                self._jobs[pid] = job
            else:
                job._ended_with(code)
        return job

    def close(self) -> None:
        """Stop taking requests; the server exits once its running jobs have ended
        (and reported their ends, which are still read)."""
        with self._send_lock:
            self._accepting = False
            control = self._control
        if control is not None and not self.gone:
            with contextlib.suppress(OSError):
                control.shutdown(socket.SHUT_WR)


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
    job starts the server, and jobs are forked once it is ready (the local backend
    waits for it rather than starting more interpreters beside it: on a small
    machine they would slow each other, and the first job, down).
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
