"""The hub's second door: requests over authenticated streams instead of ZeroMQ.

A request/reply over ZeroMQ passes through an I/O thread on each side; on a small VM
that made a remote ``Queue.get`` cost ~450 us. Every hub therefore also listens on a
plain TCP stream (:mod:`fiberrl.stream`: the connector proves the run's secret, every
header is signed), served by the hub thread itself. A :class:`~fiberrl.transport.HubClient`
asks the hub for this address once over ZeroMQ and then makes its calls on a stream
of its own per thread.

On the stream a request is ``header = (service, op, req_id, args, first)`` with the
message's body frames after the first as buffers; a reply is ``(req_id, "ok"|"err",
*values, first)``. ``first`` is the body's first frame (a pickle stream, when there is
one) carried *inside* the signed header, so it is covered by the MAC as on ZeroMQ;
the other frames (out-of-band numpy data) are length-checked, as everywhere.
"""
from __future__ import annotations

import logging
from typing import Any, Dict, Sequence

import zmq

from . import transport
from .errors import ForgedMessageError
from .stream import UNIX, Channel, Listener, unix_supported

logger = logging.getLogger(__name__)


class StreamDoor:
    """The hub's stream listener and its channels; every method runs on the hub thread."""

    def __init__(self, host: str) -> None:
        tcp = Listener(host)
        unix = Listener(UNIX) if unix_supported() else None
        self._listeners = {tcp.fileno(): tcp}
        if unix is not None:
            self._listeners[unix.fileno()] = unix
        #: what clients connect to: the Unix socket from this host, else TCP
        self.address = {"tcp": tcp.address, "unix": unix and unix.address,
                        "host": transport.local_hostname()}
        self._channels: Dict[int, Channel] = {}
        self._writing: set = set()

    def register(self, poller: zmq.Poller) -> None:
        """Have the hub's poller watch the listeners."""
        for fd in self._listeners:
            poller.register(fd, zmq.POLLIN)

    def handle(self, events: Dict[Any, int], poller: zmq.Poller, dispatch) -> None:
        """Accept, read and write as ``events`` say; ``dispatch(channel, header, buffers)``
        is called for each authenticated request."""
        for fd, listener in self._listeners.items():
            if fd in events:
                self._accept(listener, poller)
        for fd, channel in list(self._channels.items()):
            flags = events.get(fd)
            if not flags:
                continue
            try:
                if flags & zmq.POLLOUT:
                    channel.on_writable()
                if flags & zmq.POLLIN:
                    for header, buffers in channel.on_readable():
                        dispatch(channel, header, buffers)
            except ConnectionError as exc:
                if isinstance(exc, ForgedMessageError):
                    logger.warning("hub: dropped a stream: %s", exc)
                self._drop(fd, poller)

    def send(self, channel: Channel, header: tuple, buffers: Sequence[Any]) -> None:
        """Reply on ``channel`` (what the socket does not take now is written later)."""
        if channel.fileno() < 0:
            return  # the client went away
        try:
            channel.send(header, buffers)
        except ConnectionError:
            logger.debug("hub: could not reply on a stream that broke")

    def update_interest(self, poller: zmq.Poller) -> None:
        """Watch for writability exactly on the channels with output waiting."""
        for fd, channel in list(self._channels.items()):
            wants = channel.wants_write
            if wants != (fd in self._writing):
                poller.modify(fd, zmq.POLLIN | (zmq.POLLOUT if wants else 0))
                if wants:
                    self._writing.add(fd)
                else:
                    self._writing.discard(fd)

    def _accept(self, listener: Listener, poller: zmq.Poller) -> None:
        while True:
            channel = listener.accept()
            if channel is None:
                return
            self._channels[channel.fileno()] = channel
            poller.register(channel.fileno(), zmq.POLLIN)

    def _drop(self, fd: int, poller: zmq.Poller) -> None:
        channel = self._channels.pop(fd)
        self._writing.discard(fd)
        try:
            poller.unregister(fd)
        except KeyError:
            pass
        channel.close()
