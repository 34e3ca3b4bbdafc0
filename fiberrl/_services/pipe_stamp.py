"""The send time that starts every pipe message's signed frame, by which an
:class:`~fiberrl._services.pipe_inbox.Inbox` merges several senders' messages.

A stamped frame is ``STAMP`` (the send time in ns, and 1 if the message had no frames)
followed by the frame as it was sent. A one-frame message's wire head and its stamp
are packed and unpacked in one step (:data:`STAMPED_HEAD`), the hot path's layout:
``kind, count, size`` (:data:`~fiberrl._wire.framing.ONE_HEAD_FORMAT`), the stamp,
then the payload at :data:`PAYLOAD_AT`.
"""
from __future__ import annotations

import struct
import time
from typing import Any, List, Sequence, Tuple

from .._wire.framing import ONE_HEAD_FORMAT, SMALL, Message
from ..errors import ForgedMessageError

STAMP = struct.Struct("!QB")   # send time (ns, clock_ns), 1 if the message had no frames
STAMP_BYTES = STAMP.size
#: the largest payload a stamped one-frame message sends the short way
SMALL_STAMPED = SMALL - STAMP.size
#: a one-frame message's head with the stamp that starts its frame: packed in one step
STAMPED_HEAD = struct.Struct(ONE_HEAD_FORMAT + STAMP.format.lstrip("!"))
unpack_stamped_head = STAMPED_HEAD.unpack_from
PAYLOAD_AT = STAMPED_HEAD.size            # where a one-frame message's payload starts
FRAME_AT = PAYLOAD_AT - STAMP.size        # where its frame (the stamp first) starts
#: the send-time clock: the wall clock (CLOCK_REALTIME), the one clock that hosts keep
#: in step; a sender whose clock is off anyway counts as sent no later than it was read
clock_ns = time.time_ns


def stamped(frames: Sequence[Any]) -> List[Any]:
    """``frames`` with the send time put in front of frame 0 (the signed frame)."""
    if not frames:
        return [STAMP.pack(clock_ns(), 1)]
    head = frames[0] if type(frames[0]) is bytes else bytes(frames[0])
    return [STAMP.pack(clock_ns(), 0) + head, *frames[1:]]


def unstamp(message: Message) -> Tuple[int, Message]:
    """``(send time, message as it was sent)`` of a stamped message."""
    kind, frames = message
    head = frames[0]
    if len(head) < STAMP.size:
        raise ForgedMessageError("a pipe message without its send time")
    sent, empty = STAMP.unpack_from(head)
    if empty:
        return sent, (kind, [])
    return sent, (kind, [head[STAMP.size:], *frames[1:]])


__all__ = ["STAMP", "STAMP_BYTES", "SMALL_STAMPED", "STAMPED_HEAD", "unpack_stamped_head",
           "PAYLOAD_AT", "FRAME_AT", "clock_ns", "stamped", "unstamp"]
