"""Manager servers on fiberrl's wire and ``BaseManager``: the machinery under
:mod:`fiberrl.managers` (whose names this module gathers, the proxies of :mod:`.proxies`
and the in-process client of :mod:`.loopback` among them).

``Server`` is CPython's ``multiprocessing.managers.Server`` reached over fiberrl's wire
(:mod:`.connections`): a server started with ``address=None`` is reached through its
process's one listener, one bound to an address the user chose listens there, on the
same I/O loop; each client is served by a thread that reads its stream itself. When
a client goes away without saying goodbye, the departure listeners hear of it (that
is how :mod:`.robust` releases what a dead process held). ``BaseManager`` starts its
server as a fiberrl job; the proxies (:mod:`.proxies`) connect over the wire and
rebuild as fiberrl proxies wherever they are unpickled.
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
from .connections import LABEL, ManagedConnection, codec
from .loopback import ClientFactory, serving_thread as _serving
from .loopback import servers as _servers, servers_lock as _servers_lock
# the proxies, gathered here for fiberrl.managers and the modules of this package
from .proxies import (AcquirerProxy, ArrayProxy, AutoProxy, BarrierProxy, BaseListProxy,
                      BasePoolProxy, BaseProxy, ConditionProxy, DictProxy, EventProxy,
                      IteratorProxy, ListProxy, MakeProxyType, NamespaceProxy, PoolProxy,
                      SemaphoreProxy, ValueProxy, as_fiberrl_proxy_type,
                      refuse_if_server_ended)

logger = logging.getLogger(__name__)

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


# -- the server ----------------------------------------------------------------------------

_departure_listeners: "list[Callable[[int], None]]" = []


def serving_connection() -> Optional[ManagedConnection]:
    """The client connection the calling server thread serves (None elsewhere)."""
    return _serving.conn


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

    #: whether this process's threads may call objects that allow it (their
    #: ``direct_calls``) without a connection (see :func:`.loopback.direct_referent`)
    direct_calls = False

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
                result = func(conn, *args, **kwds)
            except Exception:
                msg = ("#TRACEBACK", traceback.format_exc())
            else:
                if funcname == "accept_connection":
                    # it answered, then served the connection until it ended: a reply
                    # now would reach a client that left (or the next call's caller)
                    return
                msg = ("#RETURN", result)
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
            super().serve_client(conn)   # ends its thread with SystemExit at end of file
        finally:
            _serving.conn = None
            if not conn.said_goodbye:   # a client that closed on purpose keeps what it holds
                self._client_departed()

    @staticmethod
    def _client_departed() -> None:
        """Release what the client served by this thread held (it died or hung up)."""
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
        super().register(typeid, callable, as_fiberrl_proxy_type(proxytype), exposed,
                         method_to_typeid, create_method)

    def _check_initial(self) -> None:
        if self._state.value == State.STARTED:
            raise ProcessError("Already started server")
        if self._state.value == State.SHUTDOWN:
            raise ProcessError("Manager has shut down")
        if self._state.value != State.INITIAL:
            raise ProcessError(f"Unknown state {self._state.value!r}")

    def _create(self, typeid: str, /, *args: Any, **kwds: Any) -> Any:
        """Create a ``typeid`` object on the server (the stdlib's), refused at once if
        the server's job is known to have ended."""
        refuse_if_server_ended(self, self._address)
        return super()._create(typeid, *args, **kwds)

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
        except EOFError as exc:
            self._process.join(5.0)
            if self._process.is_alive():
                # it closed its end without an address: a server nobody can reach, which
                # the stdlib's exit hook would wait for for ever
                self._process.kill()
                self._process.join(5.0)
                raise ProcessError(f"manager server {self._process.name} closed its pipe "
                                   f"without reporting its address ({exc}); it was "
                                   f"killed") from None
            raise ProcessError(f"manager server {self._process.name} exited with code "
                               f"{self._process.exitcode} before serving") from None

    @property
    def address(self) -> Any:
        """The server's address, reachable from other jobs of the run."""
        return self._address
