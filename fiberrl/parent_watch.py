"""A job watching its parent: when the parent's hub is gone, the job goes too.

If the hub stays unreachable for ``grace`` seconds, ``parent_process().is_alive()``
turns False at once (the parent sentinel fires) and the job exits after ``grace``
more seconds: no orphans.

Two ways to watch, one thread either way:

* over a stream to the hub's door (the usual case): the hub never writes on it, so
  the stream becoming readable means it ended. TCP keepalive, tuned to the
  heartbeat settings, notices a parent machine that vanished without a word;
* over a ZeroMQ socket with connection events (a parent without a door).

Either returns, closing what it opened, when ``stop_fd`` becomes readable: the job is
ending (ZeroMQ must not close a socket under a thread that is polling it).
"""
from __future__ import annotations

import logging
import os
import select
import socket
import time
from typing import Any, Optional

from . import transport
from .config import get_config

logger = logging.getLogger(__name__)

_RETRY = 0.2


def _parent_gone(where: str, grace: float, sentinel_write: int) -> None:
    # parent_process().is_alive() turns False now; the job gets one more grace
    # period to finish up before it exits
    os.close(sentinel_write)
    logger.error("parent process is gone (hub %s unreachable for %.1f s); exiting in %.1f s",
                 where, grace, grace)
    time.sleep(grace)
    logging.shutdown()
    os._exit(1)


def _keepalive(sock: socket.socket) -> None:
    """Probe an idle TCP stream as often as the ZeroMQ heartbeats would."""
    if sock.family not in (socket.AF_INET, socket.AF_INET6) or not hasattr(socket, "TCP_KEEPIDLE"):
        return
    cfg = get_config()
    interval = max(1, int(cfg.heartbeat_interval))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, interval)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL, interval)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT,
                    max(1, int(cfg.heartbeat_timeout // interval)))


def _open(door: dict) -> Optional[Any]:
    conn = transport.connect_door(door, timeout=5.0)
    if conn is not None:
        _keepalive(conn.sock)
    return conn


def watch_over_stream(door: dict, grace: float, sentinel_write: int, stop_fd: int) -> None:
    """Watch the parent through a stream to its hub's door (see the module docstring)."""
    conn = _open(door)
    lost_since = None if conn is not None else time.monotonic()
    while True:
        if conn is not None:
            ready, _, _ = select.select([conn.sock, stop_fd], [], [])
            conn.close()   # told to stop, or readable: the stream ended (the hub never writes)
            if stop_fd in ready:
                return
            conn, lost_since = None, time.monotonic()
            continue
        ready, _, _ = select.select([stop_fd], [], [], _RETRY)
        if ready:
            return
        conn = _open(door)
        if conn is not None:
            lost_since = None
        elif time.monotonic() - lost_since >= grace:
            _parent_gone(door.get("tcp", "?"), grace, sentinel_write)


def watch_over_zmq(address: str, grace: float, sentinel_write: int, stop_fd: int) -> None:
    """Watch the parent through ZeroMQ connection events on its hub's address."""
    import zmq
    sock = transport.context().socket(zmq.DEALER)
    transport.configure_peer_socket(sock)
    sock.setsockopt(zmq.LINGER, 0)
    monitor = transport.monitor_socket(sock, zmq.EVENT_CONNECTED | zmq.EVENT_DISCONNECTED)
    sock.connect(address)
    try:
        _zmq_loop(monitor, address, grace, sentinel_write, stop_fd)
    except zmq.ZMQError:
        return  # the job is ending: its sockets were closed under this thread
    transport.close_monitored(sock, monitor, 0)


def _zmq_loop(monitor, address: str, grace: float, sentinel_write: int, stop_fd: int) -> None:
    import zmq
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
            _parent_gone(address, grace, sentinel_write)
