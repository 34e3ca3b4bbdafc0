"""Service "pipe": where each end of each ``Pipe`` lives, and its mailbox.

Lives in the runtime of the process that called ``Pipe()``. For each end it keeps:

* ``holders``: the processes holding a copy of the end, by process id, each with
  its inbox addresses (None for a copy that was handed on to another process but
  is still held, as a duplicated file descriptor would be) and its job token;
* ``mail``: messages sent to the end while no copy was active, and messages a copy
  had not read when it closed (handed back so the next copy reads them, in order).

A sender asks ``mail``: the owner stores the message, answers with the address of the
active copy so the sender connects there directly, answers "doubt" while that copy's
job has lost its watch stream to this process (it died, most likely: the sender asks
again in a moment rather than connect to an address that may have vanished with it),
or answers "closed" when the end's last copy was closed (the sender raises
``BrokenPipeError``). A closing copy calls ``release``: the answer says how many
copies stay active, so only the last one tells the peer "EOF". A copy being sent to
another process (``ship``, counted until it arrives and registers) also counts. Copies
held by jobs that died, and copies on their way to a job that died before it unpickled
them, are dropped on ``lookup``, whose answer says whether any copy was lost that way
and whether the last copy was closed (either way no copies left means EOF, where an
end that was simply never used yet does not; after a close the closer's marker follows
what it sent).

A copy sent on by a process that never used it stays *held unused* there (as a parent
holds the descriptor of an end it passed to a child). Such copies do not keep the
pipe open against copies that were used (the peer reads EOF), except for what the peer
sends after a clean close: that is kept for them, as a kernel pipe keeps it for a
descriptor still open (after a copy died, sends raise: the fault is reported).
They do keep it open against a copy closed without being used (a job given the end
only to close it, as gymnasium's workers are): that close leaves EOF owed, and the
last of those senders to close its copy (``unship``) or to die sends it.
"""
from __future__ import annotations

import logging
import secrets
from typing import Dict, List, Optional

import psutil

from .._runtime.liveness import job_watch
from .._runtime.rpc import Request
from .._runtime.runtime import Runtime, service
from .._wire.sockets import local_hostname

logger = logging.getLogger(__name__)

CLOSE = b"c"   #: the marker a closing end sends (fiberrl.connection uses it too)


class _End:
    __slots__ = ("holders", "order", "mail", "in_transit", "to_jobs", "lost", "closed",
                 "held_unused", "eof_owed")

    def __init__(self) -> None:
        self.holders: Dict[str, dict] = {}   # proc_id -> {"loc": ..., "token": ...}
        self.order: List[str] = []           # proc_ids, most recent last
        self.mail: List[tuple] = []          # (kind, [frames])
        self.in_transit = 0                  # copies pickled, not yet unpickled
        self.to_jobs: Dict[str, int] = {}    # of those, copies bound for a known job
        self.lost = False                    # a copy died with its process
        self.closed = False                  # its last copy was closed
        # processes that sent a copy on without using theirs, and still hold it (as a
        # parent holds a descriptor it passed to a child): proc_id -> job token
        self.held_unused: Dict[str, Optional[str]] = {}
        self.eof_owed = False   # a copy closed unused left EOF to those copies

    def copies(self) -> int:
        """Copies that still count for end-of-file: active ones and ones in transit."""
        return len(self.holders) + max(self.in_transit, 0)

    def active_holder(self) -> Optional[dict]:
        """The most recent holder that receives (its ``loc`` and job ``token``)."""
        for proc_id in reversed(self.order):
            holder = self.holders[proc_id]
            if holder["loc"] is not None:
                return holder
        return None

    def copies_for_unused_close(self) -> int:
        """Copies that count when a copy that was never used is closed: also those
        still held unused by the processes that sent it on."""
        return self.copies() + len(self.held_unused)

    def drop(self, proc_id: str) -> None:
        self.holders.pop(proc_id, None)
        if proc_id in self.order:
            self.order.remove(proc_id)


def _alive_here(proc_id: str) -> bool:
    """False only for a process id of this host whose process no longer runs."""
    host, pid, _ = proc_id.rsplit(":", 2)
    if host != local_hostname():
        return True
    try:
        return psutil.Process(int(pid)).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


class PipeRegistry:
    """The "pipe" service of one process."""

    def __init__(self, rt: Runtime) -> None:
        self.runtime = rt
        self.jobs = job_watch()
        self.pipes: Dict[str, List[_End]] = {}
        rt.rpc.register("pipe", self)

    def create(self) -> str:
        """A new pipe id (its entry is made on first use)."""
        return secrets.token_hex(8)

    def _ends(self, pipe_id: str) -> List[_End]:
        ends = self.pipes.get(pipe_id)
        if ends is None:
            ends = self.pipes[pipe_id] = [_End(), _End()]
        return ends

    def _purge_dead(self, end: _End) -> None:
        """Drop copies held by processes known to be gone: jobs this process started
        that ended, and processes of this host that no longer exist."""
        tokens = {h["token"] for h in end.holders.values() if h["token"]} | set(end.to_jobs)
        dead = {token for token in tokens if self.jobs.ended(token)}
        for proc_id, holder in list(end.holders.items()):
            if holder["token"] in dead or not _alive_here(proc_id):
                end.drop(proc_id)
                end.lost = True
        for token in dead & set(end.to_jobs):
            end.in_transit -= end.to_jobs.pop(token)  # died before unpickling its copy
            end.lost = True
        for proc_id, token in list(end.held_unused.items()):
            if (token and self.jobs.ended(token)) or not _alive_here(proc_id):
                del end.held_unused[proc_id]
                end.lost = end.lost or end.eof_owed

    def _reachable(self, end: _End) -> Optional[dict]:
        """Where a copy should look for the end now: its active copy's location, or
        None while that copy's job has lost its watch stream to this process (it died,
        most likely): a connect to an address that vanished with its container or host
        blocks for seconds, and the job watch's verdict comes sooner."""
        holder = end.active_holder()
        if holder is None or self.jobs.cut_off(holder["token"]):
            return None
        return holder["loc"]

    def __call__(self, op: str, request: Request) -> None:
        pipe_id, index = request.args[0], request.args[1]
        ends = self._ends(pipe_id)
        end, peer = ends[index], ends[1 - index]
        if op == "register":
            loc, proc_id, token, arrived = request.args[2:6]
            if arrived:
                end.in_transit -= 1
                if end.to_jobs.get(token):
                    end.to_jobs[token] -= 1
                    if not end.to_jobs[token]:
                        del end.to_jobs[token]
            end.drop(proc_id)
            end.held_unused.pop(proc_id, None)   # its sender uses its copy after all
            end.closed = end.eof_owed = False
            end.holders[proc_id] = {"loc": loc, "token": token}
            end.order.append(proc_id)
            mail, end.mail = end.mail, []
            request.reply([k for k, _ in mail], [len(f) for _, f in mail], self._reachable(peer),
                          body=[frame for _, frames in mail for frame in frames])
        elif op == "mail":
            loc = self._reachable(end)
            if request.args[2] == CLOSE and peer.copies() == 0:
                peer.closed = True   # the sender's end closed its only, never used copy
            if loc is not None:
                request.reply("peer", loc)
            elif end.active_holder() is not None:
                request.reply("doubt", None)   # the sender waits for the verdict
            elif end.closed and end.copies() == 0 and not end.held_unused:
                request.reply("closed", None)
            else:
                end.mail.append((request.args[2], list(request.body)))
                request.reply("stored", None)
        elif op == "lookup":
            self._purge_dead(end)
            request.reply(self._reachable(end), end.copies(), end.lost, end.closed,
                          bool(end.held_unused))
        elif op == "ship":
            end.in_transit += 1
            token, held_here = request.args[2:4]
            if token:
                end.to_jobs[token] = end.to_jobs.get(token, 0) + 1
            if held_here is not None:
                sender, sender_token = held_here
                end.held_unused[sender] = sender_token
        elif op == "unship":
            end.held_unused.pop(request.args[2], None)
            owed = end.eof_owed and end.copies_for_unused_close() == 0
            if owed:
                end.eof_owed = False
                end.closed = True
            request.reply(owed)
        elif op == "release":
            proc_id, kinds, counts, keep, unused = request.args[2:7]
            if keep and proc_id in end.holders:
                end.holders[proc_id]["loc"] = None  # still held here, no longer read here
            else:
                end.drop(proc_id)
                end.closed = end.copies() == 0
                if unused and end.closed and end.held_unused:
                    end.closed, end.eof_owed = False, True   # their senders hold it still
            returned, position = [], 0
            for kind, count in zip(kinds, counts):
                returned.append((kind, list(request.body[position:position + count])))
                position += count
            end.mail[:0] = returned
            request.reply(end.copies_for_unused_close() if unused else end.copies())
        elif op == "forget":
            self.pipes.pop(pipe_id, None)
        else:
            request.fail(ValueError(f"unknown pipe op {op!r}"))


def pipe_registry() -> PipeRegistry:
    """This process's pipe registry (starts the runtime if needed)."""
    return service("pipe", PipeRegistry)
