"""Listening sockets and the set-up of every stream they accept, on the I/O loop.

Each accepted connection sends its nonce at once and waits for the connector's
hello. The hello names a *label*; the label's *route* says which key the connector
must prove and who takes the authenticated stream: the exact label, else the part
before its first ``:`` (``"pipe:ab12:1"`` is routed by ``"pipe"``). A connector that
fails its proof is refused and closed before anything it sent is read further; one
that proves the run's secret for a label with no route hears "not here". Nothing
is unpickled here, ever.

A process has one acceptor on its runtime's address; a manager or a
``connection.Listener`` bound to an address the user chose has its own, on the same
loop.

A caller on the loop's own thread cannot set up a stream to an acceptor of its own
process over the socket: the set-up needs this very loop, which is busy with the
caller. That caller is code the loop did not choose to run: a finalizer that the
garbage collector ran there (a torch ``DataLoader`` collected on the loop calls
``Event.set()``). :func:`open_here` makes that stream in memory instead, a socket
pair handed straight to the route, after the same check of the key.
"""
from __future__ import annotations

import functools
import hmac
import logging
import os
import socket
import weakref
from multiprocessing import AuthenticationError
from typing import Callable, Dict, Optional, Tuple, Union

from .._wire.auth import run_secret
from .._wire.sockets import listen
from .._wire.stream import NOT_HERE, OK, REFUSED, SETUP_TIMEOUT, Hello, NotHereError, Stream
from .reactor import Reactor

logger = logging.getLogger(__name__)

#: ``take(label, sock, send_key, recv_key, leftover) -> bool``: adopt an authenticated
#: stream (False: not here after all; the acceptor then closes it)
Taker = Callable[[str, socket.socket, bytes, bytes, bytes], bool]
Key = Union[bytes, Callable[[], bytes], None]

#: the acceptors of this process by address (see :func:`open_here`)
_serving: "weakref.WeakValueDictionary[tuple, Acceptor]" = weakref.WeakValueDictionary()


def open_here(address: tuple, label: str, key: Optional[bytes] = None) -> Optional[Stream]:
    """A stream for ``label`` to the acceptor of this process at ``address``, made in
    memory, when the caller is that acceptor's loop thread (module doc); None in every
    other case (the caller sets it up over the socket). Raises as ``open_stream``:
    ``AuthenticationError`` for a wrong key, :class:`NotHereError` for no such route."""
    acceptor = _serving.get(tuple(address))
    if acceptor is None or acceptor.closed or not acceptor.reactor.in_loop():
        return None
    return acceptor.connect_here(label, key)


class Acceptor:
    """Listens at ``(host, port)`` (any free port for 0) and routes streams by label."""

    def __init__(self, reactor: Reactor, host: str, port: int = 0) -> None:
        self.reactor = reactor
        self.sockets, self.address = listen(host, port)
        self._routes: Dict[str, Tuple[Taker, Key]] = {}
        self._hellos: Dict[int, Hello] = {}
        self.closed = False
        for sock in self.sockets:
            reactor.add_reader(sock.fileno(), functools.partial(self._accept, sock))
        _serving[tuple(self.address)] = self

    def route(self, label: str, take: Taker, key: Key = None) -> None:
        """Hand streams for ``label`` (or ``label:...``) to ``take``; connectors prove
        ``key`` (bytes, a callable returning them, or None for the run's secret)."""
        self._routes[label] = (take, key)

    def unroute(self, label: str) -> None:
        """Stop routing ``label``."""
        self._routes.pop(label, None)

    def _find(self, label: str) -> Optional[Tuple[Taker, Key]]:
        found = self._routes.get(label)
        if found is None and ":" in label:
            found = self._routes.get(label.split(":", 1)[0])
        return found

    # -- on the loop -------------------------------------------------------------------
    def connect_here(self, label: str, key: Optional[bytes] = None) -> Stream:
        """The in-memory set-up of :func:`open_here` (on the loop's thread)."""
        found = self._find(label)
        if found is None:
            raise NotHereError(f"no {label!r} at {self.address[0]}:{self.address[1]}")
        take, expected = found
        expected = expected() if callable(expected) else expected
        expected = run_secret() if expected is None else expected
        if not hmac.compare_digest(expected, run_secret() if key is None else key):
            raise AuthenticationError(f"{self.address[0]}:{self.address[1]} refused the key "
                                      f"for {label!r}")
        ours, theirs = socket.socketpair()
        to_taker, from_taker = os.urandom(32), os.urandom(32)
        if not take(label, theirs, from_taker, to_taker, b""):
            ours.close()
            theirs.close()
            raise NotHereError(f"no {label!r} at {self.address[0]}:{self.address[1]}")
        return Stream(ours, to_taker, from_taker)

    def _accept(self, listener: socket.socket) -> None:
        for _ in range(64):   # a burst, then let the loop serve others
            try:
                sock, _ = listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:  # e.g. out of descriptors: say so, keep serving
                if not self.closed:   # else closed from another thread (a job's exit) as
                    logger.warning("accept failed on %s:%s: %s", *self.address, exc)
                return                # the loop was about to accept: nothing to say
            try:
                hello = Hello(sock)
            except OSError:
                sock.close()
                continue
            fd = sock.fileno()
            self._hellos[fd] = hello
            self.reactor.add_reader(fd, functools.partial(self._on_hello, fd))
            self.reactor.call_later(SETUP_TIMEOUT, functools.partial(self._expire, fd, hello))

    def _on_hello(self, fd: int) -> None:
        hello = self._hellos.get(fd)
        if hello is None:
            return
        try:
            if not hello.feed():
                return
        except EOFError:
            self._drop(fd)
            return
        self._forget(fd)
        self._settle(hello)

    def _settle(self, hello: Hello) -> None:
        label = hello.label()
        found = self._find(label)
        take, key = found if found is not None else (None, None)
        if callable(key):
            key = key()
        verified = hello.verify(run_secret() if key is None else key)
        try:
            if verified is None:
                logger.warning("refused a connection to %.60r that failed authentication", label)
                hello.answer(REFUSED)
            elif take is None or not take(label, hello.sock, verified[0], verified[1],
                                          verified[3]):
                hello.answer(NOT_HERE)
            else:
                hello.answer(OK + verified[2])
                return
        except OSError:
            pass
        hello.sock.close()

    def _expire(self, fd: int, hello: Hello) -> None:
        if self._hellos.get(fd) is hello:
            logger.debug("dropped a connection that did not finish its set-up in time")
            self._drop(fd)

    def _forget(self, fd: int) -> None:
        self._hellos.pop(fd, None)
        self.reactor.remove(fd)

    def _drop(self, fd: int) -> None:
        hello = self._hellos.get(fd)
        self._forget(fd)
        if hello is not None:
            hello.sock.close()

    def close(self) -> None:
        """Stop listening, from any thread (streams already set up stay open; set-ups
        under way time out)."""
        if self.closed:
            return
        self.closed = True
        if _serving.get(tuple(self.address)) is self:
            del _serving[tuple(self.address)]
        for sock in self.sockets:
            self.reactor.remove(sock.fileno())
            sock.close()
