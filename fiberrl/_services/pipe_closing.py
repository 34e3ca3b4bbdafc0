"""Closing a pipe end, handing it to another process, and closing one dropped unclosed.

:class:`PipeEndClosing` holds that part of :class:`fiberrl.connection.Connection`. A
copy that stops being used here stops its inbox receiving (senders turn to the registry,
which keeps what they send), hands unread messages back to the registry, and, when it
was the last copy, sends the close marker that gives the other end ``EOFError``. A copy
sent to another process gives up being the active copy here instead. An end dropped
without ``close()`` is closed by the closer thread (:mod:`fiberrl._runtime.dropped`).
"""
from __future__ import annotations

import logging
import os
import secrets
import weakref
from typing import Any

from .._runtime import dropped, jobenv
from .._runtime.rpc import client_for
from .._wire.sockets import local_hostname
from .pipe_inbox import pipe_ends
from .pipe_registry import CLOSE

logger = logging.getLogger("fiberrl.connection")

#: the pipe ends active in this process (closed at a job's exit)
live_ends: "weakref.WeakSet[Any]" = weakref.WeakSet()
_proc = {"pid": None, "id": None}


def process_id() -> str:
    """A name for this process that no other process anywhere shares."""
    if _proc["pid"] != os.getpid():
        _proc["pid"], _proc["id"] = os.getpid(), f"{local_hostname()}:{os.getpid()}:{secrets.token_hex(4)}"
    return _proc["id"]


class PipeEndClosing:
    """The closing half of a pipe end (mixed into ``Connection``, whose state it uses)."""

    def close(self) -> None:
        """Close this copy; when it is the last copy, the other end gets ``EOFError``."""
        if self._closed:
            return
        try:
            if self._pid == jobenv.pid or self._dormant_pid == jobenv.pid:
                self._release(unused=not self._used)
            elif not self._shipped:
                self._close_unused()
            else:
                self._unship()
        except Exception:
            logger.debug("could not tell the peer of %r that it closed", self, exc_info=True)
        finally:
            self._closed = True
            if self._pid == jobenv.pid:
                self._disconnect()
                self._close_inbox()
            live_ends.discard(self)
            self._pending.clear()

    def _close_inbox(self) -> None:
        if self._inbox is not None:
            pipe_ends().remove(self._pipe_id, self._end, self._inbox)
            self._inbox.close()
            self._inbox = None

    def _hand_over(self) -> None:
        """This copy is being sent to another process: give up being the active copy
        here (unread messages go back to the rendezvous), so the copy that arrives
        there receives what is sent from now on. A peer end in this same process
        is told at once; peers elsewhere notice when their stream to it ends."""
        self._release(keep=True)
        self._disconnect()
        self._close_inbox()
        self._pid, self._dormant_pid = None, jobenv.pid
        self._pending.clear()
        for other in list(live_ends):
            if (other._pipe_id == self._pipe_id and other._end != self._end
                    and other._pid == jobenv.pid):
                other._disconnect()

    def _release(self, keep: bool = False, unused: bool = False) -> None:
        """Hand unread messages back to the rendezvous; the last copy sends EOF.

        With ``keep`` this process still holds the end (it was handed on): no EOF.
        With ``unused`` (nothing was sent or received through this copy), copies still
        held unused by the processes that sent it on count too: closing an end a job
        was given only so that it could close it ends nothing while its sender holds it.
        """
        if self._pid == jobenv.pid:
            # senders go to the rendezvous from now on (a copy that closes waits for no
            # TCP sender: what it hands back is read only if another copy is used)
            self._inbox.stop_receiving(self._pending, flush_tcp=keep)
        unread = list(self._pending)
        (remaining,), _ = client_for(self._registry).call(
            "pipe", "release", self._pipe_id, self._end, process_id(),
            [kind for kind, _ in unread], [len(body) for _, body in unread],
            keep, unused, body=[frame for _, body in unread for frame in body], timeout=10.0)
        if not keep and remaining == 0 and not self._eof:
            if self._pid == jobenv.pid:
                self._send_frames(CLOSE, [])
            else:
                self._close_unused()

    def _unship(self) -> None:
        """Closing a copy that was sent on and never used here: the peer gets EOF if a
        receiver closed its copy unused while this one was still held."""
        (owed,), _ = client_for(self._registry).call(
            "pipe", "unship", self._pipe_id, self._end, process_id(), timeout=10.0)
        if owed:
            self._close_unused()

    def _close_unused(self) -> None:
        """Closing a copy never used nor sent anywhere: the peer gets EOF."""
        client = client_for(self._registry)
        (answer, loc), _ = client.call("pipe", "mail", self._pipe_id, 1 - self._end, CLOSE,
                                       timeout=10.0)
        if answer == "peer":
            outbox = self._open_outbox(loc)
            try:
                outbox.send(CLOSE, [])
            finally:
                outbox.close()

    def __del__(self) -> None:
        # Dropped without close(): closed as a stdlib connection's descriptor is when it
        # is collected (the peer sees EOF once no copy is left), by the closer thread, as
        # a close talks to the rendezvous (fiberrl._runtime.dropped says why). A copy a
        # fork child inherited is not the child's to close.
        if getattr(self, "_closed", True) or self._owner_pid != os.getpid():
            return
        heir = object.__new__(type(self))
        heir.__dict__.update(self.__dict__)
        self._closed = True
        if dropped.close_later(heir.close):
            return
        heir._closed = True
        if heir._pid == jobenv.pid:
            try:
                heir._disconnect()
                heir._close_inbox()
            except Exception:
                pass
