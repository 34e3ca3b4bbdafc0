"""A spare interpreter: the local backend's first job, started before it is asked for.

A job started as a new interpreter spends ~65 ms starting Python and importing
fiberrl's job entry point before it can say hello, and a fresh program's first
``Pool()`` spends ~45-55 ms importing the pool's modules before its supervisor asks
for a worker. One after the other, they made a fresh program's first pool result
slower than the stdlib's spawn pool (whose workers import less).

So ``Pool()`` on the local backend starts a *spare* first (:func:`prestart`, once per
process): ``python -m fiberrl.spawn`` with :data:`SPARE_ENV` set, which imports what
a job needs, then waits on a pipe. The local backend gives the spare the first job it
would otherwise start as a new interpreter (:func:`take`): it writes the job's whole
environment, working directory and SIGINT disposition as JSON on the pipe and closes
it; the spare makes that environment its own (:func:`become_job`) and goes on as any
job. The two starts overlap.

- The pipe's read end is the only descriptor the spare inherits; what crosses it is
  JSON from the parent, never a pickle.
- A spare is used only for a job it could have been started as: the same
  interpreter, the same start-up variables (``PYTHON*``, ``LD_*``, read only when an
  interpreter starts), no inherited descriptors. It is discarded otherwise, when the
  process's jobs are forked instead, and when ``Pool()`` fails: its pipe is closed and
  it exits 0 at the end of file, having connected to nothing. A spare whose parent
  dies ends the same way. A forked child of the parent closes its copy of the pipe.
- Like an exec'd job, a spare starts with SIGINT blocked
  (:mod:`fiberrl._runtime.interrupts`).
"""
from __future__ import annotations

import atexit
import importlib
import json
import os
import threading
from typing import Any, Dict, List, Optional, Sequence

from . import interrupts, jobenv

#: set in a spare's environment: ``<pipe fd>[,<module to import>...]``
SPARE_ENV = "FIBERRL_SPARE"
#: environment variables an interpreter reads only when it starts
START_UP_PREFIXES = ("PYTHON", "LD_")
_SPAWN_ARGS = ("-m", "fiberrl.spawn")
_MAX_REQUEST = 1 << 20


def start_up_env(env: Dict[str, str]) -> Dict[str, str]:
    """The variables of ``env`` that only an interpreter's start reads."""
    return {k: v for k, v in env.items() if k.startswith(START_UP_PREFIXES)}


class _Spare:
    """A started spare interpreter and the write end of its pipe (parent side)."""

    def __init__(self, python: str, preload: Sequence[str]) -> None:
        import subprocess
        read_end, self.request_fd = os.pipe()
        env = dict(os.environ)
        self.start_up_env = start_up_env(env)
        env[SPARE_ENV] = ",".join([str(read_end), *preload])
        self.python = python
        try:
            with interrupts.held():
                self.popen = subprocess.Popen(
                    [python, *_SPAWN_ARGS], env=env, pass_fds=(read_end,),
                    stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        except BaseException:
            os.close(self.request_fd)
            raise
        finally:
            os.close(read_end)

    def fits(self, python: str, env: Dict[str, str], pass_fds: Sequence[int]) -> bool:
        """Whether this spare can become a job of ``python`` with ``env`` and ``pass_fds``."""
        return (python == self.python and not pass_fds and self.popen.poll() is None
                and start_up_env(env) == self.start_up_env)

    def hand_over(self, env: Dict[str, str], cwd: Optional[str]) -> bool:
        """Give the spare its job; False if it is gone (it died before taking one)."""
        request = json.dumps(jobenv.job_request(env, cwd)).encode()
        try:
            view = memoryview(request)
            while view:
                view = view[os.write(self.request_fd, view):]
        except OSError:   # EPIPE: it ended meanwhile
            return False
        os.close(self.request_fd)
        self.request_fd = -1
        return True

    def discard(self) -> None:
        """Close the pipe: the spare exits at its end of file (reaped later, or at exit)."""
        if self.request_fd >= 0:
            os.close(self.request_fd)
            self.request_fd = -1
        for stream in (self.popen.stdout, self.popen.stderr):
            if stream is not None:
                stream.close()
        with _lock:
            _leaving[:] = [p for p in _leaving if p.poll() is None] + [self.popen]


_lock = threading.Lock()
_spares: Dict[int, _Spare] = {}     # pid -> this process's spare, not yet taken
_started_in: set = set()            # pids of processes that started their spare
_leaving: List[Any] = []            # discarded spares' Popen objects, until reaped


@atexit.register
def _reap_discarded() -> None:
    """Reap the discarded spares (a ``Popen`` dropped while its process runs warns)."""
    for popen in _leaving:
        try:
            popen.wait(timeout=1.0)
        except Exception:   # (subprocess.TimeoutExpired) stuck: not waited for longer
            popen.kill()
            popen.wait()


def _forget_in_child() -> None:
    """In a forked child: the parent's spare is not the child's to give."""
    for spare in _spares.values():
        if spare.request_fd >= 0:
            os.close(spare.request_fd)
    _spares.clear()
    _leaving.clear()   # the parent's children, not this process's


os.register_at_fork(after_in_child=_forget_in_child)


def prestart(python: str, preload: Sequence[str] = ()) -> None:
    """Start this process's spare for ``python`` (importing ``preload`` too), unless
    the process already started one."""
    with _lock:
        if os.getpid() in _started_in:
            return
        _started_in.add(os.getpid())
        try:
            _spares[os.getpid()] = _Spare(python, preload)
        except Exception as exc:   # (no such interpreter, out of processes) the job's own
            # start, which does not use a spare, says what is wrong
            import logging
            logging.getLogger(__name__).debug("no spare interpreter: %s", exc)


def take(python: str, env: Dict[str, str], cwd: Optional[str],
         pass_fds: Sequence[int] = ()) -> Optional[Any]:
    """The ``subprocess.Popen`` of this process's spare, now running the job that
    ``env`` and ``cwd`` describe; None if there is no spare that fits (one that does
    not is discarded)."""
    with _lock:
        spare = _spares.pop(os.getpid(), None)
    if spare is None:
        return None
    if not spare.fits(python, env, pass_fds) or not spare.hand_over(env, cwd):
        spare.discard()
        return None
    return spare.popen


def discard() -> None:
    """Discard this process's spare, if it has one not taken."""
    with _lock:
        spare = _spares.pop(os.getpid(), None)
    if spare is not None:
        spare.discard()


def become_job(setting: str) -> bool:
    """In a spare (``setting`` is :data:`SPARE_ENV`'s value): import the modules it
    names, wait for the job and take its request (:func:`~.jobenv.adopt_request`).
    False if the parent discarded the spare instead."""
    fd, *preload = setting.split(",")
    for name in preload:
        importlib.import_module(name)
    with os.fdopen(int(fd), "rb") as pipe:
        request = pipe.read(_MAX_REQUEST + 1)   # to the end of the pipe
    if not request or len(request) > _MAX_REQUEST:
        return False
    jobenv.adopt_request(json.loads(request))
    return True
