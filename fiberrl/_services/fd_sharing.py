"""File descriptors lent to processes on the same host: how a stdlib ``Connection``
travels to a fiberrl job.

fiberrl pickles a process with cloudpickle, which does not consult the stdlib's
``ForkingPickler`` reducers, so a stdlib ``Connection`` would arrive as a bare
descriptor number that means nothing in the job. Instead its reducer (in
:mod:`fiberrl.reduction`, for stdlib connections and sockets) :func:`lend` s a
duplicate of its descriptor under a one-time ticket, and the job :func:`borrow` s it
when it unpickles the object.

Data flow::

    pickling (this process): dup(fd) --> FdLender, under a ticket (and the job's token)
    unpickling (the job): open_stream(owner, "fds:<ticket>") over the owner's Unix socket
        owner's acceptor checks the proof --> FdLender: b"F" + the descriptor (SCM_RIGHTS)
                                                   or b"E" + why not (a TCP stream: the
                                                   job is on another host)

The stream is set up with the run's secret like every other; the answer is read as one
byte and ancillary data (or text), never unpickled. A ticket is taken once. Tickets
lent while pickling a process for a job are closed when that job ends; others (an
object put on a queue) live until taken or until this process exits, as with the
stdlib's ``resource_sharer``. Sending to a job of a backend that does not share this
host raises at once, when the process is pickled, except for a stdlib ``Connection``, which
is relayed there instead (:mod:`fiberrl._services.connection_relay`).
"""
from __future__ import annotations

import logging
import os
import socket
from typing import Optional, Tuple

from .._runtime.runtime import Runtime, service
from .._wire.sockets import Address, wait_for
from .._wire.stream import open_stream
from .tickets import Tickets

logger = logging.getLogger(__name__)

__all__ = ["lend", "borrow", "FdLender"]

_TIMEOUT = 10.0


class FdLender:
    """Service "fd-lender": duplicates of descriptors waiting for their borrower."""

    def __init__(self, rt: Runtime) -> None:
        self.runtime = rt
        self._lent: Tickets[int] = Tickets(os.close)
        rt.acceptor.route("fds", self._take)

    def lend(self, fd: int, token: Optional[str]) -> str:
        """Keep a duplicate of ``fd`` for one borrower; returns its ticket."""
        return self._lent.keep(os.dup(fd), token)

    def _take(self, label: str, sock: socket.socket, send_key: bytes, recv_key: bytes,
              leftover: bytes) -> bool:
        """On the loop: an authenticated borrower for ``fds:<ticket>``."""
        fd = self._lent.take(label.partition(":")[2])
        if fd is None:
            return False   # unknown or already taken: "not here"
        # the set-up's answer is written after this returns: answer the borrower then
        self.runtime.reactor.call_soon(lambda: _hand_over(sock, fd))
        return True


def _hand_over(sock: socket.socket, fd: int) -> None:
    try:
        sock.setblocking(True)
        sock.settimeout(_TIMEOUT)
        if sock.family == socket.AF_UNIX:
            socket.send_fds(sock, [b"F"], [fd])
        else:
            sock.sendall(b"E" + f"the job reached {socket.gethostname()} over TCP, not the "
                         "Unix socket of this host: it runs on another host (or network "
                         "namespace), where this file descriptor does not exist".encode())
    except OSError as exc:
        logger.warning("could not hand a file descriptor over: %s", exc)
    finally:
        os.close(fd)
        sock.close()


def borrow(address: Address, ticket: str) -> int:
    """The descriptor lent under ``ticket`` by the process at ``address`` (a new
    descriptor of this process). ``OSError`` saying why when it cannot come."""
    stream = open_stream(tuple(address), f"fds:{ticket}", timeout=_TIMEOUT)
    try:
        if not wait_for(stream.fileno(), timeout=_TIMEOUT):
            raise TimeoutError(f"{address[0]}:{address[1]} did not hand the descriptor over "
                               f"within {_TIMEOUT:.0f} s")
        if stream.sock.family != socket.AF_UNIX:
            answer = stream.sock.recv(4096)
            raise OSError(f"cannot receive a file descriptor from {address[0]}:{address[1]}: "
                          f"{answer[1:].decode(errors='replace') or 'it is on another host'}")
        data, fds, _, _ = socket.recv_fds(stream.sock, 1, 1)
        if data != b"F" or len(fds) != 1:
            for fd in fds:
                os.close(fd)
            raise OSError(f"{address[0]}:{address[1]} did not hand a file descriptor over")
        return fds[0]
    finally:
        stream.close()


def lender() -> FdLender:
    """This process's lender (the runtime starts if needed)."""
    return service("fd-lender", FdLender)


def receiver() -> Tuple[Optional[str], bool]:
    """``(token, shares this host)`` of the job whose process is being pickled (no token,
    and True, when the object is pickled for anything else, such as a queue)."""
    from .._runtime.jobenv import shipping_token
    token = shipping_token()
    if token is None:
        return None, True
    from ..backends import default_backend
    return token, default_backend().shares_host


def _check_same_host(what: str) -> Optional[str]:
    """The token of the job being pickled for; ``TypeError`` when that job's backend
    does not share this host."""
    token, same_host = receiver()
    if not same_host:
        from ..backends import default_backend
        raise TypeError(
            f"cannot send {what} to a job of the {default_backend().name!r} backend: it is a "
            "file descriptor of this host and the job may run on another one; use "
            "fiberrl.Pipe() or fiberrl.Queue(), which work across hosts")
    return token


def lend(fd: int, what: str) -> Tuple[Address, str]:
    """Lend ``fd`` (the descriptor of ``what``, being pickled) to whoever unpickles it:
    ``(this process's address, ticket)`` for :func:`borrow`. ``TypeError`` when it is
    being pickled for a job of a backend that does not share this host."""
    token = _check_same_host(what)
    own = lender()
    return own.runtime.address, own.lend(fd, token)
