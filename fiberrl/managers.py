"""Managers: objects that live in a server job, used from anywhere through proxies.

``fiberrl.managers`` is CPython's ``multiprocessing.managers`` with three changes:

- the server is a fiberrl job (``BaseManager.start`` uses fiberrl's ``Process`` and
  ``Pipe``), so it runs on whatever backend is configured;
- it listens on TCP at an address other jobs can reach (the backend's listen host,
  or the machine's routable address when bound to a wildcard), not on a local
  Unix socket, so proxies work when passed to processes on other machines;
- connections are opened with a handshake deadline, TCP keepalive and the run's
  authkey (every fiberrl job inherits its parent's ``current_process().authkey``);
  a peer that cannot answer the HMAC challenge is dropped before anything it sent is
  unpickled, and a server that is gone surfaces as :class:`ManagerConnectionError`.

Arguments and results travel with cloudpickle (so lambdas and ``__main__`` objects
work), and the synchronization types of :class:`SyncManager` are the robust ones of
:mod:`fiberrl.robust`: a lock held by a process that dies is released.
"""
from __future__ import annotations

import logging
import os
import pickle
import select
import socket
import struct
import sys
import threading
import time
import traceback
import weakref
import xmlrpc.client
from multiprocessing import connection as mp_connection
from multiprocessing import managers as mp_managers
from multiprocessing import process as mp_process
from multiprocessing import util as mp_util
from typing import Any, Callable, Dict, Optional, Tuple

from . import reduction, transport
from .errors import ManagerConnectionError, ProcessError

logger = logging.getLogger(__name__)

Token = mp_managers.Token
RemoteError = mp_managers.RemoteError
State = mp_managers.State
Namespace = mp_managers.Namespace
dispatch = mp_managers.dispatch

#: seconds a new connection may take to connect and pass the authentication handshake
HANDSHAKE_TIMEOUT = 30.0

# -- connections -------------------------------------------------------------------------


def _xml_dumps(obj: Any) -> bytes:
    return xmlrpc.client.dumps((obj,), None, None, None, True).encode("utf-8")


def _xml_loads(data: bytes) -> Any:
    (obj,), _method = xmlrpc.client.loads(data.decode("utf-8"))
    return obj


#: serializer name -> (encode, decode); "pickle" is cloudpickle-compatible pickle
CODECS: Dict[str, Tuple[Callable[[Any], bytes], Callable[[bytes], Any]]] = {
    "pickle": (reduction.dumps_inband, pickle.loads),
    "xmlrpclib": (_xml_dumps, _xml_loads),
}


def _codec(serializer: str):
    try:
        return CODECS[serializer]
    except KeyError:
        raise ValueError(f"unknown serializer {serializer!r}; choose one of {sorted(CODECS)}") from None


def _set_keepalive(sock: socket.socket) -> None:
    """Probe an idle peer so a lost host ends blocked calls instead of hanging them."""
    if sock.family not in (socket.AF_INET, socket.AF_INET6):
        return
    from .config import get_config
    cfg = get_config()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    if hasattr(socket, "TCP_KEEPIDLE"):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, max(1, int(cfg.heartbeat_timeout)))
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL,
                        max(1, int(cfg.heartbeat_interval)))
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT, 3)


def _set_io_timeout(sock: socket.socket, seconds: float) -> None:
    """Kernel-level send/receive deadline (0 = none) for the fd that ``Connection`` reads."""
    whole = int(seconds)
    timeval = struct.pack("ll", whole, int((seconds - whole) * 1e6))
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, timeval)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, timeval)


#: what a client sends before it closes a connection on purpose (see ``ServerConnection.close``)
GOODBYE = ("#FIBERRL-GOODBYE",)


class ManagedConnection:
    """A stdlib ``Connection`` whose objects are encoded with a manager's serializer.

    On the server's side, ``said_goodbye`` records that the client closed the
    connection on purpose rather than dying.
    """

    def __init__(self, conn: mp_connection.Connection, serializer: str) -> None:
        self._conn = conn
        self._encode, self._decode = _codec(serializer)
        self.said_goodbye = False

    def send(self, obj: Any) -> None:
        """Send one object."""
        self._conn.send_bytes(self._encode(obj))

    def recv(self) -> Any:
        """Receive one object (only ever called after the peer authenticated).

        A goodbye ends the conversation as end of file does.
        """
        obj = self._decode(self._conn.recv_bytes())
        if obj == GOODBYE:
            self.said_goodbye = True
            raise EOFError("the client closed the connection")
        return obj

    def send_bytes(self, data: bytes) -> None:
        """Send raw bytes (the authentication handshake)."""
        self._conn.send_bytes(data)

    def recv_bytes(self, maxlength: Optional[int] = None) -> bytes:
        """Receive raw bytes (the authentication handshake)."""
        return self._conn.recv_bytes(maxlength)

    def poll(self, timeout: float = 0.0) -> bool:
        """Whether something (or end of file) can be read within ``timeout`` seconds."""
        return self._conn.poll(timeout)

    def fileno(self) -> int:
        """The socket's file descriptor."""
        return self._conn.fileno()

    @property
    def closed(self) -> bool:
        """Whether this end was closed."""
        return self._conn.closed

    def close(self) -> None:
        """Close this end."""
        self._conn.close()

    def peer_hung_up(self) -> bool:
        """True once the peer closed its end (its process died or it disconnected).

        Unlike ``poll`` this ignores requests the peer sent ahead, so a server
        thread busy on a long call can ask it without consuming anything.
        """
        if self._conn.closed:
            return True
        poller = select.poll()
        poller.register(self._conn.fileno(), select.POLLRDHUP)
        return any(events & (select.POLLRDHUP | select.POLLHUP | select.POLLERR)
                   for _fd, events in poller.poll(0))


class ServerConnection(ManagedConnection):
    """The client's end: transport failures become :class:`ManagerConnectionError`.

    A connection a server thread serves (``serving``) says goodbye when it is closed
    on purpose (by the proxies' bookkeeping, when this process exits normally, or
    when its thread ends), so the server keeps what this client holds, as the
    stdlib does. A client that dies says nothing, and the server releases it.
    """

    def __init__(self, conn: mp_connection.Connection, serializer: str, address: Any) -> None:
        super().__init__(conn, serializer)
        self.address = address
        self.serving = False

    def mark_serving(self) -> None:
        """Record that a server thread now serves this connection."""
        self.serving = True
        _serving_connections.add(self)
        _close_serving_connections_at_exit()

    def close(self) -> None:
        if self.serving and not self._conn.closed:
            self.serving = False
            try:
                self._conn.send_bytes(self._encode(GOODBYE))
            except (OSError, EOFError):
                pass
        self._conn.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass

    def _gone(self, exc: BaseException) -> ManagerConnectionError:
        return ManagerConnectionError(
            f"the manager server at {self.address!r} is gone ({type(exc).__name__}: {exc}); "
            "its job exited, was shut down, or its host is unreachable")

    def send(self, obj: Any) -> None:
        payload = self._encode(obj)  # encoding errors are the caller's, not the transport's
        try:
            self._conn.send_bytes(payload)
        except (OSError, EOFError) as exc:
            raise self._gone(exc) from exc

    def recv(self) -> Any:
        try:
            data = self._conn.recv_bytes()
        except (OSError, EOFError) as exc:
            raise self._gone(exc) from exc
        return self._decode(data)


_serving_connections: "weakref.WeakSet[ServerConnection]" = weakref.WeakSet()
_exit_hook_pid: Optional[int] = None


def _close_serving_connections_at_exit() -> None:
    """Once per process: when it exits normally, its connections say goodbye (before
    the stdlib's own exit finalizers, which run at priority 10)."""
    global _exit_hook_pid
    if _exit_hook_pid != os.getpid():
        _exit_hook_pid = os.getpid()
        mp_util.Finalize(None, _close_serving_connections, exitpriority=100)


def _close_serving_connections() -> None:
    for conn in list(_serving_connections):
        conn.close()


def local_name(address: Any) -> Optional[str]:
    """The abstract Unix socket a server at TCP ``address`` also listens on (Linux)."""
    if not (sys.platform.startswith("linux") and isinstance(address, tuple) and len(address) == 2):
        return None
    host, port = address
    return f"\0fiberrl-manager-{host}-{port}"


def open_connection(address: Any, authkey: Optional[bytes] = None, serializer: str = "pickle",
                    timeout: float = HANDSHAKE_TIMEOUT) -> ServerConnection:
    """Connect to a manager server and pass its mutual HMAC challenge with ``authkey``.

    Connecting and the handshake must finish within ``timeout`` seconds; afterwards
    calls may block as long as the remote method does, with TCP keepalive as the
    liveness check. Raises :class:`ManagerConnectionError` if the server cannot be
    reached and ``multiprocessing.AuthenticationError`` if the keys differ.
    """
    if authkey is None:
        authkey = mp_process.current_process().authkey
    if not isinstance(authkey, bytes):
        raise TypeError(f"authkey should be a byte string, not {type(authkey).__name__}")
    family = mp_connection.address_type(address)
    local = local_name(address) if family == "AF_INET" else None
    if local is not None:
        try:
            sock = socket.socket(socket.AF_UNIX)
            sock.settimeout(timeout)
            sock.connect(local)
        except OSError:
            sock.close()  # no such server in this network namespace: use TCP
        else:
            return _authenticate(sock, address, authkey, serializer, timeout)
    try:
        if family == "AF_INET":
            sock = socket.create_connection(tuple(address), timeout=timeout)
        else:
            sock = socket.socket(getattr(socket, family))
            sock.settimeout(timeout)
            sock.connect(address)
    except OSError as exc:
        raise ManagerConnectionError(f"cannot connect to the manager server at {address!r}: "
                                     f"{exc}") from exc
    return _authenticate(sock, address, authkey, serializer, timeout)


def _authenticate(sock: socket.socket, address: Any, authkey: bytes, serializer: str,
                  timeout: float) -> ServerConnection:
    """Pass the mutual HMAC challenge on a connected socket, within ``timeout``."""
    try:
        sock.settimeout(None)
        _set_keepalive(sock)
        _set_io_timeout(sock, timeout)
        raw = mp_connection.Connection(os.dup(sock.fileno()))
        try:
            mp_connection.answer_challenge(raw, authkey)
            mp_connection.deliver_challenge(raw, authkey)
        except (BlockingIOError, EOFError, ConnectionError) as exc:
            raw.close()
            raise ManagerConnectionError(
                f"the manager server at {address!r} did not complete the authentication "
                f"handshake within {timeout:.0f} s: {exc}") from exc
        except BaseException:
            raw.close()
            raise
        _set_io_timeout(sock, 0)
    finally:
        sock.close()
    return ServerConnection(raw, serializer, address)


class _LoopbackConnection:
    """A one-request "connection" to a server running in this process, served in the
    calling thread. The proxies' bookkeeping (incref, decref, create...) runs from
    garbage-collection finalizers in any thread, including one the server's own
    accept loop is waiting to start; a socket there could deadlock the process.
    """

    def __init__(self, server: "Server") -> None:
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
        _codec(serializer)
        self.serializer = serializer

    @classmethod
    def for_serializer(cls, serializer: str) -> "ClientFactory":
        """The shared factory of ``serializer``."""
        factory = cls._instances.get(serializer)
        if factory is None:
            factory = cls._instances[serializer] = cls(serializer)
        return factory

    def __call__(self, address: Any, authkey: Optional[bytes] = None) -> Any:
        with _servers_lock:
            server = _servers.get(address)
        if server is not None and not server.stop_event.is_set():
            return _LoopbackConnection(server)
        return open_connection(address, authkey, self.serializer)


# -- the server ----------------------------------------------------------------------------

_serving = threading.local()
_servers_lock = threading.Lock()
_servers: Dict[Any, "Server"] = {}  # address -> server running in this process
_departure_listeners: "list[Callable[[int], None]]" = []


def serving_connection() -> Optional[ManagedConnection]:
    """The client connection the calling server thread serves (None elsewhere)."""
    return getattr(_serving, "conn", None)


def caller_hung_up() -> bool:
    """True if the client the calling server thread serves has disconnected."""
    conn = serving_connection()
    return conn is not None and conn.peer_hung_up()


def on_client_departure(listener: Callable[[int], None]) -> None:
    """Call ``listener(thread_ident)`` whenever a server thread's client disconnects."""
    _departure_listeners.append(listener)


def local_referent(proxy: Any) -> Any:
    """The object behind ``proxy`` if its server runs in this process, else None."""
    token = getattr(proxy, "_token", None)
    if token is None:
        return None
    with _servers_lock:
        server = _servers.get(token.address)
    if server is None:
        return None
    entry = server.id_to_obj.get(token.id) or server.id_to_local_proxy_obj.get(token.id)
    return entry[0] if entry else None


def _listen_host() -> str:
    from .backends import default_backend
    from .config import get_config
    return get_config().listen_host or default_backend().listen_host()


class Server(mp_managers.Server):
    """The stdlib's manager server, listening where other jobs can reach it.

    ``address=None`` binds TCP on the backend's listen host. Each client connection
    is served by its own thread; when the client goes away (end of file or a failed
    keepalive) the departure listeners hear of it, which is how locks held by a dead
    process get released.
    """

    def __init__(self, registry: dict, address: Any, authkey: bytes, serializer: str) -> None:
        _codec(serializer)
        if address is None:
            address = (_listen_host(), 0)
        # the stdlib's plain Listener: it only frames bytes; our connections decode them
        super().__init__(registry, address, authkey, "pickle")
        self.serializer = serializer
        if isinstance(self.address, tuple) and self.address[0] in ("0.0.0.0", "", "::"):
            self.address = (transport.default_listen_host(), self.address[1])
        self.local_listener: Any = None
        self.stop_event = threading.Event()
        # re-entrant: a finalizer may drop a reference while this thread holds it
        self.mutex = threading.RLock()

    def _begin_serving(self) -> None:
        """Become reachable from this process without a socket and from this host
        through the abstract socket (only once serving: ``get_server()`` objects that
        are never served must not shadow a server at the same address)."""
        self.local_listener = self._listen_locally()
        with _servers_lock:
            _servers[self.address] = self

    def accepter(self) -> None:
        """Accept connections (TCP, and same-host ones) until the server stops."""
        if self.local_listener is not None:
            threading.Thread(target=self._accept_loop, args=(self.local_listener,), daemon=True,
                             name="fiberrl-manager-accept-local").start()
        self._accept_loop(self.listener)

    def _accept_loop(self, listener: Any) -> None:
        while not self.stop_event.is_set():
            try:
                raw = listener.accept()
            except OSError:
                if self.stop_event.wait(0.05):
                    return
                continue
            sock = socket.socket(fileno=os.dup(raw.fileno()))
            try:
                _set_keepalive(sock)
            finally:
                sock.close()
            conn = ManagedConnection(raw, self.serializer)
            threading.Thread(target=self.handle_request, args=(conn,), daemon=True,
                             name="fiberrl-manager-client").start()

    def _listen_locally(self) -> Any:
        """Also listen on an abstract Unix socket named after the TCP address: clients
        in the same network namespace (this host, this pod) use it, which is faster
        than TCP loopback; others cannot see it and use TCP."""
        name = local_name(self.address)
        if name is None:
            return None
        try:
            return mp_connection.Listener(address=name, family="AF_UNIX", backlog=128)
        except OSError as exc:
            logger.debug("no same-host listener for %r: %s", self.address, exc)
            return None

    def serve_client(self, conn: ManagedConnection) -> None:
        _serving.conn = conn
        try:
            super().serve_client(conn)
        finally:
            _serving.conn = None
            if conn.said_goodbye:
                return  # closed on purpose: what the client holds stays held
            ident = threading.get_ident()
            for listener in list(_departure_listeners):
                try:
                    listener(ident)
                except Exception:
                    logger.exception("releasing what a departed client held failed")

    def start_in_thread(self) -> None:
        """Serve from a daemon thread of this process (the coordination service)."""
        self._begin_serving()
        threading.Thread(target=self.accepter, daemon=True, name="fiberrl-coordination").start()

    def serve_forever(self) -> None:
        """Serve until a client asks for ``shutdown`` (then this process exits)."""
        self._begin_serving()
        try:
            super().serve_forever()
        finally:
            self.close()

    def close(self) -> None:
        """Stop accepting connections."""
        self.stop_event.set()
        with _servers_lock:
            if _servers.get(self.address) is self:
                del _servers[self.address]
        for listener in (self.listener, self.local_listener):
            try:
                if listener is not None:
                    listener.close()
            except OSError:
                pass


# -- proxies ---------------------------------------------------------------------------------

class _FiberrlProxy:
    """Mixed into the stdlib's proxy classes: fiberrl connections, fiberrl rebuilding."""

    @property
    def _Client(self):
        return ClientFactory.for_serializer(self._serializer)

    @_Client.setter
    def _Client(self, stdlib_client):
        """``BaseProxy.__init__`` assigns the stdlib's client; fiberrl's is used instead."""

    def _connect(self) -> None:
        """Open this thread's connection, served by a thread of its own in the server."""
        name = mp_process.current_process().name
        if threading.current_thread().name != "MainThread":
            name += "|" + threading.current_thread().name
        conn = open_connection(self._token.address, self._authkey, self._serializer)
        dispatch(conn, None, "accept_connection", (name,))
        conn.mark_serving()
        self._tls.connection = conn

    def __reduce__(self):
        reduced = super().__reduce__()
        if getattr(self, "_isauto", False):
            _rebuild, (_auto, token, serializer, kwds) = reduced
            return mp_managers.RebuildProxy, (AutoProxy, token, serializer, kwds)
        return reduced


def _fiberrl_proxy(stdlib_type: type, extra: Optional[dict] = None) -> type:
    """``stdlib_type`` with fiberrl's connections (a class importable from this module)."""
    name = stdlib_type.__name__
    cls = type(name, (_FiberrlProxy, stdlib_type), {"__module__": __name__, **(extra or {})})
    cls.__qualname__ = name
    return cls


def _iterate_all(self):
    return iter(self[:])


BaseProxy = _fiberrl_proxy(mp_managers.BaseProxy)
IteratorProxy = _fiberrl_proxy(mp_managers.IteratorProxy)
AcquirerProxy = _fiberrl_proxy(mp_managers.AcquirerProxy)
ConditionProxy = _fiberrl_proxy(mp_managers.ConditionProxy)
EventProxy = _fiberrl_proxy(mp_managers.EventProxy)
BarrierProxy = _fiberrl_proxy(mp_managers.BarrierProxy)
NamespaceProxy = _fiberrl_proxy(mp_managers.NamespaceProxy)
ValueProxy = _fiberrl_proxy(mp_managers.ValueProxy)
ListProxy = _fiberrl_proxy(mp_managers.ListProxy)
DictProxy = _fiberrl_proxy(mp_managers.DictProxy)
ArrayProxy = _fiberrl_proxy(mp_managers.ArrayProxy, {"__iter__": _iterate_all})
PoolProxy = _fiberrl_proxy(mp_managers.PoolProxy, {
    "_exposed_": mp_managers.PoolProxy._exposed_ + ("stats", "resize"),
    "stats": lambda self: self._callmethod("stats"),
    "resize": lambda self, processes: self._callmethod("resize", (processes,)),
})



class SemaphoreProxy(AcquirerProxy):
    """A semaphore's proxy, with ``get_value()`` as on ``multiprocessing.Semaphore``."""

    _exposed_ = AcquirerProxy._exposed_ + ("get_value",)

    def get_value(self) -> int:
        """The number of free permits."""
        return self._callmethod("get_value")


_STDLIB_TO_FIBERRL = {stdlib: ours for ours in (
    BaseProxy, IteratorProxy, AcquirerProxy, ConditionProxy, EventProxy, BarrierProxy,
    NamespaceProxy, ValueProxy, ListProxy, DictProxy, ArrayProxy, PoolProxy)
    for stdlib in ours.__mro__[2:3]}

_auto_types: Dict[tuple, type] = {}


def MakeProxyType(name: str, exposed: Any) -> type:
    """A proxy class forwarding each method named in ``exposed`` (fiberrl connections)."""
    key = (name, tuple(exposed))
    cls = _auto_types.get(key)
    if cls is None:
        stdlib_type = mp_managers.MakeProxyType(name, exposed)
        cls = type(name, (_FiberrlProxy, stdlib_type), {"__module__": __name__})
        _auto_types[key] = cls
    return cls


def AutoProxy(token: Token, serializer: str, manager: Any = None, authkey: Optional[bytes] = None,
              exposed: Any = None, incref: bool = True, manager_owned: bool = False):
    """A proxy whose methods are those the server exposes for ``token``'s object."""
    if authkey is None and manager is not None:
        authkey = manager._authkey
    if authkey is None:
        authkey = mp_process.current_process().authkey
    if exposed is None:
        conn = open_connection(token.address, authkey, serializer)
        try:
            exposed = dispatch(conn, None, "get_methods", (token,))
        finally:
            conn.close()
    proxy_type = MakeProxyType(f"AutoProxy[{token.typeid}]", exposed)
    proxy = proxy_type(token, serializer, manager=manager, authkey=authkey, incref=incref,
                       manager_owned=manager_owned)
    proxy._isauto = True
    return proxy


def _as_fiberrl_proxy_type(proxytype: Any) -> Any:
    if proxytype is None or proxytype is mp_managers.AutoProxy:
        return AutoProxy
    return _STDLIB_TO_FIBERRL.get(proxytype, proxytype)


# -- managers ----------------------------------------------------------------------------------

class BaseManager(mp_managers.BaseManager):
    """A manager whose server is a fiberrl job (see the module docstring).

    Same constructor as the stdlib's; ``ctx`` defaults to fiberrl's context and
    ``address=None`` means "TCP on the backend's listen host, any free port".
    """

    _Server = Server

    def __init__(self, address: Any = None, authkey: Optional[bytes] = None,
                 serializer: str = "pickle", ctx: Any = None, *,
                 shutdown_timeout: float = 1.0) -> None:
        _codec(serializer)
        if ctx is None:
            from .context import default_context
            ctx = default_context
        super().__init__(address, authkey, serializer, ctx, shutdown_timeout=shutdown_timeout)
        self._Client = ClientFactory.for_serializer(serializer)
        self._process = None

    @classmethod
    def register(cls, typeid: str, callable: Any = None, proxytype: Any = None,
                 exposed: Any = None, method_to_typeid: Optional[dict] = None,
                 create_method: bool = True) -> None:
        """Register ``typeid``; ``manager.<typeid>(...)`` then creates one on the server."""
        super().register(typeid, callable, _as_fiberrl_proxy_type(proxytype), exposed,
                         method_to_typeid, create_method)

    def _check_initial(self) -> None:
        if self._state.value == State.STARTED:
            raise ProcessError("Already started server")
        if self._state.value == State.SHUTDOWN:
            raise ProcessError("Manager has shut down")
        if self._state.value != State.INITIAL:
            raise ProcessError(f"Unknown state {self._state.value!r}")

    def get_server(self) -> Server:
        """A server object (with ``serve_forever()`` and ``address``) in this process."""
        self._check_initial()
        return self._Server(self._registry, self._address, self._authkey, self._serializer)

    def connect(self) -> None:
        """Connect this manager object to a server that is already running."""
        conn = self._Client(self._address, authkey=self._authkey)
        try:
            dispatch(conn, None, "dummy")
        finally:
            conn.close()
        self._state.value = State.STARTED

    def start(self, initializer: Optional[Callable[..., Any]] = None, initargs: tuple = ()) -> None:
        """Start the server as a fiberrl job and wait (with a liveness check) for its address."""
        self._check_initial()
        if initializer is not None and not callable(initializer):
            raise TypeError("initializer must be a callable")
        from .config import get_config
        reader, writer = self._ctx.Pipe(duplex=False)
        self._process = self._ctx.Process(
            target=type(self)._run_server,
            args=(self._registry, self._address, self._authkey, self._serializer, writer,
                  initializer, initargs))
        ident = ":".join(str(i) for i in self._process._identity)
        self._process.name = f"{type(self).__name__}-{ident}"
        self._process.start()
        writer.close()
        try:
            self._address = self._await_address(reader, get_config().start_timeout)
        finally:
            reader.close()
        self._state.value = State.STARTED
        self.shutdown = mp_util.Finalize(
            self, type(self)._finalize_manager,
            args=(self._process, self._address, self._authkey, self._state, self._Client,
                  self._shutdown_timeout),
            exitpriority=0)

    def _await_address(self, reader: Any, timeout: float) -> Any:
        deadline = time.monotonic() + timeout
        while not reader.poll(0.1):
            if not self._process.is_alive():
                self._process.join(1.0)
                raise ProcessError(
                    f"manager server {self._process.name} exited with code "
                    f"{self._process.exitcode} before serving; {self._process.exit_reason}")
            if time.monotonic() > deadline:
                self._process.kill()
                self._process.join(5.0)
                raise ProcessError(f"manager server {self._process.name} did not report its "
                                   f"address within {timeout:.0f} s (start_timeout)")
        try:
            return reader.recv()
        except EOFError:
            self._process.join(5.0)
            raise ProcessError(f"manager server {self._process.name} exited with code "
                               f"{self._process.exitcode} before serving") from None

    @property
    def address(self) -> Any:
        """The server's address, reachable from other jobs of the run."""
        return self._address


def _pool_factory(*args: Any, **kwargs: Any):
    from .pool import Pool
    return Pool(*args, **kwargs)


def _robust_types() -> dict:
    from . import robust
    return {"Lock": robust.Lock, "RLock": robust.RLock, "Semaphore": robust.Semaphore,
            "BoundedSemaphore": robust.BoundedSemaphore, "Condition": robust.Condition,
            "Event": robust.Event, "Barrier": robust.Barrier}


class SyncManager(BaseManager):
    """``multiprocessing.managers.SyncManager`` with a fiberrl server.

    ``dict``, ``list``, ``Namespace``, ``Value``, ``Array``, ``Queue``,
    ``JoinableQueue`` and ``Pool`` (a :class:`fiberrl.Pool`, whose workers are jobs
    too) as in the stdlib; ``Lock``, ``RLock``, ``Semaphore``, ``BoundedSemaphore``,
    ``Condition``, ``Event`` and ``Barrier`` are :mod:`fiberrl.robust` objects.
    """


def _register_sync_types() -> None:
    robust_types = _robust_types()
    for typeid, (factory, exposed, method_to_typeid, proxytype) in \
            mp_managers.SyncManager._registry.items():
        if typeid == "Pool":
            factory = _pool_factory
        factory = robust_types.get(typeid, factory)
        if typeid == "Pool":
            exposed = PoolProxy._exposed_
        if typeid in ("Semaphore", "BoundedSemaphore"):
            proxytype, exposed = SemaphoreProxy, SemaphoreProxy._exposed_
        SyncManager.register(typeid, factory, proxytype, exposed, method_to_typeid,
                             create_method=hasattr(mp_managers.SyncManager, typeid))


_register_sync_types()
