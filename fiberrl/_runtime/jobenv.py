"""What a job learns from its environment, and the token it was started with.

Kept apart from :mod:`fiberrl.popen` so that a job's start-up (``fiberrl.spawn``)
imports nothing it does not use: every module a job imports is paid for by every job.
The run's secret travels beside these (:mod:`fiberrl._wire.auth`).
"""
from __future__ import annotations

import contextlib
import os
import sys
import threading
from typing import Any, Dict, Iterator, Optional

from . import interrupts

PARENT_ENV = "FIBERRL_PARENT"   # "host:port" of the parent's runtime
TOKEN_ENV = "FIBERRL_TOKEN"
JOB_ENV = "FIBERRL_JOB_NAME"
#: a descriptor the job writes one byte to, then closes, once it is connected to its
#: parent (what started it may pace further starts on it: Slurm's warm host jobs)
STARTED_ENV = "FIBERRL_STARTED_FD"

#: a file the job's stdout goes to, made by whoever started it (the Docker backend on
#: a local dockerd, which follows it: :mod:`fiberrl.backends.output_files`)
OUTPUT_FILE_ENV = "FIBERRL_OUTPUT_FILE"
#: a file the job's stderr goes to, made and followed likewise (without it, stderr
#: goes where stdout does)
ERROR_FILE_ENV = "FIBERRL_ERROR_FILE"

_current_token: Optional[str] = None
#: this process's id, kept right across ``os.fork``: ``os.getpid()`` without its system
#: call, for hot paths (a pipe end checking, on every message, that it is active in this
#: process). Read it as ``jobenv.pid``: a name imported from here would keep the value
#: of the process that imported it.
pid = os.getpid()


def _forked() -> None:
    global pid
    pid = os.getpid()


os.register_at_fork(after_in_child=_forked)


_start_method = {"name": "spawn"}


def start_method() -> str:
    """The start method this process reports (``fiberrl.get_start_method()``); a job
    starts with the one it was started with, as a stdlib child does."""
    return _start_method["name"]


def set_start_method(method: str) -> None:
    """Set what :func:`start_method` reports."""
    _start_method["name"] = method


def parent_address() -> tuple:
    """The address of the parent's runtime, from the environment."""
    host, _, port = os.environ[PARENT_ENV].rpartition(":")
    return host, int(port)


def address_env(address: tuple) -> str:
    """How an address is written in a job's environment."""
    return f"{address[0]}:{address[1]}"


def current_job_token() -> Optional[str]:
    """The one-time token this job was started with (None in a root process)."""
    return _current_token


def set_job_token(token: str) -> None:
    """Record this job's token (``fiberrl.spawn`` does, once)."""
    global _current_token
    _current_token = token


_shipping = threading.local()


@contextlib.contextmanager
def shipping_to(token: str) -> Iterator[None]:
    """While pickling a process for the job with ``token``: objects that travel with
    it (pipe ends) can tell their owner which job they are on their way to."""
    _shipping.token = token
    try:
        yield
    finally:
        _shipping.token = None


def shipping_token() -> Optional[str]:
    """The token of the job whose process this thread is pickling, if any."""
    return getattr(_shipping, "token", None)


def write_output_to_file() -> None:
    """Send this job's stdout to :data:`OUTPUT_FILE_ENV`'s file and its stderr to
    :data:`ERROR_FILE_ENV`'s (to stdout's file when that is not set), each if it names
    a file that exists here (it does not when the path means another place to whoever
    made it: that stream then stays where it was)."""
    out_fd = _open_given(os.environ.pop(OUTPUT_FILE_ENV, None))
    error_path = os.environ.pop(ERROR_FILE_ENV, None)
    err_fd = out_fd if error_path is None else _open_given(error_path)
    if out_fd is None and err_fd is None:   # (a local job: nothing to point anywhere)
        return
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    for fd, target in ((out_fd, 1), (err_fd, 2)):
        if fd is not None:
            os.dup2(fd, target)
    for fd in {out_fd, err_fd} - {None}:
        os.close(fd)


def _open_given(path: Optional[str]) -> Optional[int]:
    """A descriptor appending to ``path``, made by the job's parent (not created here),
    or None if there is no such path or it is not here."""
    if not path:
        return None
    try:
        return os.open(path, os.O_WRONLY | os.O_APPEND)
    except OSError:
        return None


def job_request(env: Dict[str, str], cwd: Optional[str]) -> Dict[str, Any]:
    """What a process that becomes a job after it started (a fork of the local fork
    server, a spare interpreter) is told of it, as JSON: its whole environment, its
    working directory and the SIGINT disposition an exec'd job would inherit."""
    return {"env": env, "cwd": cwd or os.getcwd(), "sigint_ignored": interrupts.ignored()}


def adopt_request(request: Dict[str, Any]) -> None:
    """In such a process: take the :func:`job_request`'s SIGINT disposition and
    environment, and its directory as ``sys.path[0]`` (as ``python -m`` there would;
    ``fiberrl.spawn`` changes to the directory itself)."""
    interrupts.take_as(parent_ignored=request["sigint_ignored"])
    os.environ.clear()
    os.environ.update(request["env"])
    sys.path[0] = request["cwd"]
