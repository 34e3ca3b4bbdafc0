"""The pool's messages on the one wire: a pickled header tuple and its buffers.

A worker opens an authenticated stream to its pool's process with the label
``"pool:<name>"``; the runtime's listener checks the proof and hands the stream to
that pool's dispatcher (:meth:`PoolChannel.adopt`). Each message is one wire message
of kind ``b"p"`` whose signed frame 0 is the pickled header (see
:mod:`fiberrl.pool.worker` for the headers), followed by its out-of-band buffers.
Frame 0 is unpickled only after its MAC was checked.
"""
from __future__ import annotations

import pickle
from typing import Any, List, Optional, Sequence, Tuple

from .._wire.sockets import Address
from .._wire.stream import Channel, Stream, open_stream

_KIND = b"p"
Message = Tuple[tuple, List[Any]]


def _encode(header: tuple, buffers: Sequence[Any]) -> List[Any]:
    return [pickle.dumps(header, protocol=5), *buffers]


class PoolChannel:
    """The dispatcher's side of one worker's stream (non-blocking, on its selector).

    Failures are ``ConnectionError`` s: the stream ended, broke, or carried a forged
    message.
    """

    def __init__(self, channel: Channel) -> None:
        self.channel = channel

    def fileno(self) -> int:
        """The stream's descriptor."""
        return self.channel.fileno()

    @property
    def wants_write(self) -> bool:
        """True while queued bytes wait for the socket."""
        return self.channel.wants_write

    def on_readable(self) -> List[Message]:
        """The messages that arrived."""
        try:
            messages = self.channel.on_readable()
        except EOFError as exc:
            raise ConnectionError(str(exc) or "the worker closed its stream") from None
        return [(pickle.loads(frames[0]), frames[1:]) for _kind, frames in messages]

    def on_writable(self) -> None:
        """Write queued bytes."""
        try:
            self.channel.on_writable()
        except EOFError as exc:
            raise ConnectionError(str(exc)) from None

    def send(self, header: tuple, buffers: Sequence[Any] = ()) -> int:
        """Queue one message; write what the socket takes now. Returns its size: the
        pickled header's bytes and its buffers'."""
        frames = _encode(header, buffers)
        try:
            self.channel.send(_KIND, frames)
        except EOFError as exc:
            raise ConnectionError(str(exc)) from None
        size = len(frames[0])
        for buffer in buffers:
            size += memoryview(buffer).nbytes
        return size

    def close(self) -> None:
        """Close the stream."""
        self.channel.close()


class WorkerConnection:
    """A worker's blocking stream to its pool (``send`` from any thread)."""

    def __init__(self, address: Address, label: str, timeout: float = 30.0) -> None:
        self.stream: Stream = open_stream(tuple(address), label, timeout=timeout)

    def send(self, header: tuple, buffers: Sequence[Any] = ()) -> None:
        """Send one message; ``OSError`` if the pool is gone."""
        self.stream.send(_KIND, _encode(header, buffers))

    def recv(self, timeout: Optional[float] = None) -> Optional[Message]:
        """The next message (None after ``timeout``); ``EOFError`` when the pool closed."""
        got = self.stream.recv(timeout)
        if got is None:
            return None
        return pickle.loads(got[1][0]), got[1][1:]

    def close(self) -> None:
        """Close the stream."""
        self.stream.close()
