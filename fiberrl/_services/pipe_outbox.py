"""Where a pipe end sends: an :class:`Outbox`, the stream to the process where the other
end is active, or a :class:`LocalOutbox` when that end is active in this process.

A message is stamped with its send time (:mod:`fiberrl._services.pipe_stamp`), signed
and written whole; a small one-frame message in one system call (:meth:`Outbox.send_small`,
the pipe's hot path). The receiving side is :mod:`fiberrl._services.pipe_inbox`.
"""
from __future__ import annotations

import socket
from typing import Any, Optional, Sequence

from .._wire.framing import write_signed
from .._wire.sockets import Address
from .._wire.stream import Stream, open_stream
from .pipe_inbox import Inbox
from .pipe_stamp import SMALL_STAMPED, STAMP_BYTES, STAMPED_HEAD, clock_ns, stamped


class Outbox(Stream):
    """The sending side of a stream to another process's inbox for one pipe end: every
    message is stamped with its send time."""

    #: how long :meth:`open` waits for the connection by default
    SETUP_SECONDS = 10.0

    def __init__(self, sock: socket.socket, send_key: bytes, recv_key: bytes) -> None:
        super().__init__(sock, send_key, recv_key)
        # On a Unix socket a write to a closed peer fails at once (EPIPE), so only TCP,
        # where the first write after the peer's close still succeeds, needs a look.
        self._look_before_send = sock.family != socket.AF_UNIX

    @classmethod
    def open(cls, address: Address, pipe_id: str, end: int,
             timeout: Optional[float] = None) -> "Outbox":
        """Connect to the inbox of ``(pipe_id, end)`` in the process at ``address``;
        ``OSError`` (``ConnectionRefusedError`` when the end is not active there)."""
        return open_stream(tuple(address), f"pipe:{pipe_id}:{end}",
                           timeout=cls.SETUP_SECONDS if timeout is None else timeout,
                           stream_class=cls)

    def send(self, kind: bytes, frames: Sequence[Any] = ()) -> None:
        """Write one message, stamped with its send time; ``OSError`` if the stream is
        broken."""
        if len(frames) == 1 and type(frames[0]) is bytes and len(frames[0]) < SMALL_STAMPED:
            self.send_small(kind, frames[0])
        else:
            super().send(kind, stamped(frames))

    def send_small(self, kind: bytes, payload: bytes) -> None:
        """``send(kind, [payload])`` for a ``bytes`` payload under 32 KiB (a pipe's hot
        path, in one step: one piece, signed under the lock, one system call)."""
        if self._look_before_send and self.peer_hung_up():
            raise ConnectionResetError("the other end's stream ended")
        with self._send_lock:   # stamped and signed in the order written
            head = STAMPED_HEAD.pack(kind, 1, STAMP_BYTES + len(payload), clock_ns(), 0)
            write_signed(self.sock, self._signer, head + payload)

    def hung_up(self) -> bool:
        """True once the inbox closed its end (over TCP, one ``poll`` of no time; on
        a Unix socket ``send`` itself raises ``BrokenPipeError`` then)."""
        if self._look_before_send:
            return self.peer_hung_up()
        return self.closed


class LocalOutbox:
    """Sending to an end active in this same process: straight into its inbox."""

    def __init__(self, inbox: Inbox) -> None:
        self.inbox = inbox

    def fileno(self) -> Optional[int]:
        """None: nothing to watch."""
        return None

    def send(self, kind: bytes, frames: Sequence[Any]) -> None:
        """Deliver a copy of the message (the sender may change its buffers after)."""
        self.inbox.deliver_local(kind, [f if isinstance(f, bytes) else bytes(f) for f in frames])

    def send_small(self, kind: bytes, payload: bytes) -> None:
        """``send(kind, [payload])``."""
        self.inbox.deliver_local(kind, [payload])

    def hung_up(self) -> bool:
        """True once that end closed here."""
        return self.inbox.closed

    def close(self) -> None:
        """Nothing to close."""


__all__ = ["Outbox", "LocalOutbox"]
