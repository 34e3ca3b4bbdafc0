"""A :class:`Link`: an authenticated stream served by the I/O loop.

The loop reads it and hands each message to ``on_message(link, kind, frames)``; when
the stream ends (end of file, a broken socket, a failed keepalive, a forged message)
``on_close(link, why)`` is called once and the link is closed. ``send`` may be
called from any thread: what the socket does not take at once is written when it
becomes writable.
"""
from __future__ import annotations

import logging
import socket
from typing import Any, Callable, Optional, Sequence

from .._wire.stream import Channel, ForgedMessageError
from .reactor import Reactor

logger = logging.getLogger(__name__)


class Link:
    """A :class:`~fiberrl._wire.stream.Channel` on the loop (see the module docstring)."""

    __slots__ = ("reactor", "channel", "fd", "on_message", "on_close", "closed", "data")

    def __init__(self, reactor: Reactor, sock: socket.socket, send_key: bytes, recv_key: bytes,
                 leftover: bytes, on_message: Callable[["Link", bytes, list], Any],
                 on_close: Optional[Callable[["Link", str], Any]] = None, data: Any = None) -> None:
        self.reactor = reactor
        self.channel = Channel(sock, send_key, recv_key, leftover)
        self.fd = sock.fileno()
        self.on_message = on_message
        self.on_close = on_close
        self.closed = False
        self.data = data   # whatever the owner keeps with it
        reactor.add_reader(self.fd, self._readable)
        if leftover:
            reactor.call_soon(self._readable)

    def _readable(self) -> None:
        if self.closed:
            return
        try:
            messages = self.channel.on_readable()
        except EOFError as exc:
            if isinstance(exc, ForgedMessageError):
                logger.warning("dropped a stream: %s", exc)
            self.close(str(exc) or "end of stream")
            return
        for kind, frames in messages:
            if self.closed:
                return
            self.on_message(self, kind, frames)

    def _writable(self) -> None:
        try:
            self.channel.on_writable()
        except EOFError as exc:
            self.close(str(exc))
            return
        if not self.channel.wants_write:
            self.reactor.set_writer(self.fd, None)

    def send(self, kind: bytes, frames: Sequence[Any] = ()) -> bool:
        """Send one message (any thread); False if the stream is gone."""
        if self.closed:
            return False
        try:
            self.channel.send(kind, frames)
        except EOFError as exc:
            self._close_soon(str(exc))
            return False
        if self.channel.wants_write:
            self.reactor.set_writer(self.fd, self._writable)
        return True

    def _close_soon(self, why: str) -> None:
        if self.reactor.in_loop():
            self.close(why)
        else:
            self.reactor.call_soon(lambda: self.close(why))

    def close(self, why: str = "closed") -> None:
        """Close the stream (on the loop); ``on_close`` hears of it once."""
        if self.closed:
            return
        self.closed = True
        self.reactor.remove(self.fd)
        self.channel.close()
        if self.on_close is not None:
            self.on_close(self, why)
