"""Job entry point: ``python -m fiberrl.spawn``.

SIGINT stays blocked from the job's start until step 5 is about to run the target
(:mod:`fiberrl._runtime.interrupts`): a Ctrl-C while the job starts ends it quietly.

0. a spare (started before its job was asked for, :mod:`fiberrl._runtime.spare`)
   first waits for its job's environment and working directory on a pipe;
1. send stdout and stderr to the file the backend follows, if it made one;
   read the parent's runtime address, the one-time token and the run's secret from
   the environment (and take the last two out of it);
2. open the watch stream to the parent (:class:`fiberrl._runtime.liveness.ParentWatch`),
   say hello on it and receive the payload (authenticated); from then on heartbeats
   go up it, and if the parent is gone for ``parent_grace`` seconds the parent
   sentinel fires and the job exits ``parent_grace`` seconds later;
3. restore ``sys.path`` and the working directory, unpickle the process object;
4. start the watch;
5. run the process through the stdlib's ``BaseProcess._bootstrap`` (same exit codes,
   same traceback printing), report the exit code on the watch stream, deliver what
   it still owes (queue items, pipe ends' end of file), stop this process's runtime,
   exit with the code.
"""
from __future__ import annotations

import logging
import os
import sys
import types
from typing import Any, Callable, Optional
from multiprocessing import process as _mp_process

from . import log, reduction
from ._runtime import interrupts, jobenv, spare
from ._runtime.jobenv import JOB_ENV, STARTED_ENV, TOKEN_ENV, parent_address
from ._runtime.liveness import ParentWatch, start_parent_watch
from ._wire.auth import SECRET_ENV, run_secret
from ._wire.sockets import local_hostname
from .config import get_config

logger = logging.getLogger(__name__)


def _finish_shared_objects() -> None:
    """Deliver pending queue items and close pipe ends: only for what this job used
    (importing those modules just to find nothing would slow every job's exit)."""
    feeders, connection = (sys.modules.get(f"fiberrl.{name}")
                           for name in ("_services.queue_feeder", "connection"))
    if feeders is not None:
        feeders.flush_all()
    if connection is not None:
        connection.close_all()


class _ParentMain(types.ModuleType):
    """The job's ``__main__``: the parent's main script, run as ``__mp_main__`` only
    when a name is first missed.

    Objects pickled by reference to the parent's ``__main__`` (by the stdlib's own
    pickler: a ``multiprocessing.queues.Queue``'s items, a stdlib ``Connection``'s
    messages) name it, and the stdlib's spawn runs the script at every start for them.
    fiberrl's own messages carry such objects by value, so a job that never meets one
    never runs the script (a script without a ``__name__`` guard still runs once).

    Functions of the script that arrive by value live in this module's namespace too
    (:mod:`fiberrl.reduction_main`), so both kinds see one set of globals. The script
    runs in that namespace; a name the job had already set there (an initializer's
    global) keeps its value, as it would have in a stdlib child that ran the script
    first."""

    is_parent_main = True   # what fiberrl.reduction_main looks for

    def __init__(self, path: str) -> None:
        super().__init__("__mp_main__")
        self.__dict__["_fiberrl_main_path"] = path

    def __getattr__(self, name: str):
        path = self.__dict__.pop("_fiberrl_main_path", None)
        if path is None or name.startswith("__"):
            raise AttributeError(f"module '__main__' has no attribute {name!r}")
        logger.debug("running the parent's main script %s as __mp_main__", path)
        namespace = self.__dict__
        already = {key: value for key, value in namespace.items() if not key.startswith("__")}
        try:
            with open(path, "rb") as source:
                code = compile(source.read(), path, "exec")
        except (SyntaxError, ValueError):   # not source (a .pyc): runpy knows those
            import runpy
            namespace.update(runpy.run_path(path, run_name="__mp_main__"))
            namespace.update(already)
            return getattr(self, name)
        namespace.update(__file__=path, __builtins__=__builtins__)
        exec(code, namespace)   # noqa: S102 - the parent's own script, as spawn runs it
        namespace.update(already)
        return getattr(self, name)


def _adopt_parent_main(path: Optional[str]) -> None:
    """Make the parent's main script this job's ``__main__`` (see :class:`_ParentMain`)."""
    if path is not None:
        sys.modules["__main__"] = sys.modules["__mp_main__"] = _ParentMain(path)


def _tell_started(fd: int) -> None:
    """Tell whoever started this job (through ``fd``) that it is connected."""
    try:
        os.write(fd, b"1")
        os.close(fd)
    except OSError:
        logger.debug("could not say started on descriptor %d", fd)


def _interruptible(run: Callable[[], Any], name: str) -> Callable[[], Any]:
    """``run`` with SIGINT let through while it runs, and only then: the stdlib's
    bootstrap before it (closing stdin, the after-fork hooks) is still the job's start,
    where a Ctrl-C ends the job quietly (see :mod:`fiberrl._runtime.interrupts`), and
    the exit after it is not to be interrupted."""
    def run_with_interrupts() -> Any:
        if not interrupts.release():   # Ctrl-C during start-up: the whole run is ending
            logger.debug("interrupted while starting; not running %s", name)
            raise SystemExit(interrupts.INTERRUPTED_EXIT)
        try:
            return run()
        finally:
            interrupts.hold()
    return run_with_interrupts


def main() -> int:
    """Run the job described by the environment; return its exit code."""
    interrupts.hold()  # already held on the local backend; see _runtime.interrupts
    spare_setting = os.environ.get(spare.SPARE_ENV)
    if spare_setting is not None and not spare.become_job(spare_setting):
        return 0   # discarded: no job came
    jobenv.write_output_to_file()
    address, token = parent_address(), os.environ[TOKEN_ENV]
    secret = run_secret()  # read it before it leaves the environment
    _mp_process.current_process().authkey = secret
    jobenv.set_job_token(token)
    for name in (TOKEN_ENV, SECRET_ENV):
        os.environ.pop(name, None)  # not inherited by grandchildren's user code
    started_fd = os.environ.pop(STARTED_ENV, None)
    cfg = get_config()
    log.configure_worker(cfg.log_level, os.environ.get(JOB_ENV, "job"))

    parent_r, parent_w = os.pipe()
    watch = ParentWatch(address, token, cfg.parent_grace, cfg.heartbeat_interval, parent_w)
    prep, body = watch.hello(os.getpid(), local_hostname(), timeout=cfg.start_timeout)
    log.get_logger().setLevel(prep["log_level"])  # the parent's, see popen._job_log_level
    jobenv.set_start_method(prep["start_method"])  # as the stdlib's child
    for entry in reversed(prep["sys_path"]):
        if entry not in sys.path:
            sys.path.insert(0, entry)
    try:
        os.chdir(prep["cwd"])
    except OSError:
        logger.debug("working directory %s does not exist here", prep["cwd"])
    _adopt_parent_main(prep.get("main_path"))
    process_obj = reduction.loads(body)
    if "authkey" not in process_obj._config:  # it travelled in the environment instead
        process_obj._config["authkey"] = _mp_process.AuthenticationString(secret)

    start_parent_watch(watch)
    if started_fd is not None:
        _tell_started(int(started_fd))
    process_obj.run = _interruptible(process_obj.run, process_obj.name)
    exitcode = process_obj._bootstrap(parent_sentinel=parent_r)
    watch.report_exit(exitcode)   # if the parent is gone, the backend reports it instead
    _finish_shared_objects()
    watch.stop()
    from ._runtime import runtime
    runtime.stop()
    return exitcode


if __name__ == "__main__":
    sys.exit(main())
