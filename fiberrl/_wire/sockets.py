"""Sockets under the wire: where to listen, how to connect, how to tune a stream.

Every fiberrl listener binds TCP on a host (any free port, unless the user gave
one) and, on Linux, an abstract Unix socket whose name is derived from that TCP
address. A connector to ``(host, port)`` tries that Unix name first: it exists only
in the listener's network namespace (this host, this pod, this container), where
it is cheaper than TCP loopback; anywhere else the attempt fails at once and TCP is
used. So an address is always a plain ``(host, port)`` tuple.

TCP streams get ``TCP_NODELAY`` and keepalive probes tuned from the configuration's
heartbeat settings: the one rule by which a silent, vanished host is noticed.
"""
from __future__ import annotations

import select
import socket
import sys
import time
from typing import Optional, Tuple

Address = Tuple[str, int]

_HAS_ABSTRACT_UNIX = hasattr(socket, "AF_UNIX") and sys.platform.startswith("linux")
_BACKLOG = 1024


def local_hostname() -> str:
    """This machine's host name."""
    return socket.gethostname()


def default_listen_host() -> str:
    """An address other machines can reach this one at (falls back to loopback)."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect(("10.255.255.255", 1))
            return probe.getsockname()[0]
    except OSError:
        return "127.0.0.1"


def unix_name(address: Address) -> Optional[str]:
    """The abstract Unix socket a listener at TCP ``address`` also binds (Linux)."""
    if not _HAS_ABSTRACT_UNIX:
        return None
    return f"\0fiberrl-{address[0]}-{address[1]}"


def keepalive_settings() -> Tuple[int, int, int]:
    """``(idle, interval, probes)`` seconds for TCP keepalive, from the heartbeat settings:
    a peer silent for about ``heartbeat_timeout`` seconds is declared gone."""
    from ..config import get_config
    cfg = get_config()
    interval = max(1, int(cfg.heartbeat_interval))
    return interval, interval, max(1, int(cfg.heartbeat_timeout // interval))


def tune(sock: socket.socket) -> None:
    """No Nagle delay and keepalive probes on a TCP stream (nothing for Unix sockets)."""
    if sock.family not in (socket.AF_INET, socket.AF_INET6):
        return
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    if hasattr(socket, "TCP_KEEPIDLE"):
        idle, interval, probes = keepalive_settings()
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, idle)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL, interval)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT, probes)


def listen(host: str, port: int = 0) -> Tuple[list, Address]:
    """Bind and listen on TCP ``(host, port)`` and its abstract Unix name.

    Returns ``([tcp_socket, unix_socket?], (host, bound_port))``; sockets are
    non-blocking. ``OSError`` if the TCP address cannot be bound.
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    tcp = socket.socket(family, socket.SOCK_STREAM)
    try:
        if port:
            tcp.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        tcp.bind((host, port))
        tcp.listen(_BACKLOG)
    except BaseException:
        tcp.close()
        raise
    tcp.setblocking(False)
    address = (host, tcp.getsockname()[1])
    sockets = [tcp]
    name = unix_name(address)
    if name is not None:
        unix = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            unix.bind(name)
            unix.listen(_BACKLOG)
            unix.setblocking(False)
            sockets.append(unix)
        except OSError:
            unix.close()  # the name is taken in this namespace: TCP only
    return sockets, address


def connect(address: Address, timeout: float) -> socket.socket:
    """A connected, tuned, blocking socket to the listener at ``address``: its Unix
    socket when it is in this network namespace, else TCP. ``OSError`` if neither."""
    name = unix_name(address)
    if name is not None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(timeout)
        try:
            sock.connect(name)
            return sock
        except OSError:
            sock.close()
    sock = socket.create_connection((address[0].strip("[]"), int(address[1])), timeout=timeout)
    tune(sock)
    return sock


def recv_exact(sock: socket.socket, n: int, deadline: float) -> bytes:
    """Read exactly ``n`` bytes before ``deadline``; ``ConnectionError`` on EOF,
    ``socket.timeout`` when the deadline passes."""
    data = b""
    while len(data) < n:
        sock.settimeout(max(0.001, deadline - time.monotonic()))
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise ConnectionError("the peer closed the connection during set-up")
        data += chunk
    return data


def wait_for(fd: int, writable: bool = False, timeout: Optional[float] = None) -> bool:
    """Wait until ``fd`` is readable (or writable) or has hung up; False on timeout.
    (``poll``, not ``select``: descriptors above 1024 are common in a big pool's master.)"""
    poller = select.poll()
    poller.register(fd, select.POLLOUT if writable else select.POLLIN)
    wait = None if timeout is None else max(0, int(timeout * 1000 + 0.999))
    while True:
        try:
            return bool(poller.poll(wait))
        except InterruptedError:  # pragma: no cover - PEP 475 retries for us
            continue
