"""The one I/O loop of a process: a thread that waits on descriptors and timers.

Everything event-driven in a process runs here: the listener's set-ups, the RPC
channels, the pool's worker channels, the watch streams of jobs, and the local
backend's job output. Callbacks must not block; work that may block (a backend
query, a user callback) belongs on another thread.

Any thread may register descriptors (``epoll_ctl`` is thread-safe and the handler
table is a dict, so a registration made while the loop sleeps takes effect at
once), and :meth:`call_soon` / :meth:`call_later` are thread-safe.
"""
from __future__ import annotations

import collections
import heapq
import itertools
import logging
import os
import select
import threading
import time
from typing import Any, Callable, Dict, List, Optional

logger = logging.getLogger(__name__)

Callback = Callable[[], Any]


class Timer:
    """A call scheduled with :meth:`Reactor.call_later`; :meth:`cancel` stops it."""

    __slots__ = ("when", "order", "fn")

    def __init__(self, when: float, order: int, fn: Optional[Callback]) -> None:
        self.when, self.order, self.fn = when, order, fn

    def __lt__(self, other: "Timer") -> bool:
        return (self.when, self.order) < (other.when, other.order)

    def cancel(self) -> None:
        """Do not run it (if it has not run yet)."""
        self.fn = None


class Reactor:
    """One selector loop on its own daemon thread (see the module docstring)."""

    def __init__(self, name: str = "fiberrl-io") -> None:
        self._epoll = select.epoll()
        self._readers: Dict[int, Callback] = {}
        self._writers: Dict[int, Callback] = {}
        self._calls: "collections.deque[Callback]" = collections.deque()
        self._timers: List[Timer] = []
        self._timer_lock = threading.Lock()
        self._order = itertools.count()
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        self._woken = False
        self._epoll.register(self._wake_r, select.EPOLLIN)
        self._stopping = False
        self.pid = os.getpid()
        self.thread = threading.Thread(target=self._run, name=name, daemon=True)
        self.thread.start()

    # -- any thread ------------------------------------------------------------------
    def in_loop(self) -> bool:
        """True when called from the loop's own thread."""
        return threading.current_thread() is self.thread

    def add_reader(self, fd: int, callback: Callback) -> None:
        """Call ``callback()`` whenever ``fd`` is readable (or hung up)."""
        self._readers[fd] = callback
        self._update(fd)

    def set_writer(self, fd: int, callback: Optional[Callback]) -> None:
        """Call ``callback()`` whenever ``fd`` is writable; None stops it."""
        if callback is None:
            if self._writers.pop(fd, None) is None:
                return
        else:
            if self._writers.get(fd) is callback:
                return
            self._writers[fd] = callback
        self._update(fd)

    def remove(self, fd: int) -> None:
        """Stop watching ``fd`` (call before closing it)."""
        self._readers.pop(fd, None)
        self._writers.pop(fd, None)
        try:
            self._epoll.unregister(fd)
        except (OSError, ValueError):
            pass

    def _update(self, fd: int) -> None:
        mask = (select.EPOLLIN if fd in self._readers else 0) | \
               (select.EPOLLOUT if fd in self._writers else 0)
        try:
            self._epoll.modify(fd, mask)
        except FileNotFoundError:
            self._epoll.register(fd, mask)

    def call_soon(self, fn: Callback) -> None:
        """Run ``fn()`` on the loop's thread, in the order of these calls."""
        self._calls.append(fn)
        if not self._woken:
            self._woken = True
            try:
                os.write(self._wake_w, b"x")
            except (BlockingIOError, OSError):
                pass

    def call_later(self, delay: float, fn: Callback) -> Timer:
        """Run ``fn()`` on the loop's thread after ``delay`` seconds."""
        timer = Timer(time.monotonic() + delay, next(self._order), fn)
        with self._timer_lock:
            heapq.heappush(self._timers, timer)
            first = self._timers[0] is timer
        if first and not self.in_loop():
            self.call_soon(_nothing)  # the loop may sleep past it: wake it to look again
        return timer

    def stop(self) -> None:
        """Stop the loop (at interpreter exit); callbacks still queued are dropped."""
        self._stopping = True
        self.call_soon(_nothing)

    # -- the loop --------------------------------------------------------------------
    def _run(self) -> None:
        while not self._stopping:
            try:
                events = self._epoll.poll(self._next_timeout())
            except InterruptedError:  # pragma: no cover - PEP 475 retries
                continue
            for fd, mask in events:
                if fd == self._wake_r:
                    self._drain_wake()
                    continue
                if mask & (select.EPOLLOUT | select.EPOLLERR) and fd in self._writers:
                    self._safely(self._writers.get(fd))
                if mask & (select.EPOLLIN | select.EPOLLHUP | select.EPOLLERR):
                    self._safely(self._readers.get(fd))
            calls = self._calls
            while calls:
                self._safely(calls.popleft())
            self._run_timers()
        self._epoll.close()
        os.close(self._wake_r)
        os.close(self._wake_w)

    def _drain_wake(self) -> None:
        try:
            while os.read(self._wake_r, 4096):
                pass
        except (BlockingIOError, OSError):
            pass
        # Only now. Cleared before the read, a call_soon() landing in between would set
        # the flag and write a byte that this read takes: the flag stays set with the
        # pipe empty, and no later call_soon() wakes the loop again. Cleared after it, a
        # call_soon() that found the flag set either queued its call before this point
        # (it runs below) or wrote its byte after (it wakes the next poll).
        self._woken = False

    def _next_timeout(self) -> float:
        if self._calls:
            return 0
        with self._timer_lock:
            if not self._timers:
                return -1
            return max(0.0, self._timers[0].when - time.monotonic())

    def _run_timers(self) -> None:
        now = time.monotonic()
        while True:
            with self._timer_lock:
                if not self._timers or self._timers[0].when > now:
                    return
                timer = heapq.heappop(self._timers)
            self._safely(timer.fn)

    @staticmethod
    def _safely(fn: Optional[Callback]) -> None:
        if fn is None:
            return
        try:
            fn()
        except Exception:  # one failing callback must not stop the process's I/O
            logger.exception("fiberrl I/O loop: %r failed", fn)


def _nothing() -> None:
    """A no-op, to wake the loop."""
