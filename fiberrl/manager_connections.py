"""The connections of fiberrl's managers: encoding, authentication, liveness.

A client connection (:func:`open_connection`) reaches a server over TCP, or over an
abstract Unix socket named after the TCP address when both are in one network
namespace; it passes the stdlib's mutual HMAC challenge before anything is
unpickled, has a deadline for connecting and the handshake, and uses TCP keepalive
afterwards. Transport failures become :class:`ManagerConnectionError`. A connection
a server thread serves says goodbye when it is closed on purpose, so the server can
tell a client that left from one that died.
"""
from __future__ import annotations

import os
import pickle
import select
import socket
import struct
import sys
import weakref
import xmlrpc.client
from multiprocessing import connection as mp_connection
from multiprocessing import process as mp_process
from multiprocessing import util as mp_util
from typing import Any, Callable, Dict, Optional, Tuple

from . import reduction
from .errors import ManagerConnectionError

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


def set_keepalive(sock: socket.socket) -> None:
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
        self._encode, self._decode = codec(serializer)
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
        return _server_gone(self.address, exc)

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
        set_keepalive(sock)
        _set_io_timeout(sock, timeout)
        raw = mp_connection.Connection(os.dup(sock.fileno()))
        try:
            mp_connection.answer_challenge(raw, authkey)
            mp_connection.deliver_challenge(raw, authkey)
        except BlockingIOError as exc:  # SO_RCVTIMEO/SO_SNDTIMEO ran out: alive but silent
            raw.close()
            raise ManagerConnectionError(
                f"the manager server at {address!r} did not complete the authentication "
                f"handshake within {timeout:.0f} s (unresponsive or unreachable): {exc}") from exc
        except (EOFError, OSError) as exc:
            # It hung up before authenticating us: a server that dies leaves a connection
            # it had not yet accepted (or had just accepted) reset or at end of file.
            raw.close()
            raise _server_gone(address, exc, ": it hung up during the authentication "
                                             "handshake") from exc
        except BaseException:
            raw.close()
            raise
        _set_io_timeout(sock, 0)
    finally:
        sock.close()
    return ServerConnection(raw, serializer, address)
