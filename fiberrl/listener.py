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
  (:mod:`fiberrl.fd_sharing`), like a stdlib child;
* families: ``'AF_INET'`` (TCP, across hosts: bind a reachable address such as
  ``('0.0.0.0', port)``) and ``'AF_UNIX'`` (a path or abstract name, one host).

Data flow::

    Listener(address, authkey) --accept()--> challenge both ways --> Connection
    Client(address, authkey)   --connect---> challenge both ways --> Connection
"""
from __future__ import annotations

import logging
from multiprocessing import connection as _stdlib
from multiprocessing import process as _process
from typing import Any, Optional

logger = logging.getLogger(__name__)

__all__ = ["Listener", "Client", "answer_challenge", "deliver_challenge", "CHALLENGE",
           "families"]

answer_challenge = _stdlib.answer_challenge
deliver_challenge = _stdlib.deliver_challenge
CHALLENGE = _stdlib.CHALLENGE
families = _stdlib.families


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


class Listener(_stdlib.Listener):
    """A bound socket that accepts authenticated connections (``multiprocessing``'s
    ``Listener``; ``authkey=None`` is the run's secret). ``address`` (a ``(host, port)``
    tuple or a path), ``last_accepted``, ``accept()``, ``close()``, context manager."""

    def __init__(self, address: Any = None, family: Optional[str] = None, backlog: int = 1,
                 authkey: Optional[bytes] = None) -> None:
        super().__init__(address, family, backlog, _key(authkey))


def Client(address: Any, family: Optional[str] = None,  # noqa: N802 - the stdlib's name
           authkey: Optional[bytes] = None) -> _stdlib.Connection:
    """Connect to the :class:`Listener` at ``address`` and pass its challenge (and pose
    one); ``authkey=None`` is the run's secret. ``AuthenticationError`` if either side
    holds another key."""
    return _stdlib.Client(address, family, _key(authkey))
