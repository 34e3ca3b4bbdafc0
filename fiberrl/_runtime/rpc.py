"""Calls between processes: named services served on the I/O loop, and their clients.

A service is an object registered under a name (``"spawn"``, ``"queue"``, ``"pipe"``)
in a process's :class:`RpcServer`; it is called as ``service(op, request)`` on the
loop, must not block, and answers now or later with :meth:`Request.reply` or
:meth:`Request.fail` (from any thread). Clients in any process reach it with an
:class:`RpcClient` for the owner's address: one stream per calling thread, to the
owner's ``"rpc"`` route.

A request is one message whose frame 0 pickles ``(service, op, req_id, args, first)``
and whose other frames are the rest of its body; ``first`` is the body's first frame
(a pickle stream, usually) carried inside the signed frame 0, so that it is covered
by the MAC. A reply pickles ``(req_id, "ok"|"err", values, first)``. ``req_id`` 0 is
a one-way cast.
"""
from __future__ import annotations

import itertools
import logging
import os
import pickle
import socket
import threading
import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from .._wire.sockets import Address
from .._wire.stream import Stream, open_stream
from ..errors import OwnerGoneError
from .link import Link
from .reactor import Reactor

logger = logging.getLogger(__name__)

_KIND = b"m"
Service = Callable[[str, "Request"], None]


def pack_body(body: Sequence[Any]) -> Tuple[Optional[bytes], List[Any]]:
    """``(first, rest)``: the body's first frame as bytes (to be signed), the rest as is."""
    if not body:
        return None, []
    first = body[0] if type(body[0]) is bytes else bytes(body[0])
    return first, list(body[1:])


def unpack_body(first: Optional[bytes], rest: List[Any]) -> List[Any]:
    """The inverse of :func:`pack_body`."""
    return rest if first is None else [memoryview(first), *rest]


class Request:
    """One authenticated request; answer it at most once, from any thread."""

    __slots__ = ("link", "req_id", "args", "body", "answered")

    def __init__(self, link: Link, req_id: int, args: tuple, body: List[Any]) -> None:
        self.link, self.req_id, self.args, self.body = link, req_id, args, body
        self.answered = False

    def reply(self, *values: Any, body: Sequence[Any] = ()) -> None:
        """Send a successful reply."""
        self._send("ok", values, body)

    def fail(self, exc: BaseException) -> None:
        """Send an exception to be raised in the caller."""
        self._send("err", exc, ())

    def _send(self, status: str, values: Any, body: Sequence[Any]) -> None:
        if self.answered or not self.req_id:
            return
        self.answered = True
        first, rest = pack_body(body)
        self.link.send(_KIND, [pickle.dumps((self.req_id, status, values, first), protocol=5),
                               *rest])


class _KeptReply:
    """Stands for the stream of a call the loop makes to its own services: the reply
    is kept here instead of being sent."""

    __slots__ = ("frames",)

    def __init__(self) -> None:
        self.frames: Optional[List[Any]] = None

    def send(self, kind: bytes, frames: List[Any]) -> None:
        """Keep the reply."""
        self.frames = frames


class RpcServer:
    """The services of one process, reached over its acceptor's ``"rpc"`` route."""

    def __init__(self, reactor: Reactor) -> None:
        self.reactor = reactor
        self.services: Dict[str, Service] = {}
        self.objects: Dict[str, Any] = {}   # see Runtime.service()

    def register(self, name: str, service: Service) -> None:
        """Route calls naming ``name`` to ``service(op, request)``."""
        self.services[name] = service

    def serve_own_loop(self, address: Address) -> None:
        """Answer in-process the calls that this process's loop makes to ``address``
        (its own): over a stream, the loop would wait for itself to accept it. Such a
        call comes from code the loop runs for others, a finalizer the garbage
        collector ran there, say, which uses a pipe end for the first time."""
        _loop_servers[tuple(address)] = self

    def call_here(self, service: str, op: str, req_id: int, args: tuple,
                  body: Sequence[Any]) -> Optional[Tuple[tuple, List[Any]]]:
        """Serve one call of this process's loop to its own services, as a request
        from a stream would be served; its reply ``(values, body)``, None for a cast.
        ``RuntimeError`` if the service would answer later: the loop cannot wait."""
        first, rest = pack_body(body)
        kept = _KeptReply()
        self._on_message(kept, _KIND,   # type: ignore[arg-type]
                         [pickle.dumps((service, op, req_id, args, first), protocol=5), *rest])
        if not req_id:
            return None
        if kept.frames is None:
            raise RuntimeError(f"{service}.{op} waits for something to happen, and it was called "
                               "on fiberrl's I/O thread (from a finalizer or a callback run "
                               "there), which cannot wait")
        _, status, values, reply_first = pickle.loads(kept.frames[0])
        if status == "err":
            raise values
        return values, unpack_body(reply_first, list(kept.frames[1:]))

    def take(self, label: str, sock: socket.socket, send_key: bytes, recv_key: bytes,
             leftover: bytes) -> bool:
        """Adopt an authenticated ``"rpc"`` stream (the acceptor's route)."""
        Link(self.reactor, sock, send_key, recv_key, leftover, self._on_message)
        return True

    def _on_message(self, link: Link, kind: bytes, frames: List[Any]) -> None:
        try:
            service_name, op, req_id, args, first = pickle.loads(frames[0])
        except Exception:  # signed by a holder of the secret, yet malformed: a bug
            logger.exception("malformed request; closing its stream")
            link.close("malformed request")
            return
        request = Request(link, req_id, tuple(args), unpack_body(first, frames[1:]))
        service = self.services.get(service_name)
        if service is None:
            request.fail(LookupError(f"this process has no service {service_name!r}"))
            return
        try:
            service(op, request)
        except Exception as exc:  # report to the caller, keep serving
            logger.debug("service %s.%s raised", service_name, op, exc_info=True)
            request.fail(exc)


#: this process's RPC servers by address, for the calls their own loop makes
_loop_servers: Dict[tuple, RpcServer] = {}


def _server_for_own_loop(address: tuple) -> Optional[RpcServer]:
    """The server at ``address`` when it is this process's and this thread its loop."""
    server = _loop_servers.get(address)
    return server if server is not None and server.reactor.in_loop() else None


_call_ids = itertools.count(1)


class RpcClient:
    """Calls the services of the process at ``address``; one stream per calling thread.

    A stream that ends (the owner's process exited, its host was lost and keepalive
    noticed) raises :class:`~fiberrl.errors.OwnerGoneError` instead of hanging.
    """

    def __init__(self, address: Address, what: str = "process") -> None:
        self.address = tuple(address)
        self.what = what
        self._local = threading.local()

    def _stream(self) -> Stream:
        local = self._local
        stream = getattr(local, "stream", None)
        if stream is None or local.pid != os.getpid() or stream.closed:
            try:
                stream = open_stream(self.address, "rpc")
            except (OSError, TimeoutError) as exc:
                raise self._gone(exc) from None
            local.stream, local.pid = stream, os.getpid()
        return stream

    def _gone(self, cause: Any) -> OwnerGoneError:
        self._drop()
        return OwnerGoneError(f"the {self.what} at {self.address[0]}:{self.address[1]} is gone "
                              f"(its process exited or its host is unreachable): {cause}")

    def _drop(self) -> None:
        stream = getattr(self._local, "stream", None)
        if stream is not None:
            stream.close()
        self._local.stream = None

    def cast(self, service: str, op: str, *args: Any, body: Sequence[Any] = ()) -> None:
        """Send a one-way message to a service."""
        server = _server_for_own_loop(self.address)
        if server is not None:
            server.call_here(service, op, 0, args, body)
            return
        first, rest = pack_body(body)
        header = pickle.dumps((service, op, 0, args, first), protocol=5)
        try:
            self._stream().send(_KIND, [header, *rest])
        except OSError as exc:
            raise self._gone(exc) from None

    def call(self, service: str, op: str, *args: Any, body: Sequence[Any] = (),
             timeout: Optional[float] = None) -> Tuple[tuple, List[Any]]:
        """Call ``op`` of ``service`` and wait for its reply ``(values, body)``.

        ``TimeoutError`` after ``timeout`` seconds (None: wait while the owner is
        reachable); the service's exception if it failed the call.
        """
        req_id = next(_call_ids)
        server = _server_for_own_loop(self.address)
        if server is not None:
            return server.call_here(service, op, req_id, args, body)   # type: ignore[return-value]
        first, rest = pack_body(body)
        header = pickle.dumps((service, op, req_id, args, first), protocol=5)
        stream = self._stream()
        try:
            stream.send(_KIND, [header, *rest])
        except OSError as exc:
            raise self._gone(exc) from None
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            wait = None if deadline is None else max(0.0, deadline - time.monotonic())
            try:
                got = stream.recv(wait)
            except EOFError as exc:
                raise self._gone(exc) from None
            if got is None:
                raise TimeoutError(f"no reply from {self.address[0]}:{self.address[1]} to "
                                   f"{service}.{op} within {timeout} s")
            reply_id, status, values, reply_first = pickle.loads(got[1][0])
            if reply_id != req_id:
                continue  # a late reply to a call that timed out
            if status == "err":
                raise values
            return values, unpack_body(reply_first, got[1][1:])


_clients_lock = threading.Lock()
_clients: Dict[tuple, RpcClient] = {}


def client_for(address: Address) -> RpcClient:
    """A shared :class:`RpcClient` for ``address`` in this process."""
    key = (tuple(address), os.getpid())
    client = _clients.get(key)
    if client is None:
        with _clients_lock:
            client = _clients.setdefault(key, RpcClient(address))
    return client
