"""Manager servers and proxies on fiberrl's wire: the machinery under :mod:`fiberrl.managers`.

``Server`` is CPython's ``multiprocessing.managers.Server`` reached over fiberrl's wire
(:mod:`.connections`): a server started with ``address=None`` is reached through its
process's one listener, one bound to an address the user chose listens there, on the
same I/O loop; each client is served by a thread that reads its stream itself. When
a client goes away without saying goodbye, the departure listeners hear of it (that
is how :mod:`.robust` releases what a dead process held). ``BaseManager`` starts its
server as a fiberrl job; the proxies connect over the wire and rebuild as fiberrl
proxies wherever they are unpickled.
"""
from __future__ import annotations

import logging
import os
import threading
import time
import traceback
from multiprocessing import managers as mp_managers
from multiprocessing import process as mp_process
from multiprocessing import util as mp_util
from typing import Any, Callable, Dict, Optional

from .._runtime.acceptor import Acceptor
from .._runtime.runtime import reactor, runtime
from .._wire.sockets import default_listen_host
from .._wire.stream import Stream
from ..errors import ProcessError
from .connections import LABEL, ManagedConnection, codec, open_connection

logger = logging.getLogger(__name__)

#: where the proxy classes are public (and importable, for pickling by reference)
_PUBLIC = "fiberrl.managers"

Token = mp_managers.Token
RemoteError = mp_managers.RemoteError
State = mp_managers.State
Namespace = mp_managers.Namespace
dispatch = mp_managers.dispatch
# the stdlib's helpers that mean the same here (objects and functions of the server side)
Value = mp_managers.Value
Array = mp_managers.Array
ProcessLocalSet = mp_managers.ProcessLocalSet
RebuildProxy = mp_managers.RebuildProxy
all_methods = mp_managers.all_methods
public_methods = mp_managers.public_methods
convert_to_error = mp_managers.convert_to_error
rebuild_as_list = mp_managers.rebuild_as_list
reduce_array = mp_managers.reduce_array
HAS_SHMEM = mp_managers.HAS_SHMEM


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
    from ..backends import default_backend
    return default_backend().listen_host()  # honours the listen_host setting


_runtime_route_claimed = {"pid": None}


class _ManagerDoor:
    """Where one server is reached: its process's listener when the address is free to
    choose (the first such server of the process), else an acceptor of its own at the
    address asked for (or any free port), on the process's I/O loop."""

    def __init__(self, address: Any) -> None:
        self.own: Optional[Acceptor] = None
        self.shared = False
        if address is None and _runtime_route_claimed["pid"] != os.getpid():
            _runtime_route_claimed["pid"] = os.getpid()
            self.shared, rt = True, runtime()
            self.acceptor, self.address = rt.acceptor, rt.address
            return
        if address is None:
            address = (_listen_host(), 0)
        if not (isinstance(address, tuple) and len(address) == 2):
            raise ValueError(f"a fiberrl manager listens on (host, port) so that jobs on "
                             f"other hosts can reach it, not on {address!r}")
        self.own = self.acceptor = Acceptor(reactor(), address[0], int(address[1]))
        self.address = self.own.address

    def open(self, take: Any, key: bytes) -> None:
        """Start handing streams that prove ``key`` to ``take``."""
        self.acceptor.route(LABEL, take, key=key)

    def close(self) -> None:
        """Stop: new connections are refused; those being served go on."""
        self.acceptor.unroute(LABEL)
        if self.own is not None:
            self.own.close()
        elif self.shared:
            _runtime_route_claimed["pid"] = None


class Server(mp_managers.Server):
    """The stdlib's manager server, reached over fiberrl's wire.

    ``address=None`` uses the process's own listener (its backend's listen host).
    Each client connection is served by its own thread, which reads its stream
    itself; when the client goes away (end of file or a failed keepalive) the
    departure listeners hear of it, which is how locks held by a dead process get
    released.
    """

    def __init__(self, registry: dict, address: Any, authkey: bytes, serializer: str) -> None:
        codec(serializer)
        if not isinstance(authkey, bytes):
            raise TypeError(f"Authkey {authkey!r} is type {type(authkey)!s}, not bytes")
        self.registry = registry
        self.authkey = mp_process.AuthenticationString(authkey)
        self.serializer = serializer
        self.door = _ManagerDoor(address)
        self.listener = self.door   # the stdlib's name: closing it stops new connections
        self.address = self.door.address
        if self.address[0] in ("0.0.0.0", "", "::"):
            self.address = (default_listen_host(), self.address[1])
        self.id_to_obj = {"0": (None, ())}
        self.id_to_refcount: Dict[str, int] = {}
        self.id_to_local_proxy_obj: Dict[str, Any] = {}
        self.stop_event = threading.Event()
        # re-entrant: a finalizer may drop a reference while this thread holds it
        self.mutex = threading.RLock()
        # connections that arrive before serve_forever(), as a listen backlog would keep them
        self._early: Optional[list] = []
        self._early_lock = threading.Lock()
        self.door.open(self._take, bytes(self.authkey))

    def _begin_serving(self) -> None:
        """Serve: streams that came early first, then every new one; and be reachable
        from this process without a socket (only once serving: ``get_server()``
        objects that are never served must not shadow a server at the same address)."""
        with _servers_lock:
            _servers[self.address] = self
        with self._early_lock:
            early, self._early = self._early or [], None
        for conn in early:
            self._serve_on_thread(conn)

    def _take(self, label: str, sock: Any, send_key: bytes, recv_key: bytes,
              leftover: bytes) -> bool:
        """An authenticated stream from the listener (the I/O loop): serve it on a thread."""
        if self.stop_event.is_set():
            return False
        conn = ManagedConnection(Stream(sock, send_key, recv_key, leftover), self.serializer)
        with self._early_lock:
            if self._early is not None:
                self._early.append(conn)
                return True
        self._serve_on_thread(conn)
        return True

    def _serve_on_thread(self, conn: ManagedConnection) -> None:
        threading.Thread(target=self.handle_request, args=(conn,), daemon=True,
                         name="fiberrl-manager-client").start()

    def accepter(self) -> None:
        """Nothing to do: the process's I/O loop accepts connections."""

    def handle_request(self, conn: ManagedConnection) -> None:
        """Serve one new connection's first request (the stdlib's, without its second
        challenge: the stream's set-up already proved the key both ways)."""
        try:
            self._handle_request(conn)
        except SystemExit:
            pass   # serve_client() exits its thread at end of file
        finally:
            conn.close()

    def _handle_request(self, conn: ManagedConnection) -> None:
        try:
            request = conn.recv()
        except EOFError:   # it left, or sent something unsigned: say nothing back
            return
        try:
            _ignored, funcname, args, kwds = request
            if funcname not in self.public:
                raise ValueError(f"{funcname!r} unrecognized")
            func = getattr(self, funcname)
        except Exception:
            msg = ("#TRACEBACK", traceback.format_exc())
        else:
            try:
                msg = ("#RETURN", func(conn, *args, **kwds))
            except Exception:
                msg = ("#TRACEBACK", traceback.format_exc())
        try:
            conn.send(msg)
        except Exception:
            try:
                conn.send(("#TRACEBACK", traceback.format_exc()))
            except Exception:
                logger.debug("could not answer request %r", request, exc_info=True)

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
        """Serve from this process's I/O loop and client threads (the coordination
        service)."""
        self._begin_serving()

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
        self.door.close()


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
        conn.in_turn = True
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
    cls = type(name, (_FiberrlProxy, stdlib_type), {"__module__": _PUBLIC, **(extra or {})})
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
BaseListProxy = _fiberrl_proxy(mp_managers.BaseListProxy)
BasePoolProxy = _fiberrl_proxy(mp_managers.BasePoolProxy)
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
        cls = type(name, (_FiberrlProxy, stdlib_type), {"__module__": _PUBLIC})
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
    proxytype = _STDLIB_TO_FIBERRL.get(proxytype, proxytype)
    if (isinstance(proxytype, type) and issubclass(proxytype, mp_managers.BaseProxy)
            and not issubclass(proxytype, _FiberrlProxy)):
        _adopt_proxy_class(proxytype)
    return proxytype


def _adopt_proxy_class(cls: type) -> None:
    """Make a user's subclass of the stdlib's ``BaseProxy``, registered with a fiberrl
    manager, connect over fiberrl's wire (its servers speak no other protocol).

    The class is changed in place (a new class would not be importable where its
    proxies are unpickled); proxies of it then reach fiberrl managers only.
    """
    cls._Client = _FiberrlProxy.__dict__["_Client"]
    cls._connect = _FiberrlProxy.__dict__["_connect"]


# -- managers ----------------------------------------------------------------------------------

class _JobContext:
    """What a manager needs of a context to start its server: fiberrl's ``Process``
    and ``Pipe`` (the default when no ``ctx`` is given)."""

    @staticmethod
    def Process(*args: Any, **kwargs: Any) -> Any:
        """A fiberrl process (a job)."""
        from ..process import Process
        return Process(*args, **kwargs)

    @staticmethod
    def Pipe(duplex: bool = True) -> Any:
        """A fiberrl pipe."""
        from ..connection import Pipe
        return Pipe(duplex)


class BaseManager(mp_managers.BaseManager):
    """A manager whose server is a fiberrl job (see the module docstring).

    Same constructor as the stdlib's; ``ctx`` defaults to fiberrl's context and
    ``address=None`` means "TCP on the backend's listen host, any free port".
    """

    _Server = Server

    def __init__(self, address: Any = None, authkey: Optional[bytes] = None,
                 serializer: str = "pickle", ctx: Any = None, *,
                 shutdown_timeout: float = 1.0) -> None:
        codec(serializer)
        if ctx is None:
            ctx = _JobContext
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
        from ..config import get_config
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
