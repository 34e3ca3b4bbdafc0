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
import time

import zmq

from . import log, popen, reduction, transport
from .config import get_config
from .popen import DOOR_ENV, HUB_ENV, JOB_ENV, SENTINEL_ENV, TOKEN_ENV

logger = logging.getLogger(__name__)


def _watch_parent(address: str, grace: float, sentinel_write: int, stop_fd: int) -> None:
    """Exit this job if the parent's hub stays unreachable for ``grace`` seconds.

    Returns, closing its sockets, when ``stop_fd`` becomes readable: the job is
    ending and is about to destroy the ZeroMQ context, which must not close a socket
    this thread is polling (that can crash ZeroMQ).
    """
    sock = transport.context().socket(zmq.DEALER)
    transport.configure_peer_socket(sock)
    sock.setsockopt(zmq.LINGER, 0)
    monitor = transport.monitor_socket(sock, zmq.EVENT_CONNECTED | zmq.EVENT_DISCONNECTED)
    sock.connect(address)
    try:
        _watch_loop(monitor, address, grace, sentinel_write, stop_fd)
    except zmq.ZMQError:
        return  # the job is ending: its sockets were closed under this thread
    transport.close_monitored(sock, monitor, 0)


def _watch_loop(monitor, address: str, grace: float, sentinel_write: int, stop_fd: int) -> None:
    poller = zmq.Poller()
    poller.register(monitor, zmq.POLLIN)
    poller.register(stop_fd, zmq.POLLIN)
    lost_since = None
    while True:
        remaining = None if lost_since is None else max(0.0, grace - (time.monotonic() - lost_since))
        ready = dict(poller.poll(None if remaining is None else remaining * 1000))
        if stop_fd in ready:
            return
        if monitor in ready:
            event = transport.monitor_event(monitor)
            if event == zmq.EVENT_CONNECTED:
                lost_since = None
            elif event == zmq.EVENT_DISCONNECTED and lost_since is None:
                lost_since = time.monotonic()
        elif lost_since is not None and time.monotonic() - lost_since >= grace:
            # the parent is gone: parent_process().is_alive() turns False at once, and
            # the job gets one more grace period to finish up before it exits
            os.close(sentinel_write)
            logger.error("parent process is gone (hub %s unreachable for %.1f s); "
                         "exiting in %.1f s", address, grace, grace)
            time.sleep(grace)
            logging.shutdown()
            os._exit(1)


def _finish_shared_objects() -> None:
    """Deliver pending queue items, close pipes, stop the hub: only for what this job
    used (importing those modules just to find nothing would slow every job's exit)."""
    queues, connection, hub = (sys.modules.get(f"fiberrl.{name}")
                               for name in ("queues", "connection", "hub"))
    if queues is not None:
        queues.flush_all()
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
    popen._current_token = token
    for name in (TOKEN_ENV, transport.SECRET_ENV):
        os.environ.pop(name, None)  # not inherited by grandchildren's user code
    inherited_sentinel = os.environ.pop(SENTINEL_ENV, None)
    cfg = get_config()
    log.configure_worker(cfg.log_level, os.environ.get(JOB_ENV, "job"))

    client = transport.client_for(address)
    door = os.environ.get(DOOR_ENV)
    if door:
        client.know_door(json.loads(door))
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
    watcher = threading.Thread(target=_watch_parent,
                               args=(address, cfg.parent_grace, parent_w, stop_r),
                               name="fiberrl-parent-watch", daemon=True)
    watcher.start()
    exitcode = process_obj._bootstrap(parent_sentinel=parent_r)
    try:
        client.cast("spawn", "exit", token, exitcode)
    except (zmq.ZMQError, ConnectionError):
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
