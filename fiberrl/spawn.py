"""Worker entry point: ``python -m fiberrl.spawn``.

1. read the hub address, one-time token and secret from the environment;
2. say hello to the parent's hub and receive the payload (authenticated);
3. restore ``sys.path`` and the working directory, unpickle the process object;
4. watch the parent's hub: if it is gone for ``parent_grace`` seconds, the parent
   sentinel fires, and after ``parent_grace`` more seconds the job exits (no orphans);
5. run the process through the stdlib's ``BaseProcess._bootstrap`` (same exit codes,
   same traceback printing), report the exit code to the hub, exit with it.
"""
from __future__ import annotations

import json
import logging
import os
import socket
import sys
import threading

from . import jobenv, log, reduction, transport
from .config import get_config
from .jobenv import DOOR_ENV, HUB_ENV, JOB_ENV, SENTINEL_ENV, TOKEN_ENV
from .parent_watch import watch_over_stream, watch_over_zmq

logger = logging.getLogger(__name__)


def _finish_shared_objects() -> None:
    """Deliver pending queue items, close pipes, stop the hub: only for what this job
    used (importing those modules just to find nothing would slow every job's exit)."""
    feeders, connection, hub = (sys.modules.get(f"fiberrl.{name}")
                                for name in ("queue_feeder", "connection", "hub"))
    if feeders is not None:
        feeders.flush_all()
    if connection is not None:
        connection.close_all()
    running_hub = hub.current_hub() if hub is not None else None
    if running_hub is not None:
        running_hub.stop()
        running_hub.thread.join(2.0)


def main() -> int:
    """Run the job described by the environment; return its exit code."""
    address, token = os.environ[HUB_ENV], os.environ[TOKEN_ENV]
    transport.secret()  # read it before it leaves the environment
    jobenv.set_job_token(token)
    for name in (TOKEN_ENV, transport.SECRET_ENV):
        os.environ.pop(name, None)  # not inherited by grandchildren's user code
    inherited_sentinel = os.environ.pop(SENTINEL_ENV, None)
    cfg = get_config()
    log.configure_worker(cfg.log_level, os.environ.get(JOB_ENV, "job"))

    client = transport.client_for(address)
    door = json.loads(os.environ.get(DOOR_ENV) or "null")
    if door:
        client.know_door(door)
    (prep,), body = client.call("spawn", "hello", token, os.getpid(), socket.gethostname(),
                                timeout=cfg.start_timeout)
    for entry in reversed(prep["sys_path"]):
        if entry not in sys.path:
            sys.path.insert(0, entry)
    try:
        os.chdir(prep["cwd"])
    except OSError:
        logger.debug("working directory %s does not exist here", prep["cwd"])
    process_obj = reduction.loads(body)

    parent_r, parent_w = os.pipe()
    stop_r, stop_w = os.pipe()
    watch, where = (watch_over_stream, door) if door else (watch_over_zmq, address)
    watcher = threading.Thread(target=watch, args=(where, cfg.parent_grace, parent_w, stop_r),
                               name="fiberrl-parent-watch", daemon=True)
    watcher.start()
    exitcode = process_obj._bootstrap(parent_sentinel=parent_r)
    try:
        client.cast("spawn", "exit", token, exitcode)
    except Exception:  # zmq.ZMQError or ConnectionError: the parent is gone
        pass  # the parent is gone; the backend reports the exit code instead
    _finish_shared_objects()
    os.write(stop_w, b"x")
    watcher.join(1.0)
    transport.flush_and_close()
    if inherited_sentinel is not None:
        try:
            os.close(int(inherited_sentinel))
        except OSError:
            pass
    return exitcode


if __name__ == "__main__":
    sys.exit(main())
