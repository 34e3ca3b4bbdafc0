"""The local backend's fork server: a warm interpreter that forks jobs on request.

A fresh ``python -m fiberrl.spawn`` spends ~40 ms importing fiberrl, cloudpickle and
logging before it can even say hello, more than a whole stdlib ``spawn`` start. So the
local backend starts this server once per interpreter path (the first time it runs a
job), the server imports what a job needs, and every job after that is a ``fork()``
of it: the stdlib's ``forkserver`` start method, for fiberrl's jobs.

Data flow::

    LocalBackend (parent) --request--> [control socket] --> fork server --fork()--> job
            ^   (and the job's report socket: "P<pid>")           |     <--stdout/stderr pipes
            +--- control socket: "O" output, "C" output done, ----+
                 "X" exit code (a record per packet)

The control socket is one end of a ``socketpair`` (``SOCK_SEQPACKET``) the parent made
and handed to this process at exec: nothing else can reach it, and requests are JSON
(the job's environment, working directory and file descriptor numbers), never
pickles. Each request carries, by ``SCM_RIGHTS``, a report socket for the job's pid
(answered at once, then closed), a file for the job's output if the parent gives one
(a Slurm host job's log), and the descriptors the job inherits (``pass_fds``).
Otherwise the server keeps the read ends of the job's stdout and stderr pipes and
relays what comes out of them to the parent on the control socket, which also
carries each job's exit code once it is reaped: the parent holds one descriptor for
the server, not three per job. Output waits in the server when the parent is slow
to read (up to :data:`RELAY_LIMIT` bytes; then the jobs' writes block, as on a full
terminal). When the parent shuts down its side of the control socket (or dies), the
server stops accepting and exits once its last job has been reaped and reported. The
server says when its imports are done. The parent's first job is exec'd (it does
not wait for a server); the second starts the server, and it and later jobs wait
for it (a few seconds at most) rather than start more interpreters beside it.

A job forked here dies with the server (``PR_SET_PDEATHSIG``): only the server can
reap it and report its exit code. It has no threads but the main one, a fresh random seed (``random``
reseeds after ``fork``) and the job's own environment, descriptors and signals
(SIGINT held until the job is ready for it, and ignored if the parent ignores it, as
an exec'd job would: :mod:`fiberrl._runtime.interrupts`). What
it shares with its siblings is what a fork shares: the modules imported below and
the hash seed of ``str`` (fixed per server, as with the stdlib's forkserver).
Interpreter start-up variables (``PYTHON*``, ``LD_*``) cannot change after start, so
the parent only sends jobs whose values match the server's (the rest are exec'd).

Who forked what is also written to a small table (a file per job, named by pid, in
:func:`table_dir`), because a forked job's ``/proc/<pid>/environ`` shows the server's
start-up environment, not its own: ``fiberrl ps`` reads the job's name there.
"""
from __future__ import annotations

import collections
import contextlib
import fcntl
import json
import logging
import os
import resource
import stat
import select
import signal
import socket
import struct
import sys
import tempfile
import traceback
from typing import Callable, Dict, List, Optional, Set, Tuple

from ..._runtime import interrupts, jobenv

logger = logging.getLogger(__name__)

#: set in the server's environment; forked jobs show it too in ``/proc/<pid>/environ``
MARKER_ENV = "FIBERRL_FORKSERVER"
MAX_REQUEST = 1 << 20    # bytes of one JSON request (the job's whole environment)
MAX_FDS = 64             # report, the output file if any, and the job's pass_fds
READY = b"R"             # sent once on the control socket: the preloads are imported
#: bytes of jobs' output that may wait for the parent before the server stops reading it
RELAY_LIMIT = 4 * 1024 * 1024
#: modules every job needs, imported once here instead of once per job
PRELOAD = ("fiberrl.spawn", "fiberrl.process", "fiberrl.popen", "fiberrl.connection",
           "fiberrl.queues")


def table_dir() -> str:
    """The per-user directory where the fork server records its jobs' names."""
    return os.path.join(tempfile.gettempdir(), f"fiberrl-{os.getuid()}", "forked")


def _make_table_dir() -> bool:
    """Create :func:`table_dir`; False if it (or its parent) is not this user's alone,
    e.g. made by someone else in the shared temp dir: then nothing is written there."""
    path = table_dir()
    try:
        os.makedirs(path, mode=0o700, exist_ok=True)
        for entry in (os.path.dirname(path), path):
            info = os.lstat(entry)
            if (not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid()
                    or info.st_mode & (stat.S_IWGRP | stat.S_IWOTH)):
                return False
    except OSError:
        return False
    return True


def read_table(pid: int) -> Optional[dict]:
    """What the fork server recorded for job ``pid`` (``{"name", "run"}``), if anything."""
    try:
        with open(os.path.join(table_dir(), str(pid))) as fh:
            return json.load(fh)
    except (OSError, ValueError):
        return None


class JobTable:
    """The record of forked jobs' names for ``fiberrl ps`` (a file per pid), kept by
    the fork server, and by the local backend for the job it gave a spare interpreter
    (whose ``/proc/<pid>/environ`` shows the spare's start, not its job).

    Best effort: a job runs whether or not its line could be written.
    """

    def __init__(self) -> None:
        self.usable = _make_table_dir()

    def record(self, pid: int, env: Dict[str, str]) -> None:
        if not self.usable:
            return
        path = os.path.join(table_dir(), str(pid))
        try:
            with open(path + ".tmp", "w") as fh:
                json.dump({"name": env.get("FIBERRL_JOB_NAME", "job"),
                           "run": env.get("FIBERRL_RUN_ID", "")}, fh)
            os.replace(path + ".tmp", path)
        except OSError as exc:
            logger.warning("fork server: cannot record job %d for `fiberrl ps`: %s", pid, exc)

    def forget(self, pid: int) -> None:
        if self.usable:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(os.path.join(table_dir(), str(pid)))


class _Server:
    """The server's loop: fork on request, relay output, reap, report exit codes."""

    def __init__(self, control: socket.socket) -> None:
        self.pid = os.getpid()
        self.table = JobTable()
        self.prctl = _load_prctl()
        self.control: Optional[socket.socket] = control
        self.accepting = True    # the parent still sends requests
        self.reporting = True    # the parent still hears reports
        self.running: Set[int] = set()                    # jobs not reaped yet
        self.pipes: Dict[int, Tuple[int, int]] = {}       # output pipe -> (pid, 1 or 2)
        self.job_pipes: Dict[int, List[int]] = {}         # pid -> its output pipes still open
        self.out: "collections.deque[bytes]" = collections.deque()   # reports to send
        self.out_bytes = 0
        self.throttled = False   # too much output waits for the parent: pipes not read
        self.poller = select.poll()
        self.wake_r, self.wake_w = os.pipe()
        os.set_blocking(self.wake_r, False)
        os.set_blocking(self.wake_w, False)
        self.limits, self.high = _room_for_pipes()
        self.top = -1   # the highest output pipe ever kept at or above self.high
        self.unlifted: Set[int] = set()   # output pipes kept below it (lifting failed)

    def serve(self) -> None:
        """Run until the parent stopped sending requests and every job has been reaped."""
        signal.signal(signal.SIGINT, signal.SIG_IGN)      # Ctrl-C is for the jobs
        signal.signal(signal.SIGCHLD, lambda *_: None)   # wakes the poll below
        signal.set_wakeup_fd(self.wake_w)
        self.poller.register(self.wake_r, select.POLLIN)
        self.poller.register(self.control.fileno(), select.POLLIN)
        while self.accepting or self.running:
            for fd, events in self.poller.poll():
                if fd in self.pipes:
                    self._relay(fd)
                elif self.control is not None and fd == self.control.fileno():
                    if self.accepting and events & (select.POLLIN | select.POLLHUP | select.POLLERR):
                        self._take_request()
                    elif events & (select.POLLHUP | select.POLLERR):   # the parent is gone
                        self._stop_reporting()
            self._reap()  # after a SIGCHLD's wake-up, or a job that ended meanwhile
            self._flush()
        if self.out and self.reporting:   # the last reports: wait for the parent briefly
            self.control.settimeout(5.0)
            with contextlib.suppress(OSError):
                while self.out:
                    self.control.send(self.out.popleft())

    # -- requests ---------------------------------------------------------------------
    def _take_request(self) -> None:
        """Serve one request, or stop accepting when the parent is done sending."""
        try:
            msg, fds, flags, _ = socket.recv_fds(self.control, MAX_REQUEST, MAX_FDS)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            msg, fds, flags = b"", [], 0
        if not msg and not fds:   # the parent closed its end, or shut down its writes
            self.accepting = False
            self._control_events()
            return
        if len(fds) < 1 or flags & (socket.MSG_CTRUNC | socket.MSG_TRUNC):
            for fd in fds:
                os.close(fd)
            return
        report = socket.socket(fileno=fds[0])
        pipes: List[int] = []     # the read ends this server keeps
        ends: List[int] = []      # the job's write ends
        try:
            request = json.loads(msg)
            output = 2 if request.get("output") else 1
            if not (isinstance(request.get("env"), dict) and isinstance(request.get("cwd"), str)
                    and isinstance(request.get("sigint_ignored"), bool)
                    and len(request.get("fds", ())) == len(fds) - output):
                raise ValueError("malformed request")
            if output == 1:   # relayed to the parent on the control socket
                for _ in range(2):
                    read_end, write_end = os.pipe()
                    pipes.append(read_end)
                    ends.append(write_end)
            stdout, stderr = ends if ends else (fds[1], fds[1])
            pid = os.fork()
        except (OSError, ValueError, AttributeError) as exc:
            _send(report, f"E{type(exc).__name__}: {exc}")
            report.close()
            for fd in fds[1:] + pipes + ends:
                os.close(fd)
            return
        if pid == 0:
            for fd in pipes:
                os.close(fd)
            self._become_job(request, report, stdout, stderr, fds[output:])  # never returns
        for fd in {*fds[1:], *ends}:
            os.close(fd)  # the job holds them now
        self.running.add(pid)
        for number, fd in enumerate(pipes, 1):
            pipes[number - 1] = fd = self._lift(fd)
            os.set_blocking(fd, False)
            self.pipes[fd] = (pid, number)
            self.poller.register(fd, 0 if self.throttled else select.POLLIN)
        if pipes:
            self.job_pipes[pid] = pipes
        _send(report, f"P{pid}")
        report.close()   # its exit is reported on the control socket
        self.table.record(pid, request["env"])

    def _lift(self, fd: int) -> int:
        """Move a kept output pipe to a number at or above ``self.high``, where a forked
        job closes all of them in one call (not one by one: each fork would cost a
        close per job running, and a pool's start-up would grow with its square)."""
        if self.high is None:
            self.unlifted.add(fd)
            return fd
        try:
            lifted = fcntl.fcntl(fd, fcntl.F_DUPFD, self.high)
        except OSError:
            self.unlifted.add(fd)
            return fd
        os.close(fd)
        self.top = max(self.top, lifted)
        return lifted

    # -- reports ----------------------------------------------------------------------
    def _report(self, record: bytes) -> None:
        if self.reporting:
            self.out.append(record)
            self.out_bytes += len(record)

    def _relay(self, fd: int, until_empty: bool = False) -> None:
        """Read a job's output pipe once (or ``until_empty``) and queue what came."""
        pid, stream = self.pipes[fd]
        while True:
            try:
                chunk = os.read(fd, 65536)
            except BlockingIOError:
                return
            except OSError:
                chunk = b""
            if not chunk:
                self._pipe_closed(fd, pid)
                return
            self._report(b"O" + struct.pack("!iB", pid, stream) + chunk)
            if not until_empty:
                return

    def _pipe_closed(self, fd: int, pid: int) -> None:
        self.poller.unregister(fd)
        os.close(fd)
        self.unlifted.discard(fd)
        del self.pipes[fd]
        left = self.job_pipes[pid]
        left.remove(fd)
        if not left:
            del self.job_pipes[pid]
            self._report(b"C" + struct.pack("!i", pid))   # its output is complete

    def _flush(self) -> None:
        """Send what the control socket takes now; stop reading jobs' output while too
        much waits (a parent that does not read cannot make this server buffer without
        bound: the jobs' writes block instead, as they would on a full terminal)."""
        out = self.out
        while out and self.reporting:
            try:
                self.control.send(out[0], socket.MSG_DONTWAIT)
            except (BlockingIOError, InterruptedError):
                break
            except OSError:   # the parent is gone: nobody to report to
                self._stop_reporting()
                break
            self.out_bytes -= len(out.popleft())
        throttle = self.out_bytes > RELAY_LIMIT
        if throttle != self.throttled:
            self.throttled = throttle
            for fd in self.pipes:
                self.poller.modify(fd, 0 if throttle else select.POLLIN)
        self._control_events()

    def _stop_reporting(self) -> None:
        self.reporting = False
        self.out.clear()
        self.out_bytes = 0
        self._control_events()

    def _control_events(self) -> None:
        if self.control is None:
            return
        events = (select.POLLIN if self.accepting else 0) | (
            select.POLLOUT if self.out and self.reporting else 0)
        if events:
            self.poller.modify(self.control.fileno(), events)
        elif not self.accepting and not self.reporting:
            self.poller.unregister(self.control.fileno())
            self.control.close()
            self.control = None
        else:
            self.poller.modify(self.control.fileno(), 0)

    def _reap(self) -> None:
        with contextlib.suppress(BlockingIOError):  # drained
            while os.read(self.wake_r, 4096):
                continue
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            self.table.forget(pid)
            self.running.discard(pid)
            for fd in list(self.job_pipes.get(pid, ())):
                self._relay(fd, until_empty=True)   # its last output comes before its end
            self._report(b"X" + struct.pack("!ii", pid, os.waitstatus_to_exitcode(status)))

    # -- in the forked child ----------------------------------------------------------
    def _die_with_server(self) -> None:
        """Have the kernel kill this job if the server dies (Linux ``PR_SET_PDEATHSIG``):
        nobody else could reap it or report its exit code, and it must not run on unseen."""
        if self.prctl is not None:
            self.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
            if os.getppid() != self.pid:  # the server died before the request took effect
                os._exit(1)

    def _become_job(self, request: dict, report: socket.socket, out_fd: int, err_fd: int,
                    passed: List[int]) -> None:
        """Turn this fresh fork into the job the request describes, run it, exit."""
        code = 1
        try:
            self._die_with_server()
            report.close()
            if self.control is not None:
                self.control.close()
            if self.high is not None and self.top >= self.high:   # its siblings' output
                os.closerange(self.high, self.top + 1)
            for fd in self.unlifted & self.pipes.keys():   # (those it could not lift)
                os.close(fd)
            if self.limits is not None:   # the user's limit, not the server's
                resource.setrlimit(resource.RLIMIT_NOFILE, self.limits)
            signal.set_wakeup_fd(-1)
            os.close(self.wake_r)
            os.close(self.wake_w)
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            interrupts.hold()   # (inherited already) until fiberrl.spawn releases it
            _place_stdio(out_fd, err_fd)
            _place_fds(passed, request["fds"])
            jobenv.adopt_request(request)
            from fiberrl import spawn
            sys.argv = [spawn.__file__]
            code = spawn.main()
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        except BaseException:
            traceback.print_exc()
        finally:
            _exit(code)


def _room_for_pipes() -> Tuple[Optional[Tuple[int, int]], Optional[int]]:
    """Where the server keeps its jobs' output pipes: ``(the open-file limits to give back
    to jobs, or None if unchanged; the first pipe number, or None to keep them where
    they are)``. Raises the server's soft limit to the hard one where it can (it keeps
    two pipes per job) and keeps the pipes from the old soft limit on; where the limits
    are one, keeps them in the upper half."""
    try:
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if hard == resource.RLIM_INFINITY or hard > soft + 64:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            return (soft, hard), soft
    except (OSError, ValueError):
        return None, None
    return None, (soft // 2 if soft >= 512 else None)


def _load_prctl() -> Optional[Callable[..., int]]:
    """libc's ``prctl``, loaded in the server so that a job does not pay for it."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        import ctypes
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None


_PR_SET_PDEATHSIG = 1


def _send(sock: socket.socket, text: str) -> None:
    try:
        sock.send(text.encode())
    except OSError:
        pass  # the parent is gone: nobody to tell


def _place_stdio(out_fd: int, err_fd: int) -> None:
    devnull = os.open(os.devnull, os.O_RDONLY)
    for source, target in ((devnull, 0), (out_fd, 1), (err_fd, 2)):
        os.dup2(source, target)
    for fd in {devnull, out_fd, err_fd} - {0, 1, 2}:
        os.close(fd)


def _place_fds(passed: List[int], targets: List[int]) -> None:
    """Give the job its inherited descriptors under the numbers its parent used."""
    if not passed:
        return
    floor = max([*targets, *passed]) + 1
    moved = []
    for fd in passed:  # out of the way first: a target may be another's current number
        moved.append(fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, floor))
        os.close(fd)
    for fd, target in zip(moved, targets):
        os.dup2(fd, target)  # inheritable, like subprocess's pass_fds
        os.close(fd)


def _exit(code: int) -> None:
    """End the job as an interpreter exit would (atexit handlers, flushed streams)."""
    try:
        import atexit
        atexit._run_exitfuncs()
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):  # a closed or broken stream: nothing to do
                stream.flush()
        os._exit(code)


def main(argv: Tuple[str, ...] = tuple(sys.argv[1:])) -> None:
    """``python -m fiberrl.backends.local CONTROL_FD [MODULE...]`` (see ``__main__``)."""
    # Ctrl-C is for the parent and the jobs. The server was started with SIGINT
    # blocked, and keeps it so: the jobs it forks inherit the mask.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    control = socket.socket(fileno=int(argv[0]))
    import importlib
    for name in PRELOAD:
        importlib.import_module(name)
    for name in argv[1:]:  # the user's (set_forkserver_preload): skipped if missing
        with contextlib.suppress(ImportError):
            importlib.import_module(name)
    from fiberrl import config
    config.field_types()   # computed once here, not in every job
    try:
        control.send(READY)
    except OSError:
        return   # the parent finished before the preloads did: nothing to serve
    _Server(control).serve()
