"""A process's runtime: its one I/O loop, its one acceptor, and the services on them.

Data flow::

    other processes ──stream, label──> acceptor ──"rpc"──────> RpcServer ─> services
                                          │     ──"pipe:…"───> the pipe end's inbox
                                          │     ──"pool:…"───> a pool's dispatcher
                                          │     ──"watch:…"──> the job watch
                                          │     ──"manager:…"> a manager server thread
    threads of this process ──call_soon──> I/O loop (acceptor set-ups, links, timers)

Both start on first use: the loop when something needs it (a job's output, a
watched job), the acceptor when this process first owns something others must
reach (a queue, a pipe's rendezvous, a started job, a pool, a lock). The acceptor
binds the backend's listen address: TCP on any free port, and the abstract Unix
socket of that address for peers in the same network namespace.
"""
from __future__ import annotations

import logging
import os
import threading
from typing import Any, Callable, Optional

from .acceptor import Acceptor
from .reactor import Reactor
from .rpc import RpcServer

logger = logging.getLogger(__name__)

_lock = threading.RLock()
_reactor: Optional[Reactor] = None
_runtime: Optional["Runtime"] = None


class Runtime:
    """The acceptor and RPC services of this process, on its loop. Use :func:`runtime`."""

    def __init__(self, loop: Reactor, host: str) -> None:
        self.reactor = loop
        self.acceptor = Acceptor(loop, host)
        self.address = self.acceptor.address
        self.rpc = RpcServer(loop)
        self.rpc.serve_own_loop(self.address)
        self.acceptor.route("rpc", self.rpc.take)
        self.pid = os.getpid()
        logger.debug("runtime listening on %s:%s", *self.address)

    def service(self, name: str, factory: Callable[["Runtime"], Any]) -> Any:
        """The object serving ``name``, made by ``factory(runtime)`` the first time."""
        with _lock:
            obj = self.rpc.objects.get(name)
            if obj is None:
                obj = self.rpc.objects[name] = factory(self)
            return obj

    def existing_service(self, name: str) -> Any:
        """The object serving ``name``, or None (makes nothing)."""
        return self.rpc.objects.get(name)


def reactor() -> Reactor:
    """This process's I/O loop, started on first use."""
    global _reactor
    loop = _reactor
    if loop is not None and loop.pid == os.getpid():
        return loop
    with _lock:
        if _reactor is None or _reactor.pid != os.getpid():
            _reactor = Reactor()
        return _reactor


def runtime() -> Runtime:
    """This process's runtime, started on first use on the backend's listen address."""
    global _runtime
    current = _runtime
    if current is not None and current.pid == os.getpid():
        return current
    with _lock:
        if _runtime is None or _runtime.pid != os.getpid():
            from ..backends import default_backend
            _runtime = Runtime(reactor(), default_backend().listen_host())
        return _runtime


def current_runtime() -> Optional[Runtime]:
    """This process's runtime if it was started, else None (starts nothing)."""
    current = _runtime
    return current if current is not None and current.pid == os.getpid() else None


def service(name: str, factory: Callable[[Runtime], Any]) -> Any:
    """The object serving ``name`` in this process (the runtime starts if needed)."""
    return runtime().service(name, factory)


def existing_service(name: str) -> Any:
    """The object serving ``name`` if this process's runtime has one (starts nothing)."""
    current = current_runtime()
    return None if current is None else current.existing_service(name)


def stop() -> None:
    """Stop this process's loop and acceptor (a job, at its end)."""
    current, loop = current_runtime(), _reactor
    if current is not None:
        current.acceptor.close()
    if loop is not None and loop.pid == os.getpid():
        loop.stop()
        loop.thread.join(2.0)
