"""A pipe end's link to its peer: activation here, the stream to the peer, and what
the rendezvous says of the peer.

:class:`PipeEndPeer` holds that part of :class:`fiberrl.connection.Connection` (whose
state it uses). An end becomes active in a process by registering an inbox with the
rendezvous, which hands over what waited in its mailbox and says where the peer is;
the end then opens a stream to the peer (an :class:`~.pipe_outbox.Outbox`, or a
:class:`~.pipe_outbox.LocalOutbox` when both ends are in this process). Whenever a
stream fails, or the peer is not known yet, the end asks the rendezvous again, at most
every :data:`LOOKUP_INTERVAL` unless it must know now; the rendezvous's answer may be
that the peer is gone, after which the end's receives end in ``EOFError`` and its sends
in ``BrokenPipeError``.
"""
from __future__ import annotations

import logging
import os
import time
from typing import Any, Optional

from .._runtime import jobenv
from .._runtime.rpc import client_for
from .pipe_closing import PipeEndClosing, live_ends, process_id
from .pipe_inbox import OUTBOX_BROKE, Inbox, pipe_ends
from .pipe_outbox import LocalOutbox, Outbox

logger = logging.getLogger("fiberrl.connection")

#: seconds between two looks at the rendezvous while the peer is unknown or in doubt
LOOKUP_INTERVAL = 0.2
#: how long a receiver waits for the close marker of a peer the rendezvous says closed
#: cleanly (what the peer sent comes before it); a peer whose process died is not waited for
CLOSE_MARKER_GRACE = 2.0
#: how long a look at the peer (a connect to where the rendezvous says it is) may block:
#: a connect to an address that vanished with its container or host waits for ARP or
#: SYN timeouts (seconds); a failed look is repeated a moment later (a sender's, with
#: the usual limit once the rendezvous still names the place)
PROBE_SECONDS = 1.0
#: why an end in use by one thread stopped working under it
TAKEN_AWAY = ("the pipe end was closed, or sent to another process, by another thread while "
              "this one used it")


class PipeEndPeer(PipeEndClosing):
    """The part of a pipe end that finds its peer and keeps a stream to it (mixed into
    ``Connection``, whose state it uses)."""

    def _activate(self, arrived: bool = False) -> None:
        """Make this end active in this process, if it is not yet: register an inbox
        with the rendezvous, take what waited in the mailbox, connect to the peer when
        the rendezvous knows where it is. ``arrived``: the end was just unpickled here."""
        if self._pid == jobenv.pid:
            return
        from .._runtime.jobenv import current_job_token
        streams = pipe_ends()
        inbox = Inbox()
        streams.add(self._pipe_id, self._end, inbox)  # streams may arrive once registered
        loc = {"address": streams.address, "proc": process_id()}
        try:
            (kinds, counts, peer), body = client_for(self._registry).call(
                "pipe", "register", self._pipe_id, self._end, loc, loc["proc"],
                current_job_token(), arrived)
        except BaseException:
            streams.remove(self._pipe_id, self._end, inbox)
            inbox.close()
            raise
        self._inbox, self._pid = inbox, os.getpid()
        self._outbox = self._peer_loc = None
        position = 0
        for kind, count in zip(kinds, counts):
            self._pending.append((kind, body[position:position + count]))
            position += count
        if peer is not None:
            self._connect(peer, PROBE_SECONDS)
        live_ends.add(self)

    def _open_outbox(self, loc: dict, timeout: Optional[float]) -> Any:
        """A sender to the peer end at ``loc``; ``OSError`` if it is not there."""
        peer_end = 1 - self._end
        if loc["proc"] == process_id():
            inbox = pipe_ends().inbox(self._pipe_id, peer_end)
            if inbox is None:
                raise ConnectionRefusedError("the other end is no longer active in this process")
            return LocalOutbox(inbox)
        return Outbox.open(loc["address"], self._pipe_id, peer_end, timeout)

    def _connect(self, loc: dict, timeout: Optional[float] = None) -> bool:
        """Open a stream to the peer end at ``loc`` (waiting up to ``timeout`` s, None:
        :attr:`Outbox.SETUP_SECONDS`); False (and suspicious) on failure."""
        if self._closed:
            raise OSError(TAKEN_AWAY)
        self._disconnect()
        self._peer_loc = loc
        try:
            outbox = self._open_outbox(loc, timeout)
        except OSError as exc:
            logger.debug("pipe %s: cannot reach the other end at %s: %s", self._pipe_id, loc, exc)
            self._suspect = True
            return False
        self._outbox, self._suspect = outbox, False
        inbox = self._inbox
        if inbox is not None and not inbox.closed:   # closed: this end is closing (a last
            inbox.watch(outbox.fileno())              # message, its close marker, goes out)
        return True

    def _disconnect(self) -> None:
        if self._outbox is not None:
            if self._inbox is not None:
                self._inbox.unwatch()
            self._outbox.close()
        self._outbox = None

    def _lookup_peer(self, force: bool = False) -> None:
        """Find (or re-find) the other end; decide EOF if its last holder is gone."""
        now = time.monotonic()
        if not force and now - self._last_lookup < LOOKUP_INTERVAL:
            return
        self._last_lookup = now
        (loc, holders, lost, closed, held), _ = client_for(self._registry).call(
            "pipe", "lookup", self._pipe_id, 1 - self._end)
        if loc is not None:
            if loc != self._peer_loc or self._outbox is None:
                self._connect(loc, PROBE_SECONDS)
            else:
                self._suspect = False  # still where our live stream leads
        elif holders == 0 and (self._suspect or lost or closed):
            # its last copy died (active, or on its way to a job), or was closed
            if closed and not lost and not self._peer_gone:
                self._peer_close_due = now + CLOSE_MARKER_GRACE
            self._peer_gone = True
            # a copy of it still held unused somewhere may read what is sent: after a
            # clean close sends are kept for it (as a kernel pipe's buffer is for a
            # descriptor still open); a copy that died is a fault, which sends report
            self._peer_held = held and not lost

    def _check_peer_there(self) -> None:
        self._lookup_peer(force=True)
        if self._peer_gone and not self._peer_held:
            raise BrokenPipeError("the other end of the pipe is closed")

    def _stream_broke(self, exc: OSError) -> None:
        """The stream to the peer failed: drop it and ask the rendezvous before trusting
        the peer again."""
        logger.debug("pipe %s: stream to the other end broke: %s", self._pipe_id, exc)
        self._disconnect()
        self._suspect = True

    def _find_peer_of_a_receiver(self) -> None:
        """Where the peer is, for an end that has only received (a send would have told
        it): looked up at most every :data:`LOOKUP_INTERVAL`, so that a consumer of a
        steady stream also takes the short way (``_take_quick``) once it knows. A look
        that fails changes nothing: what arrived is handed out, the next wait looks again."""
        try:
            self._lookup_peer()
        except OSError as exc:
            logger.debug("pipe %s: looking up the other end failed: %s", self._pipe_id, exc)

    def _stream_ended(self, ended: int) -> None:
        """A sender's stream to this end ended, or this end's own outbox did (the bits
        of ``Inbox.receive``): the peer may be gone, so ask the rendezvous before
        trusting it again."""
        if ended & OUTBOX_BROKE:
            self._disconnect()
        self._suspect = True
