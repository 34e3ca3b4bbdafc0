"""The stdlib's pipe, signing every message as fiberrl does: a peer for the benchmarks.

fiberrl signs every message (:mod:`fiberrl._wire.auth`: a MAC of 16 bytes, the keyed
BLAKE2b of every message of its direction so far, from one running hash).
The stdlib's ``Connection`` authenticates a connection once, when it is made, and
then sends bare pickles. To tell what fiberrl's pipe costs from what signing every
message costs, :class:`SignedStdlib` is a stdlib context whose ``Pipe`` makes the
stdlib's own ends with that MAC added, computed the same way, and nothing else:

    lib = SignedStdlib("spawn")     # the stdlib's spawn context, every message signed
    a, b = lib.Pipe()
    lib.Process(target=echo, args=(b,)).start()

Everything but ``Pipe`` is the context's own (``Process``, ``Queue``, ``Array``...), so
gymnasium's ``AsyncVectorEnv`` runs on it. Ends travel to a spawned child as the
stdlib's do (a duplicated descriptor), with their keys. This module imports nothing
of fiberrl, so it can stand in for it (``bench/gate_control.py``). For measurement
only: the keys travel in a child's start-up data.
"""
import hashlib
import hmac
import multiprocessing
import os
import socket
from multiprocessing import connection, reduction
from typing import Any, Tuple

MAC_BYTES = 16     # as fiberrl._wire.auth
KEY_BYTES = 32


class MessageMac:
    """The MACs of one direction's messages, in order, made as fiberrl makes them."""

    __slots__ = ("_state",)

    def __init__(self, key: bytes) -> None:
        self._state = hashlib.blake2b(key=key, digest_size=MAC_BYTES)

    def next(self, data: Any) -> bytes:
        """The MAC of the next message, ``data``."""
        state = self._state
        state.update(data)
        return state.digest()


class SignedConnection(connection.Connection):
    """A stdlib ``Connection`` whose every message carries a MAC of its bytes."""

    def __init__(self, handle: int, send_key: bytes, recv_key: bytes, readable: bool = True,
                 writable: bool = True) -> None:
        super().__init__(handle, readable, writable)
        self.keys = (send_key, recv_key)
        self._signer, self._verifier = MessageMac(send_key), MessageMac(recv_key)

    def _send_bytes(self, buf: Any) -> None:
        data = bytes(buf)
        super()._send_bytes(data + self._signer.next(data))

    def _recv_bytes(self, maxsize: Any = None) -> Any:
        received = super()._recv_bytes(maxsize)
        view = received.getbuffer()
        size = len(view) - MAC_BYTES
        if size < 0 or not hmac.compare_digest(self._verifier.next(view[:size]), view[size:]):
            raise EOFError("a message failed authentication")
        del view
        received.truncate(size)
        return received


def _reduce(conn: SignedConnection) -> tuple:
    return _rebuild, (reduction.DupFd(conn.fileno()), conn.keys, conn.readable, conn.writable)


def _rebuild(dup_fd: Any, keys: Tuple[bytes, bytes], readable: bool,
             writable: bool) -> SignedConnection:
    return SignedConnection(dup_fd.detach(), *keys, readable=readable, writable=writable)


reduction.register(SignedConnection, _reduce)


class SignedStdlib:
    """A stdlib start method (``fork``, ``spawn``, ``forkserver``) whose ``Pipe`` signs
    every message; every other name is the context's own."""

    def __init__(self, method: str) -> None:
        self.context = multiprocessing.get_context(method)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.context, name)

    def Pipe(self, duplex: bool = True) -> Tuple[SignedConnection, SignedConnection]:
        """Two signed ends of a socket pair (duplex, as the stdlib's ``Pipe()`` on Unix)."""
        if not duplex:
            raise ValueError("SignedStdlib.Pipe makes duplex pipes only")
        first, second = socket.socketpair()
        keys = (os.urandom(KEY_BYTES), os.urandom(KEY_BYTES))
        return (SignedConnection(first.detach(), keys[0], keys[1]),
                SignedConnection(second.detach(), keys[1], keys[0]))
