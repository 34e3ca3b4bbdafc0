"""``Listener`` and ``Client``: the stdlib's authenticated sockets, always authenticated.

Choice: these *are* the stdlib's ``multiprocessing.connection`` classes, with one
change: ``authkey=None`` means the process's ``current_process().authkey`` (in fiberrl,
the run's secret, which every job and every stdlib child of the run holds), not "no
authentication". An empty key is refused. So no byte from a peer that did not pass
the HMAC challenge is ever unpickled, and two processes of a run meet without
passing a key around, as in Python 2's ``multiprocessing``.

Why not fiberrl's wire (``open_stream`` with ``key=authkey`` behind an acceptor):

* the stdlib's format is the *public* protocol of these names: a fiberrl ``Listener``
  accepts a plain-stdlib ``Client`` given the same ``authkey`` and the other way round;
  the wire's label-routed set-up would lock such peers out;
* the connections are the stdlib's ``Connection`` over one real socket, so
  ``send``/``recv``/``send_bytes``/``recv_bytes_into``/``poll``/``fileno`` behave
  exactly as documented, :func:`fiberrl.connection.wait` polls them as plain
  descriptors, and a fiberrl job on the same host receives one by descriptor passing
  (:mod:`fiberrl._services.fd_sharing`), like a stdlib child;
* families: ``'AF_INET'`` (TCP, across hosts: bind a reachable address such as
  ``('0.0.0.0', port)``) and ``'AF_UNIX'`` (a path or abstract name, one host).

Data flow::

    Client(address, authkey) --connect--> listener's thread "fiberrl-listener" accepts,
        a short-lived thread per peer runs the challenge both ways (20 s at most)
        --> queue of authenticated connections (or AuthenticationError) --> accept()
"""
from __future__ import annotations

import logging
import queue
import socket
import threading
import time
from multiprocessing import AuthenticationError
from multiprocessing import connection as _stdlib
from multiprocessing import process as _process
from typing import Any, Optional

logger = logging.getLogger(__name__)

__all__ = ["Listener", "Client", "answer_challenge", "deliver_challenge", "CHALLENGE",
           "families"]

answer_challenge = _stdlib.answer_challenge
deliver_challenge = _stdlib.deliver_challenge
#: the stdlib's challenge prefix (public up to Python 3.11, private since 3.12)
CHALLENGE = getattr(_stdlib, "CHALLENGE", getattr(_stdlib, "_CHALLENGE", b"#CHALLENGE#"))
families = _stdlib.families

#: seconds a peer has to complete the challenge
HANDSHAKE_TIMEOUT = 20.0


def _key(authkey: Optional[bytes]) -> bytes:
    """The key to prove: ``authkey``, or this process's authkey when None."""
    if authkey is None:
        return bytes(_process.current_process().authkey)
    if not isinstance(authkey, (bytes, bytearray)):
        raise TypeError("authkey should be a byte string")
    if not authkey:
        raise ValueError("an empty authkey would let any peer in (fiberrl always "
                         "authenticates; pass None for the run's secret)")
    return bytes(authkey)


class _Deadline:
    """A connection as the stdlib's challenge functions use it, whose reads give up
    after ``timeout`` seconds (a peer that never answers cannot hold a thread)."""

    def __init__(self, conn: _stdlib.Connection, timeout: float) -> None:
        self._conn, self._deadline = conn, time.monotonic() + timeout

    def send_bytes(self, data: bytes) -> None:
        self._conn.send_bytes(data)

    def recv_bytes(self, maxlength: Optional[int] = None) -> bytes:
        if not self._conn.poll(max(0.0, self._deadline - time.monotonic())):
            raise AuthenticationError("the peer did not complete the authentication in time")
        return self._conn.recv_bytes(maxlength)


def _authenticate(conn: _stdlib.Connection, key: bytes, server: bool) -> None:
    """The stdlib's two challenges, in its order (``AuthenticationError`` on failure)."""
    timed = _Deadline(conn, HANDSHAKE_TIMEOUT)
    if server:
        deliver_challenge(timed, key)
        answer_challenge(timed, key)
    else:
        answer_challenge(timed, key)
        deliver_challenge(timed, key)


class Listener(_stdlib.Listener):
    """A bound socket that accepts authenticated connections (``multiprocessing``'s
    ``Listener``; ``authkey=None`` is the run's secret). ``address`` (a ``(host, port)``
    tuple or a path), ``last_accepted``, ``accept()``, ``close()``, context manager.

    Connections are accepted and authenticated by a thread of the listener as they
    arrive, so a ``Client`` returns without waiting for ``accept()`` (as it does with
    the stdlib's unauthenticated listener; a thread may connect and then accept).
    ``accept()`` returns them in order, and raises ``AuthenticationError`` in place of
    a peer that failed the challenge.
    """

    def __init__(self, address: Any = None, family: Optional[str] = None, backlog: int = 1,
                 authkey: Optional[bytes] = None) -> None:
        key = _key(authkey)
        super().__init__(address, family, backlog, None)   # the challenge is ours
        self._key = key
        self._arrived: "queue.Queue[tuple]" = queue.Queue()
        self._accepted_from: Any = None
        self._thread = threading.Thread(target=self._accept_all, args=(self._listener,),
                                        name="fiberrl-listener", daemon=True)
        self._thread.start()

    def _accept_all(self, listener: Any) -> None:
        while True:
            try:
                conn = listener.accept()
            except OSError as exc:   # closed
                self._arrived.put((None, None, exc))
                return
            threading.Thread(target=self._admit, args=(conn, listener._last_accepted),
                             name="fiberrl-listener-auth", daemon=True).start()

    def _admit(self, conn: _stdlib.Connection, peer: Any) -> None:
        try:
            _authenticate(conn, self._key, server=True)
        except (AuthenticationError, OSError, EOFError) as exc:
            logger.warning("refused a connection from %s: %s", peer, exc)
            conn.close()
            self._arrived.put((None, peer, exc if isinstance(exc, AuthenticationError)
                               else AuthenticationError(f"{peer}: {exc}")))
            return
        self._arrived.put((conn, peer, None))

    def accept(self) -> _stdlib.Connection:
        """The next authenticated connection (waits for one)."""
        while True:
            if self._listener is None:
                raise OSError("listener is closed")
            try:
                conn, peer, error = self._arrived.get(timeout=0.5)
            except queue.Empty:
                continue
            if conn is None and peer is None:   # the accepting thread saw the close
                self._arrived.put((None, None, error))
                raise OSError("listener is closed") from error
            self._accepted_from = peer
            if error is not None:
                raise error
            return conn

    @property
    def last_accepted(self) -> Any:
        """The address of the peer of the last connection :meth:`accept` returned."""
        return self._accepted_from

    def close(self) -> None:
        """Stop listening (connections already accepted stay open)."""
        listener = self._listener
        if listener is not None:
            try:
                listener._socket.shutdown(socket.SHUT_RDWR)   # wakes the accepting thread
            except OSError:
                pass
        super().close()


def Client(address: Any, family: Optional[str] = None,  # noqa: N802 - the stdlib's name
           authkey: Optional[bytes] = None) -> _stdlib.Connection:
    """Connect to the :class:`Listener` at ``address`` and pass its challenge (and pose
    one); ``authkey=None`` is the run's secret. ``AuthenticationError`` if either side
    holds another key."""
    key = _key(authkey)
    conn = _stdlib.Client(address, family, None)
    try:
        _authenticate(conn, key, server=False)
    except BaseException:
        conn.close()
        raise
    return conn
