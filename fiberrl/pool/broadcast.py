"""Where a worker's large shared arguments come from: this host's memory, its own host's
relay, or their bytes on its stream (the policy of :mod:`.shared` and :mod:`.segments`).

Used by the dispatcher (:mod:`.dispatch`) on the I/O loop, under its lock::

    worker says hello (host, could it open our probe?)
       same host, yes -> link.maps:    entries go as references to our host segments
       another host   -> link.relayed: the first worker of its host gets the bytes (its
                                       host's relay, once it says "have"); the others
                                       wait for that (deferred) and map its segment
       otherwise      -> bytes
    "need" (a reference could not be opened) -> the bytes, and no more references to
                                                this host's segments for that worker
"""
from __future__ import annotations

import logging
import socket
from typing import Any, Callable, List, Tuple

from .links import WorkerLink
from .segments import make_probe
from .tasks import Task

logger = logging.getLogger(__name__)


class Broadcast:
    """The pool process's probe segment, its host name, and the workers waiting for their
    host's relay. ``send(link, header, buffers)`` sends a message to a worker (returns its
    size); ``wake(link)`` makes a worker ask for tasks again."""

    def __init__(self, send: Callable[[WorkerLink, tuple, List[Any]], int],
                 wake: Callable[[WorkerLink], None]) -> None:
        self._send, self._wake = send, wake
        self.probe = make_probe()    # workers that can open it map our host segments
        self.probe_ref = self.probe.reference() if self.probe is not None else None
        self.hostname = socket.gethostname()
        self.deferred: List[WorkerLink] = []
        self.maps = 0                # entries sent as a reference instead of their bytes

    def roles(self, host: str, opened_probe: bool) -> Tuple[bool, bool]:
        """``(maps this host's segments, is on another host)`` for a worker's hello."""
        here = host == self.hostname
        return opened_probe and here, not here

    def defer(self, link: WorkerLink, head: Task) -> bool:
        """Whether ``link`` should wait for its host's relay before it takes ``head``."""
        if link.relayed and link.awaits_relay(head):
            self.deferred.append(link)
            return True
        return False

    def wake_deferred(self) -> None:
        """Workers that waited for their host's relay try again."""
        deferred, self.deferred = self.deferred, []
        for link in deferred:
            self._wake(link)

    def need(self, link: WorkerLink, keys: List[int]) -> int:
        """The worker could not map the segments of ``keys``: send their bytes (and, for
        this host's segments, only bytes from now on; another host's relay is forgotten:
        the worker that asked becomes it). Bytes sent."""
        link.maps = False
        held = link.cache.held
        entries = [held[key] for key in keys if key in held]
        for entry in entries:
            if type(entry.relays.get(link.host)) is tuple:
                del entry.relays[link.host]
        adds, data, _ = link.cache_adds(entries)
        adds += [(key, False) for key in keys if key not in held]  # (a bug: never sent)
        logger.info("pool worker %d could not map %d shared argument(s); sending their bytes",
                    link.id, len(keys))
        return self._send(link, ("tasks", [], [], [], False, adds, [], []), data)

    def have(self, link: WorkerLink, made: list) -> None:
        """The worker stored large arguments it received as segments of its own (where,
        for each), or could not (None): the first to have them is its host's relay."""
        for key, fd, size, tag in made:
            entry = link.cache.held.get(key)
            if entry is None:
                continue   # dropped meanwhile
            relay = entry.relays.get(link.host)
            if fd is None:
                if relay == link.id:
                    del entry.relays[link.host]
            elif type(relay) is not tuple:
                entry.relays[link.host] = (link.id, (link.host, link.pid, fd, size, tag))
        self.wake_deferred()

    def close(self) -> None:
        """Release the probe."""
        if self.probe is not None:
            self.probe.close()
