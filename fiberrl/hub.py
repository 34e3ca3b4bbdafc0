"""The hub: one background thread per process that serves everything it owns.

Data flow::

    jobs / other processes --DEALER--> [ROUTER   hub thread] --> services by name
    their HubClients, later --stream--> [door       ^     ]      "hub":   where the door is
    threads of this process --call_soon()-----------+            "spawn": job connect-back
                                                                 "pipe":  Pipe rendezvous
                                                                 "queue": queue brokers

The hub binds a ROUTER socket on the backend's listen address the first time this
process starts a job or creates a shared object, and beside it a stream listener, the
*door* (:mod:`fiberrl.hub_streams`), where clients move their calls because it is
faster. Every message is authenticated (:func:`fiberrl.transport.recv`, or the
stream's MAC) before a service sees it. Services run on the hub thread and must not
block; they answer now with :meth:`Request.reply` or keep the request and answer
later (from another thread through :meth:`Hub.call_soon`).
Timers (:meth:`Hub.call_later`) run on the hub thread too.
"""
from __future__ import annotations

import collections
import heapq
import itertools
import logging
import os
import threading
import time
from typing import Any, Callable, Dict, Optional, Sequence

import zmq

from . import transport
from .hub_streams import StreamDoor
from .transport import pack_body, unpack_body

logger = logging.getLogger(__name__)


class Request:
    """One authenticated request received by the hub; answer it at most once."""

    __slots__ = ("hub", "identity", "req_id", "args", "body", "answered", "channel")

    def __init__(self, hub: "Hub", identity: bytes, req_id: int, args: tuple, body: list,
                 channel: Any = None) -> None:
        self.hub, self.identity, self.req_id = hub, identity, req_id
        self.args, self.body, self.answered = args, body, False
        self.channel = channel  # the stream it came on, or None for ZeroMQ

    def reply(self, *values: Any, body: Sequence[Any] = ()) -> None:
        """Send a successful reply (hub thread only)."""
        self._send(("ok", *values), body)

    def fail(self, exc: BaseException) -> None:
        """Send an exception to be raised in the caller (hub thread only)."""
        self._send(("err", exc), ())

    def _send(self, values: tuple, body: Sequence[Any]) -> None:
        if self.answered or not self.req_id:
            return
        self.answered = True
        if self.channel is not None:
            first, rest = pack_body(body)
            self.hub.door.send(self.channel, (self.req_id, *values, first), rest)
        else:
            transport.send(self.hub.router, (self.req_id, *values), body, identity=self.identity)


Service = Callable[[str, Request], None]


class Hub:
    """The per-process ROUTER and its thread. Use :func:`get_hub`."""

    def __init__(self, host: str) -> None:
        ctx = transport.context()
        self.router = ctx.socket(zmq.ROUTER)
        self.router.setsockopt(zmq.LINGER, 1000)
        self.router.setsockopt(zmq.ROUTER_MANDATORY, 0)
        self.router.setsockopt(zmq.SNDHWM, 0)
        self.router.setsockopt(zmq.RCVHWM, 0)
        self.address = transport.bind_random(self.router, host)
        self.door = StreamDoor(host)
        self._wake_addr = f"inproc://fiberrl-hub-wake-{id(self)}"
        self._wake_recv = ctx.socket(zmq.PULL)
        self._wake_recv.bind(self._wake_addr)
        self._wake_lock = threading.Lock()
        self._wake_send = ctx.socket(zmq.PUSH)
        self._wake_send.connect(self._wake_addr)
        self._calls: collections.deque = collections.deque()
        self._timers: list = []
        self._timer_ids = itertools.count()
        self._services: Dict[str, Service] = {}
        self.service_objects: Dict[str, Any] = {}  # see service()
        self._stopping = False
        self.pid = os.getpid()
        self.register("hub", self._hub_service)
        self.thread = threading.Thread(target=self._run, name="fiberrl-hub", daemon=True)
        self.thread.start()
        logger.debug("hub listening on %s", self.address)

    def register(self, name: str, service: Service) -> None:
        """Route requests whose header names ``name`` to ``service(op, request)``."""
        self._services[name] = service

    def call_soon(self, fn: Callable[[], Any]) -> None:
        """Run ``fn`` on the hub thread (thread-safe)."""
        self._calls.append(fn)
        with self._wake_lock:
            try:
                self._wake_send.send(b"", zmq.NOBLOCK)
            except zmq.Again:
                pass  # wake-ups already queued; the hub will drain the deque

    def call_later(self, delay: float, fn: Callable[[], Any]) -> list:
        """Run ``fn`` on the hub thread after ``delay`` seconds (call from the hub thread).

        Returns a handle; set ``handle[2] = None`` to cancel.
        """
        entry = [time.monotonic() + delay, next(self._timer_ids), fn]
        heapq.heappush(self._timers, entry)
        return entry

    def _run_timers(self) -> Optional[float]:
        now = time.monotonic()
        while self._timers and self._timers[0][0] <= now:
            _, _, fn = heapq.heappop(self._timers)
            if fn is not None:
                self._safely(fn)
        return None if not self._timers else max(0.0, self._timers[0][0] - time.monotonic())

    @staticmethod
    def _safely(fn: Callable[[], Any]) -> None:
        try:
            fn()
        except Exception:  # a bug in one service must not kill the hub
            logger.exception("fiberrl hub callback failed")

    def _hub_service(self, op: str, request: Request) -> None:
        if op == "streams":
            request.reply(self.door.address)
        else:
            request.fail(ValueError(f"unknown hub op {op!r}"))

    def _dispatch(self, identity: bytes, header: tuple, body: list) -> None:
        service_name, op, req_id, *args = header
        self._route(service_name, op, Request(self, identity, req_id, tuple(args), body))

    def _dispatch_stream(self, channel: Any, header: tuple, buffers: list) -> None:
        service_name, op, req_id, args, first = header
        self._route(service_name, op, Request(self, b"", req_id, tuple(args),
                                              unpack_body(first, buffers), channel))

    def _route(self, service_name: str, op: str, request: Request) -> None:
        service = self._services.get(service_name)
        if service is None:
            request.fail(LookupError(f"this hub has no service {service_name!r}"))
            return
        try:
            service(op, request)
        except Exception as exc:  # report to the caller, keep serving
            logger.debug("hub service %s.%s raised", service_name, op, exc_info=True)
            request.fail(exc)

    def _run(self) -> None:
        poller = zmq.Poller()
        poller.register(self.router, zmq.POLLIN)
        poller.register(self._wake_recv, zmq.POLLIN)
        self.door.register(poller)
        while not self._stopping:
            timeout = self._run_timers()
            self.door.update_interest(poller)
            events = dict(poller.poll(None if timeout is None else timeout * 1000 + 1))
            if self._wake_recv in events:
                while self._wake_recv.poll(0):
                    self._wake_recv.recv()
            while self._calls:
                self._safely(self._calls.popleft())
            if self.router in events:
                for _ in range(1000):  # drain a burst, then look at timers and calls again
                    try:
                        got = transport.recv(self.router, router=True, flags=zmq.NOBLOCK)
                    except zmq.Again:
                        break
                    if got is not None:
                        self._dispatch(*got)
            self.door.handle(events, poller, self._dispatch_stream)

    def stop(self) -> None:
        """Stop serving (used at interpreter exit)."""
        self._stopping = True
        self.call_soon(lambda: None)


_hub_lock = threading.Lock()
_hub: Optional[Hub] = None


def get_hub() -> Hub:
    """This process's hub, started on first use on the backend's listen address."""
    global _hub
    with _hub_lock:
        if _hub is None or _hub.pid != os.getpid():
            from .backends import default_backend
            _hub = Hub(default_backend().listen_host())
        return _hub


def service(name: str, factory: Callable[[Hub], Any]) -> Any:
    """The object serving ``name`` on this process's hub, made by ``factory(hub)``
    the first time (the hub is started if needed)."""
    hub = get_hub()
    with _hub_lock:
        obj = hub.service_objects.get(name)
        if obj is None:
            obj = hub.service_objects[name] = factory(hub)
        return obj


def existing_service(name: str) -> Any:
    """The object serving ``name`` on this process's hub, or None (starts nothing)."""
    hub = current_hub()
    return None if hub is None else hub.service_objects.get(name)


def current_hub() -> Optional[Hub]:
    """This process's hub if one has been started, else None."""
    return _hub if _hub is not None and _hub.pid == os.getpid() else None
