"""Launch seam: turn a :class:`fiberrl.Process` into a job and track it.

Data flow::

    Process.start() -> Popen: pickle the process object (cloudpickle), keep it in the
    runtime's "spawn" service under a one-time token, build a JobSpec, backend.create_job()
    job (python -m fiberrl.spawn) -> spawn.hello(token) -> payload -> runs -> spawn.exit

``join``/``is_alive``/``exitcode`` combine the backend's view (authoritative: it sees
OOM kills, signals, cancelled jobs) with the exit code the job reported itself.
The job watch (:mod:`fiberrl._runtime.liveness`) tells the Popen when its job ended
(:meth:`Popen._job_ended`). ``sentinel`` is made the first time it is asked for, so
that a job nobody waits on by descriptor (a pool's worker) costs this process no
descriptor for it: for a job running on this host, a ``pidfd`` of its process, which
the kernel makes readable the moment it exits (as the stdlib's sentinel); otherwise
the read end of a pipe whose write end is closed when the job watch hears of the end.
"""
from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import pickle
import secrets
import signal
import sys
import threading
import time
import weakref
from multiprocessing import context as _mp_context
from multiprocessing import util as _mp_util
from typing import Iterator, Optional

from . import reduction
from ._runtime.jobenv import (JOB_ENV, PARENT_ENV, TOKEN_ENV, address_env, shipping_to,
                              start_method)
from ._runtime.liveness import job_watch
from ._services.spawn import spawn_service
from ._wire.auth import secret_env
from ._wire.sockets import wait_for
from .backends import JobSpec, JobState, JobStatus, default_backend
from .backends.base import RUN_ENV, run_id
from .config import INHERITED_ENV, get_config, is_explicit

logger = logging.getLogger(__name__)


def _pickle_process(process_obj) -> list:
    """Pickle the process; name the offending argument when that fails."""
    _mp_context.set_spawning_popen(_PICKLING)
    try:
        return reduction.dumps(process_obj)
    except Exception as exc:
        culprit = _find_unpicklable(process_obj)
        message = f"cannot send {process_obj.name} to its job: {culprit or exc}"
        if isinstance(exc, (TypeError, pickle.PicklingError, AttributeError)):
            raise type(exc)(message) from exc
        raise pickle.PicklingError(message) from exc
    finally:
        _mp_context.set_spawning_popen(None)


def _find_unpicklable(process_obj) -> Optional[str]:
    candidates = [("target", getattr(process_obj, "_target", None))]
    candidates += [(f"argument {i}", a) for i, a in enumerate(getattr(process_obj, "_args", ()))]
    candidates += [(f"keyword argument {k!r}", v)
                   for k, v in getattr(process_obj, "_kwargs", {}).items()]
    for label, value in candidates:
        try:
            reduction.dumps(value)
        except Exception as exc:
            return f"{label} {value!r:.120} cannot be pickled ({type(exc).__name__}: {exc})"
    return None


def _main_path() -> Optional[str]:
    """The file of this process's ``__main__`` (a script), for jobs that meet objects
    pickled by reference to it (see ``fiberrl.spawn.__getattr__``)."""
    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    if path is None or getattr(main, "__spec__", None) is not None:
        return None   # interactive, -c, or run with -m (importable by its own name)
    return os.path.abspath(path)


def _job_log_level(cfg) -> "int | str":
    """The ``fiberrl`` logger's level in a job: the configured ``log_level`` when one was
    set, else this process's effective level, as a stdlib child inherits its parent's
    ``multiprocessing`` logger level."""
    if is_explicit(cfg, "log_level"):
        return cfg.log_level.upper()
    return logging.getLogger("fiberrl").getEffectiveLevel()


def _inherited_config(cfg, backend) -> str:
    """The configuration a job inherits, naming the backend in use (which may have
    been detected rather than configured)."""
    if cfg.backend != backend.name:
        cfg = dataclasses.replace(cfg, backend=backend.name)
    return cfg.to_json()


class _PicklingMarker:
    """Stands in for a spawning Popen while pickling, so the stdlib lets
    ``AuthenticationString`` (the process's authkey) be pickled."""

    def duplicate_for_child(self, handle):
        raise TypeError("file handles cannot be sent to a fiberrl job")


_PICKLING = _PicklingMarker()


class Popen:
    """The job behind one :class:`fiberrl.Process` (the stdlib's ``Popen`` protocol)."""

    method = "fiberrl"

    def __init__(self, process_obj) -> None:
        self.returncode: Optional[int] = None
        self.reason = ""
        self.reported_exit: Optional[int] = None
        self.job = None
        self._pid: Optional[int] = None
        self._said_hello = threading.Event()
        self._hello_host: Optional[str] = None
        self._ended = threading.Event()      # the job watch saw the job end
        self._sentinel: Optional[int] = None
        self._sentinel_is_pidfd = False
        self._sentinel_write: Optional[int] = None
        self.finalizer = None
        self._lock = threading.Lock()
        cfg = get_config()
        backend = default_backend()
        service = spawn_service()
        token = secrets.token_hex(12)
        with shipping_to(token):
            frames = _pickle_process(process_obj)
        prep = {"sys_path": list(sys.path), "cwd": os.getcwd(),
                "log_level": _job_log_level(cfg), "name": process_obj.name,
                "start_method": (getattr(process_obj, "_fiberrl_start_method", None)
                                 or start_method()),
                "main_path": _main_path()}
        env = {PARENT_ENV: address_env(service.runtime.address), TOKEN_ENV: token,
               JOB_ENV: process_obj.name, RUN_ENV: run_id(),
               INHERITED_ENV: _inherited_config(cfg, backend), **secret_env()}
        resources = {"cpu": cfg.cpu, "mem": cfg.mem, "gpu": cfg.gpu,
                     **getattr(process_obj, "_resources", {})}
        from .resources import parse_mem
        spec = JobSpec(command=[cfg.python, "-m", "fiberrl.spawn"], env=env,
                       name=process_obj.name, cpu=resources.get("cpu"),
                       mem=parse_mem(resources.get("mem")), gpu=resources.get("gpu") or 0,
                       image=cfg.image, cwd=os.getcwd(),
                       extra={k: v for k, v in resources.items() if k not in ("cpu", "mem", "gpu")})
        service.add(token, self, prep, frames)
        self._token, self._service, self.backend = token, service, backend
        self.spec = spec
        # a job cut off from this process notices within heartbeat_timeout (keepalive),
        # tries parent_grace s to reconnect and exits parent_grace s later
        job_watch().watch(token, self, lost_after=cfg.heartbeat_timeout + 2 * cfg.parent_grace
                          + cfg.heartbeat_interval)
        batch = getattr(_batch, "popens", None)
        if batch is not None:
            batch.append(self)  # submitted when the submit_together() block ends
            return
        try:
            self._launched(backend.create_job(spec))
        except BaseException as exc:
            # Whatever stops start() here (a refusal, a Ctrl-C) must not leave a job
            # running that the caller takes as never started: one not recorded yet is
            # refused when it connects (its token is dropped), a recorded one stopped.
            if self.job is None:
                self._not_submitted(f"the backend refused the job: {exc}")
                self.close()
            else:
                self.backend.terminate(self.job, force=True)
            raise

    def _launched(self, job) -> None:
        """The backend accepted the job: watch it and arm the start timeout."""
        if job.pid is not None:
            self._pid = job.pid
        if self._hello_host is not None:
            job.host = self._hello_host
        self.job = job
        job_watch().launched(self._token, job)
        self._arm_start_timeout(get_config().start_timeout)

    def _not_submitted(self, reason: str) -> None:
        """The job was never created: the process ends at once with exit code 1."""
        self._service.pending.pop(self._token, None)
        with self._lock:
            self.returncode, self.reason = 1, reason
        self._job_ended()

    def _arm_start_timeout(self, seconds: float) -> None:
        token, service, ref = self._token, self._service, weakref.ref(self)

        def check() -> None:
            if token in service.pending:  # never said hello
                service.pending.pop(token, None)
                popen = ref()
                if popen is not None and popen.poll() is None:
                    logger.error("job %s did not connect back within %.0f s; stopping it",
                                 popen.job.id, seconds)
                    popen.reason = f"did not connect back within {seconds:.0f} s"
                    popen.backend.terminate(popen.job, force=True)

        service.runtime.reactor.call_later(seconds, check)

    def _on_hello(self, pid: int, host: str) -> None:  # the I/O loop
        # In a batch, a job may say hello before the backend has returned every handle.
        self._hello_host = host
        if self._pid is None:
            self._pid = pid
        self._said_hello.set()
        if self.job is not None:
            self.job.host = host

    # -- the stdlib Popen protocol ------------------------------------------------
    @property
    def pid(self) -> Optional[int]:
        """The job's process id on its host.

        A backend that starts jobs elsewhere learns it when the job connects back, so
        the first read waits for that (at most the start timeout, and not past the
        job's end), as the stdlib's ``pid`` is known once ``start()`` returned. On
        another host it names a process there, not here, and need not differ from
        the pid of a job on a third host.
        """
        if self._pid is None and self.job is not None and not self._said_hello.is_set():
            deadline = time.monotonic() + get_config().start_timeout
            while (not self._said_hello.wait(0.2) and self.poll() is None
                   and time.monotonic() < deadline):
                pass
        return self._pid

    @property
    def sentinel(self) -> int:
        """A descriptor that becomes readable once the job has ended (the stdlib's
        ``Popen.sentinel``), made on first use."""
        with self._lock:
            if self._sentinel is None and not self._ended.is_set():
                self._sentinel = self._pidfd()
                if self._sentinel is not None:
                    self._sentinel_is_pidfd = True
                    self.finalizer = _mp_util.Finalize(self, _close_fds, (self._sentinel,))
            if self._sentinel is None:
                read_fd, write_fd = os.pipe()
                self._sentinel = read_fd
                self.finalizer = _mp_util.Finalize(self, _close_fds, (read_fd,))
                if self._ended.is_set():
                    os.close(write_fd)
                else:
                    self._sentinel_write = write_fd
            return self._sentinel

    def _pidfd(self) -> Optional[int]:
        """A pidfd of the job's process when it runs on this host (None otherwise)."""
        if self.job is None or not self.backend.shares_host:
            return None
        pid = self.job.pid or self._pid
        if not pid:
            return None
        try:
            fd = os.pidfd_open(pid)
        except (AttributeError, OSError):   # no pidfd here, or the process is gone
            return None
        if self._ended.is_set() or self.returncode is not None:
            os.close(fd)   # it ended meanwhile: its pid may already be another's
            return None
        return fd

    def _job_ended(self) -> None:
        """The job has ended (the job watch says so): the sentinel fires, waits end."""
        with self._lock:
            self._ended.set()
            fd, self._sentinel_write = self._sentinel_write, None
        if fd is not None:
            os.close(fd)

    @property
    def known_ended(self) -> bool:
        """Whether this process already knows the job has ended (asks no backend)."""
        return self.returncode is not None or self._ended.is_set()

    @property
    def known_pid(self) -> Optional[int]:
        """The job's pid if it is known yet (never waits, unlike :attr:`pid`)."""
        return self._pid

    def poll(self, flag: int = os.WNOHANG) -> Optional[int]:
        """Exit code if the job has finished, else None."""
        if self.returncode is None and self.job is not None:
            status = self.backend.status(self.job)
            if (not status.state.finished and self._exited()
                    and not self._service.runtime.reactor.in_loop()):
                # its pidfd says it has exited: the exit code is on its way (as the
                # stdlib's poll() after its sentinel fired, this does not say None);
                # never on the I/O thread, which carries the report of every job's end
                status = self.backend.wait(self.job, timeout=5.0) or status
            if status.state.finished:
                self._finish(status)
        return self.returncode

    def _exited(self) -> bool:
        """Whether the job's pidfd sentinel (if one was made) says its process exited."""
        fd = self._sentinel
        return fd is not None and self._sentinel_is_pidfd and wait_for(fd, timeout=0)

    def _finish(self, status) -> None:
        with self._lock:
            if self.returncode is not None:
                return
            code = status.exit_code
            if code is None:
                code = self.reported_exit if self.reported_exit is not None else 1
            if not self.reason:
                self.reason = status.reason
            self.returncode = code
        self._service.pending.pop(self._token, None)
        if code < 0 or status.state is JobState.FAILED and code == 0:
            logger.info("job %s (%s) ended: %s", self.job.id, self.job.spec.name,
                           self.reason or f"exit code {code}")

    def wait(self, timeout: Optional[float] = None) -> Optional[int]:
        """Wait for the job to end; return its exit code, or None on timeout.

        On the I/O thread (a finalizer the garbage collector ran there, such as torch's
        ``DataLoader`` iterator's, which joins its workers) this only looks: a job
        still running may be waiting for this very thread, to serve its ``get`` or to
        take what it sends, so waiting would stall every stream of the process for the
        timeout, or for ever. None then, as on a timeout.
        """
        if self.returncode is None:
            if self._service.runtime.reactor.in_loop():   # who would tell us? ask the backend
                status = self.backend.wait(self.job, timeout=0)
                if status is None:
                    return None
            elif not self._ended.wait(timeout):
                return None
            elif self.returncode is not None:   # given up as lost: its backend may lag
                return self.returncode
            else:
                status = self.backend.wait(self.job, timeout=max(timeout or 0.0, 5.0))
            if status is not None:
                self._finish(status)
        return self.returncode

    def lost(self, reason: str) -> None:
        """The job watch gave the job up (its host gone or cut off, see
        :mod:`fiberrl._runtime.liveness`): it has ended with the exit code it reported,
        else as killed (``-SIGKILL``), whatever its backend still lists."""
        code = self.reported_exit if self.reported_exit is not None else -signal.SIGKILL
        self._finish(JobStatus(JobState.SUCCEEDED if code == 0 else JobState.FAILED, code,
                               "" if code == 0 else reason))

    def terminate(self) -> None:
        """Ask the job to stop (SIGTERM on the local backend)."""
        if self.returncode is None and self.job is not None:
            self.backend.terminate(self.job, force=False)

    def kill(self) -> None:
        """Kill the job (SIGKILL on the local backend)."""
        if self.returncode is None and self.job is not None:
            self.backend.terminate(self.job, force=True)

    def close(self) -> None:
        """Release the sentinel (if one was made)."""
        if self.finalizer is not None:
            self.finalizer()
        with self._lock:
            fd, self._sentinel_write = self._sentinel_write, None
        if fd is not None:
            os.close(fd)

    def logs(self, tail: int = 50) -> str:
        """The tail of the job's output."""
        return self.backend.logs(self.job, tail) if self.job is not None else ""


_batch = threading.local()


@contextlib.contextmanager
def submit_together() -> Iterator[None]:
    """Submit every process started in this block (by this thread) in one request.

    Backends that can (Slurm: one job array) start them as one submission; the others
    get one ``create_job`` call each. If the submission fails, every process of the
    block ends with exit code 1 and the backend's error is raised here.
    """
    if getattr(_batch, "popens", None) is not None:
        yield  # nested: the outer block submits
        return
    popens: list = []
    _batch.popens = popens
    try:
        yield
    except BaseException:
        for popen in popens:
            popen._not_submitted("not submitted: the start of its group failed")
        raise
    finally:
        _batch.popens = None
    if not popens:
        return
    backend = popens[0].backend
    try:
        jobs = backend.create_jobs([p.spec for p in popens])
    except BaseException as exc:
        for popen in popens:
            popen._not_submitted(f"the backend refused the job: {exc}")
        raise
    for popen, job in zip(popens, jobs):
        popen._launched(job)


def _close_fds(*fds: int) -> None:
    for fd in fds:
        try:
            os.close(fd)
        except OSError:
            pass
