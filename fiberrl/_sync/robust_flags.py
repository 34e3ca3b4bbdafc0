"""``Event`` and ``Barrier`` that survive the death of their users (see :mod:`.robust`:
the same machinery, the same identities of callers).

- ``Event``: a departed client leaves nothing to undo;
- ``Barrier``: if a waiting party's client departs, the barrier is broken, so the
  other parties get ``threading.BrokenBarrierError`` instead of waiting forever.
"""
from __future__ import annotations

import logging
import threading
import time
from typing import Any, Callable, Optional

from ..errors import ClientGone
from .robust import Robust

logger = logging.getLogger(__name__)


class Event(Robust):
    """A flag that processes can set, clear and wait for."""

    def __init__(self) -> None:
        super().__init__()
        self._flag = False

    def is_set(self) -> bool:
        """Whether the flag is set."""
        return self._flag

    def set(self) -> None:
        """Set the flag and wake every waiter."""
        with self._state:
            self._flag = True
            self._state.notify_all()

    def clear(self) -> None:
        """Reset the flag."""
        with self._state:
            self._flag = False

    def wait(self, timeout: Optional[float] = None) -> bool:
        """Wait until the flag is set; return the flag."""
        deadline = None if timeout is None else time.monotonic() + max(0.0, timeout)
        with self._state:
            return self._wait_until(lambda: self._flag, deadline)


class Barrier(Robust):
    """``threading.Barrier`` for processes; broken if a waiting party disconnects.

    ``action`` (if given) runs in the server, called by the last party to arrive.
    """

    def __init__(self, parties: int, action: Optional[Callable[[], Any]] = None,
                 timeout: Optional[float] = None) -> None:
        if parties < 1:
            raise ValueError("parties must be >= 1")
        super().__init__()
        self._parties = parties
        self._action = action
        self._timeout = timeout
        self._count = 0
        self._generation = 0
        self._broken = False
        self._broken_generations: "set[int]" = set()

    def wait(self, timeout: Optional[float] = None) -> int:
        """Wait for all parties; return this party's arrival index (0..parties-1)."""
        if timeout is None:
            timeout = self._timeout
        with self._state:
            if self._broken:
                raise threading.BrokenBarrierError
            generation, index = self._generation, self._count
            self._count += 1
            if self._count == self._parties:
                self._trip()
                return index
            deadline = None if timeout is None else time.monotonic() + timeout
            try:
                passed = self._wait_until(
                    lambda: self._generation != generation or self._broken, deadline)
            except ClientGone:
                logger.warning("a party waiting at a barrier disconnected; breaking the barrier")
                self._break()
                raise
            if self._generation != generation and generation not in self._broken_generations:
                return index
            if not passed:
                self._break()
            raise threading.BrokenBarrierError

    def _trip(self) -> None:
        try:
            if self._action is not None:
                self._action()
        except BaseException:
            self._break()
            raise
        self._count = 0
        self._generation += 1
        self._state.notify_all()

    def _break(self) -> None:
        self._broken = True
        self._state.notify_all()

    def abort(self) -> None:
        """Break the barrier: current and future waiters get ``BrokenBarrierError``."""
        with self._state:
            self._break()

    def reset(self) -> None:
        """Return to the initial state; parties waiting now get ``BrokenBarrierError``."""
        with self._state:
            if self._count or self._broken:
                if self._count:
                    self._broken_generations.add(self._generation)
                    if len(self._broken_generations) > 1024:
                        self._broken_generations.discard(min(self._broken_generations))
                self._generation += 1
            self._count = 0
            self._broken = False
            self._state.notify_all()

    @property
    def parties(self) -> int:
        """The number of parties needed to pass."""
        return self._parties

    @property
    def n_waiting(self) -> int:
        """The number of parties waiting now."""
        return self._count if not self._broken else 0

    @property
    def broken(self) -> bool:
        """Whether the barrier is broken."""
        return self._broken
