"""Things kept for one taker each under one-time tickets (lent descriptors, relayed
connections); those kept for a job are released when that job ends untaken."""
from __future__ import annotations

import secrets
import threading
from typing import Callable, Dict, Generic, Optional, Tuple, TypeVar

from .._runtime.liveness import job_watch

T = TypeVar("T")


class Tickets(Generic[T]):
    """A table of ``ticket -> item``; ``release(item)`` frees an item nobody took."""

    def __init__(self, release: Callable[[T], None]) -> None:
        self._release = release
        self._items: Dict[str, Tuple[T, Optional[str]]] = {}
        self._lock = threading.Lock()
        job_watch().on_end(self._job_ended)

    def keep(self, item: T, token: Optional[str]) -> str:
        """Keep ``item`` (for the job of ``token``, if any); returns its ticket."""
        ticket = secrets.token_hex(12)
        with self._lock:
            self._items[ticket] = (item, token)
        return ticket

    def take(self, ticket: str) -> Optional[T]:
        """The item under ``ticket``, once; None if unknown or already taken."""
        with self._lock:
            entry = self._items.pop(ticket, None)
        return None if entry is None else entry[0]

    def _job_ended(self, token: str) -> None:
        with self._lock:
            gone = [t for t, (_, owner) in self._items.items() if owner == token]
            items = [self._items.pop(t)[0] for t in gone]
        for item in items:
            self._release(item)


__all__ = ["Tickets"]
