"""The run's secret and what is derived from it: connect proofs and per-message MACs.

One secret per run. A root process's secret *is* its ``current_process().authkey``
(32 random bytes the stdlib makes at start-up); a job receives it in its
environment (never its command line) and makes it its own authkey, and a stdlib
child of any of them inherits it as its authkey. So every process of a run, fiberrl's
or the stdlib's, holds the same key without a second secret travelling anywhere.
A service may use another key (a manager started with its own ``authkey``).

Connection set-up (the connector proves it holds the key; so does the acceptor)::

    acceptor  -> connector : nonce_a (16 bytes)
    connector -> acceptor  : nonce_c (16) + len (1) + label + proof_c (32)
    acceptor  -> connector : OK (1) + proof_a (32)  |  REFUSED (1)  |  NOT_HERE (1)

with ``proof_c = HMAC-SHA256(key, "fiberrl-connect" + nonce_a + nonce_c + label)`` and
``proof_a`` the same over "fiberrl-accept". Each direction then has its own key
(``HMAC(key, "fiberrl-c2a"...)`` and "fiberrl-a2c"), so a message cannot be reflected
back to its sender or replayed on another connection, and every message carries a
16-byte MAC: the keyed BLAKE2b of every message of its direction so far, this one
last (of each, the header and the first frame).

Why chained: a MAC of the whole stream so far signs each message's place in it, so
no message can be dropped, replayed or reordered unnoticed, without a counter; and
one running hash per direction is updated and read (``update``, ``digest``), where a
MAC per message copies a keyed state first, which costs the hot pipe about a third
more per MAC on a busy machine (see docs/benchmarks.md, "Stop 49"). The signed bytes
of a message are self-delimiting (its header gives the first frame's length), so the
stream they make up is read one way only.
"""
from __future__ import annotations

import hashlib
import hmac
import os
import threading
from typing import Any, Optional, Tuple

from ..errors import ConfigError, ForgedMessageError

SECRET_ENV = "FIBERRL_SECRET"
NONCE_BYTES = 16
PROOF_BYTES = 32
MAC_BYTES = 16

_lock = threading.Lock()
_secret: Optional[bytes] = None
_secret_pid: Optional[int] = None


def run_secret() -> bytes:
    """The run's secret: from the environment in a job, else this process's authkey."""
    global _secret, _secret_pid
    with _lock:
        if _secret is None or _secret_pid != os.getpid():
            inherited = os.environ.get(SECRET_ENV)
            if inherited:
                try:
                    _secret = bytes.fromhex(inherited)
                except ValueError:
                    raise ConfigError(f"{SECRET_ENV} holds no secret fiberrl handed to a job "
                                      "(hex digits expected); unset it") from None
            elif _secret is None:  # a fork keeps its parent's secret
                from multiprocessing import process
                _secret = bytes(process.current_process().authkey)
            _secret_pid = os.getpid()
        return _secret


def secret_env() -> dict:
    """Environment entries that hand the run's secret to a job."""
    return {SECRET_ENV: run_secret().hex()}


def proofs(key: bytes, nonce_a: bytes, nonce_c: bytes, label: bytes) -> Tuple[bytes, bytes]:
    """``(connector's proof, acceptor's proof)`` for one connection set-up."""
    tail = nonce_a + nonce_c + label
    return (hmac.digest(key, b"fiberrl-connect" + tail, "sha256"),
            hmac.digest(key, b"fiberrl-accept" + tail, "sha256"))


def session_keys(key: bytes, nonce_a: bytes, nonce_c: bytes, label: bytes) -> Tuple[bytes, bytes]:
    """``(connector-to-acceptor key, acceptor-to-connector key)`` of one connection."""
    tail = nonce_a + nonce_c + label
    return (hmac.digest(key, b"fiberrl-c2a" + tail, "sha256"),
            hmac.digest(key, b"fiberrl-a2c" + tail, "sha256"))


def fresh_nonce() -> bytes:
    """A random nonce for one side of a set-up."""
    return os.urandom(NONCE_BYTES)


class Signer:
    """Signs the messages one side sends on one connection, in order: each MAC is the
    keyed hash of everything signed so far (module doc)."""

    __slots__ = ("_state",)

    def __init__(self, key: bytes) -> None:
        self._state = hashlib.blake2b(key=key, digest_size=MAC_BYTES)

    def sign(self, *parts: Any) -> bytes:
        """The MAC of the next message, made of ``parts`` (call in sending order)."""
        state = self._state
        for part in parts:
            state.update(part)
        return state.digest()

    def sign_one(self, data: Any) -> bytes:
        """``sign(data)`` for a message of one part (the common small message)."""
        state = self._state
        state.update(data)
        return state.digest()


class Verifier:
    """Checks the messages one side receives on one connection, in order. After a
    failed check the connection is useless (its later messages fail too): drop it."""

    __slots__ = ("_state",)

    def __init__(self, key: bytes) -> None:
        self._state = hashlib.blake2b(key=key, digest_size=MAC_BYTES)

    def check(self, digest: Any, *parts: Any) -> None:
        """Raise :class:`ForgedMessageError` unless ``digest`` signs the next message."""
        state = self._state
        for part in parts:
            state.update(part)
        if not hmac.compare_digest(state.digest(), digest):
            raise ForgedMessageError("message failed authentication")

    def check_one(self, digest: Any, data: Any) -> None:
        """``check(digest, data)`` for a message of one part (the common small message)."""
        state = self._state
        state.update(data)
        if not hmac.compare_digest(state.digest(), digest):
            raise ForgedMessageError("message failed authentication")
