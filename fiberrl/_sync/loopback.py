"""How a manager client reaches a server: over the wire, or in memory when the server
runs in the calling process.

``servers`` maps the address of each server this process serves to the server
(:mod:`.serving` fills it). ``ClientFactory`` is the ``Client`` the stdlib's manager
code calls for its bookkeeping requests (create, incref, decref...): for a server of
this process it returns a :class:`_LoopbackConnection` that runs the request in the
calling thread, else a :class:`~.connections.ServerConnection`.
"""
from __future__ import annotations

import threading
import traceback
from typing import Any, Dict, Optional

from .connections import codec, open_connection

servers_lock = threading.Lock()
servers: Dict[Any, Any] = {}  # address -> server running in this process


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
    :class:`_LoopbackConnection`); proxies' own method calls always use a socket.
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
