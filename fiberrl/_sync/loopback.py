"""How a manager client reaches a server: over the wire, or in memory when the server
runs in the calling process.

``servers`` maps the address of each server this process serves to the server
(:mod:`.serving` fills it). ``ClientFactory`` is the ``Client`` the stdlib's manager
code calls for its bookkeeping requests (create, incref, decref...): for a server of
this process it returns a :class:`_LoopbackConnection` that runs the request in the
calling thread, else a :class:`~.connections.ServerConnection`.

A server may also let the threads of its own process call some of its objects
directly (:func:`direct_referent`): the coordination service does, for the objects
of :mod:`.robust`, whose methods are thread-safe and tell their callers apart (a
remote client by the thread serving it, see :data:`serving_thread`; a thread of this
process by its own ident). A forked child serves nothing of its parent's, so it
forgets the servers and any direct referent it found (:data:`fork_generation`).
"""
from __future__ import annotations

import os
import threading
import traceback
from typing import Any, Dict, Optional, Tuple

from .connections import codec, open_connection

servers_lock = threading.Lock()
servers: Dict[Any, Any] = {}  # address -> server running in this process

#: bumped in a forked child: what was found in the parent's servers is stale there
fork_generation = 0


class _ServingThread(threading.local):
    conn: Any = None   # the client connection a server thread serves (None elsewhere)


#: ``serving_thread.conn``: the client connection the calling server thread serves
serving_thread = _ServingThread()


def _forget_servers_in_child() -> None:
    global fork_generation
    fork_generation += 1
    servers.clear()


os.register_at_fork(after_in_child=_forget_servers_in_child)


def direct_referent(token: Any) -> Optional[Tuple[int, Any, frozenset]]:
    """``(fork_generation, object, exposed methods)`` when ``token``'s object lives in
    a server of this process that lets this process's threads call it directly
    (``server.direct_calls`` and the object's ``direct_calls``, and no method of it
    returns a proxy), else None."""
    with servers_lock:
        server = servers.get(token.address)
    if server is None or not getattr(server, "direct_calls", False):
        return None
    entry = server.id_to_obj.get(token.id)
    if entry is None:
        return None
    obj, exposed, method_to_typeid = entry
    if method_to_typeid or not getattr(obj, "direct_calls", False):
        return None
    return fork_generation, obj, frozenset(exposed)


class _LoopbackConnection:
    """A one-request "connection" to a server running in this process, served in the
    calling thread. The proxies' bookkeeping (incref, decref, create...) runs from
    garbage-collection finalizers in any thread, including one the server's own
    accept loop is waiting to start; a socket there could deadlock the process.
    """

    def __init__(self, server: Any) -> None:
        self._server = server
        self._reply: Any = None
        self._in_call = False

    def send(self, obj: Any) -> None:
        """Run a request; while it runs, a send is the server's reply (``shutdown``)."""
        if self._in_call:
            self._reply = obj
            return
        _ignored, funcname, args, kwds = obj
        self._in_call = True
        try:
            if funcname not in self._server.public or funcname == "accept_connection":
                raise ValueError(f"{funcname!r} cannot be run in this process's own server")
            result = getattr(self._server, funcname)(self, *args, **kwds)
        except Exception:
            reply = ("#TRACEBACK", traceback.format_exc())
        else:
            reply = ("#RETURN", result)
        finally:
            self._in_call = False
        if self._reply is None:
            self._reply = reply

    def recv(self) -> Any:
        """The reply to the request just run."""
        reply, self._reply = self._reply, None
        return reply

    def close(self) -> None:
        """Nothing to close."""


class ClientFactory:
    """``Client(address, authkey=...)`` for one serializer, as the stdlib's managers call it.

    A server running in this process is reached without a socket (see
    :class:`_LoopbackConnection`); proxies' own method calls use a socket unless their
    referent may be called directly (:func:`direct_referent`).
    """

    _instances: Dict[str, "ClientFactory"] = {}

    def __init__(self, serializer: str) -> None:
        codec(serializer)
        self.serializer = serializer

    @classmethod
    def for_serializer(cls, serializer: str) -> "ClientFactory":
        """The shared factory of ``serializer``."""
        factory = cls._instances.get(serializer)
        if factory is None:
            factory = cls._instances[serializer] = cls(serializer)
        return factory

    def __call__(self, address: Any, authkey: Optional[bytes] = None) -> Any:
        with servers_lock:
            server = servers.get(address)
        if server is not None and not server.stop_event.is_set():
            return _LoopbackConnection(server)
        return open_connection(address, authkey, self.serializer)
