"""The connections of fiberrl's managers, on the one wire.

A proxy's connection to a manager server is an authenticated stream of
:mod:`fiberrl._wire` labelled ``"manager"``: both sides prove the manager's authkey
when it is set up (within :data:`HANDSHAKE_TIMEOUT`), and every message after that
carries a MAC, so nothing from a peer without the key is ever unpickled, before or
after the handshake. Objects are encoded with the manager's serializer (pickle or
xmlrpclib), one object per message. A server in this network namespace (this host,
this pod) is reached over a Unix socket, others over TCP with keepalive tuned to the
heartbeat settings. Transport failures become :class:`ManagerConnectionError`.

A connection a server thread serves says goodbye when it is closed on purpose, so the
server can tell a client that left from one that died.
"""
from __future__ import annotations

import os
import pickle
import weakref
import xmlrpc.client
from multiprocessing import process as mp_process
from multiprocessing import util as mp_util
from typing import Any, Callable, Dict, Optional, Tuple

from .. import reduction
from .._runtime.acceptor import open_here
from .._wire.spin import spin_budget
from .._wire.stream import NotHereError, Stream, open_stream
from ..errors import ManagerConnectionError

LABEL = "manager"   #: the label of a manager's streams on its listener
_KIND = b"m"

#: seconds a new connection may take to connect and pass the authentication handshake
HANDSHAKE_TIMEOUT = 30.0

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


def codec(serializer: str) -> Tuple[Callable[[Any], bytes], Callable[[bytes], Any]]:
    """The (encode, decode) pair of ``serializer``; ValueError for an unknown one."""
    try:
        return CODECS[serializer]
    except KeyError:
        raise ValueError(f"unknown serializer {serializer!r}; choose one of {sorted(CODECS)}") from None


#: what a client sends before it closes a connection on purpose (see ``ServerConnection.close``)
GOODBYE = ("#FIBERRL-GOODBYE",)


class ManagedConnection:
    """One authenticated stream carrying a manager's objects, one per signed message.

    On the server's side, ``said_goodbye`` records that the client closed the
    connection on purpose rather than dying.
    """

    def __init__(self, stream: Stream, serializer: str) -> None:
        self.stream = stream
        stream.spin = spin_budget()   # a request's reply, or a client's next call, comes soon
        self._encode, self._decode = codec(serializer)
        self.said_goodbye = False

    def send(self, obj: Any) -> None:
        """Send one object."""
        self.stream.send(_KIND, [self._encode(obj)])

    def recv(self) -> Any:
        """Receive one object (its MAC checked before it is decoded).

        A goodbye ends the conversation as end of file does.
        """
        _kind, frames = self.stream.recv()
        obj = self._decode(frames[0])
        if obj == GOODBYE:
            self.said_goodbye = True
            raise EOFError("the client closed the connection")
        return obj

    def poll(self, timeout: Optional[float] = 0.0) -> bool:
        """Whether something (or end of file) can be read within ``timeout`` seconds."""
        return self.stream.poll(timeout)

    def fileno(self) -> int:
        """The socket's file descriptor."""
        return self.stream.fileno()

    @property
    def closed(self) -> bool:
        """Whether this end was closed."""
        return self.stream.closed

    def close(self) -> None:
        """Close this end."""
        self.stream.close()

    def peer_hung_up(self) -> bool:
        """True once the peer closed its end (its process died or it disconnected).

        Unlike ``poll`` this ignores requests the peer sent ahead, so a server
        thread busy on a long call can ask it without consuming anything.
        """
        return self.stream.peer_hung_up()


class ServerConnection(ManagedConnection):
    """The client's end: transport failures become :class:`ManagerConnectionError`.

    A connection a server thread serves (``serving``) says goodbye when it is closed
    on purpose (by the proxies' bookkeeping, when this process exits normally, or
    when its thread ends), so the server keeps what this client holds, as the
    stdlib does. A client that dies says nothing, and the server releases it.
    """

    def __init__(self, stream: Stream, serializer: str, address: Any) -> None:
        super().__init__(stream, serializer)
        self.address = address
        self.serving = False
        #: one request, one reply, in turn (a proxy's connection; not a pipelining
        #: async channel): replies owed to callers that stopped waiting are dropped
        self.in_turn = False
        self._owed = 0

    def mark_serving(self) -> None:
        """Record that a server thread now serves this connection."""
        self.serving = True
        _serving_connections.add(self)
        _close_serving_connections_at_exit()

    def close(self) -> None:
        """Close the connection (saying goodbye first if a server thread serves it)."""
        if self.serving and not self.stream.closed:
            self.serving = False
            try:
                super().send(GOODBYE)
            except (OSError, EOFError):
                pass
        self.stream.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass

    def _gone(self, exc: BaseException) -> ManagerConnectionError:
        return _server_gone(self.address, exc)

    def send(self, obj: Any) -> None:
        """Send one request; :class:`ManagerConnectionError` if the server is gone.

        On an ``in_turn`` connection, replies still owed to earlier requests (a caller
        interrupted while it waited, e.g. by ``KeyboardInterrupt`` from a signal
        handler) are read and dropped first, so that this caller gets its own reply."""
        payload = self._encode(obj)  # encoding errors are the caller's, not the wire's
        try:
            while self.in_turn and self._owed > 0:
                self.stream.recv()
                self._owed -= 1
            self.stream.send(_KIND, [payload])
        except (OSError, EOFError) as exc:
            raise self._gone(exc) from exc
        self._owed += 1

    def recv(self) -> Any:
        """Receive one reply; :class:`ManagerConnectionError` if the server is gone."""
        try:
            _kind, frames = self.stream.recv()
        except (OSError, EOFError) as exc:
            raise self._gone(exc) from exc
        self._owed = max(0, self._owed - 1)
        return self._decode(frames[0])

    def call(self, request: Any) -> Any:
        """``send(request)`` then ``recv()`` on an ``in_turn`` connection, in one step
        (a proxy's method call: the path every call takes, so no layer more than needed).
        """
        payload = self._encode(request)
        stream = self.stream
        try:
            while self._owed > 0:   # replies owed to interrupted callers (see ``send``)
                stream.recv()
                self._owed -= 1
            stream.send(_KIND, [payload])
            self._owed = 1
            frames = stream.recv()[1]
        except (OSError, EOFError) as exc:
            raise self._gone(exc) from exc
        self._owed = 0
        return self._decode(frames[0])


def _server_gone(address: Any, exc: BaseException, during: str = "") -> ManagerConnectionError:
    """The error for a server at ``address`` that hung up (``exc``), ``during`` something."""
    detail = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    return ManagerConnectionError(
        f"the manager server at {address!r} is gone{during} ({detail}); "
        "its job exited, was shut down, or its host is unreachable")


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


def open_connection(address: Any, authkey: Optional[bytes] = None, serializer: str = "pickle",
                    timeout: float = HANDSHAKE_TIMEOUT) -> ServerConnection:
    """Connect to a manager server and prove ``authkey`` (the server proves it too).

    Connecting and the set-up must finish within ``timeout`` seconds; afterwards
    calls may block as long as the remote method does, with TCP keepalive as the
    liveness check. Raises :class:`ManagerConnectionError` if the server cannot be
    reached and ``multiprocessing.AuthenticationError`` if the keys differ.
    """
    if authkey is None:
        authkey = mp_process.current_process().authkey
    if not isinstance(authkey, bytes):
        raise TypeError(f"authkey should be a byte string, not {type(authkey).__name__}")
    if not (isinstance(address, tuple) and len(address) == 2):
        raise ValueError(f"a fiberrl manager's address is (host, port), not {address!r}")
    try:
        stream = (open_here(address, LABEL, key=bytes(authkey))   # a finalizer on the loop
                  or open_stream(address, LABEL, key=bytes(authkey), timeout=timeout))
    except NotHereError as exc:
        raise ManagerConnectionError(f"no manager server at {address!r}: {exc}") from exc
    except TimeoutError as exc:
        raise ManagerConnectionError(
            f"the manager server at {address!r} did not complete the authentication "
            f"handshake within {timeout:.0f} s (unresponsive or unreachable)") from exc
    except ConnectionRefusedError as exc:
        raise ManagerConnectionError(f"cannot connect to the manager server at {address!r}: "
                                     f"{exc}") from exc
    except (ConnectionError, EOFError) as exc:
        # It hung up before authenticating us: a server that dies leaves a connection
        # it had not yet accepted (or had just accepted) reset or at end of file.
        raise _server_gone(address, exc, ": it hung up during the authentication "
                                         "handshake") from exc
    except OSError as exc:
        raise ManagerConnectionError(f"cannot connect to the manager server at {address!r}: "
                                     f"{exc}") from exc
    return ServerConnection(stream, serializer, address)
