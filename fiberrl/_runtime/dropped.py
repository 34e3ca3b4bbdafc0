"""Closing what was dropped without being closed, on a thread of its own.

A ``Connection`` the program drops without ``close()`` must still close, as a stdlib
connection's descriptor does when it is collected: its peer sees the end of file once
no copy is left. Closing one talks to the pipe's rendezvous, which a ``__del__`` must
not do itself: the garbage collector runs in the middle of any code, on any thread,
possibly with a lock held that the close would need. So ``__del__`` only queues the
close here (a ``deque`` append and a one-byte write, no lock taken), and one daemon
thread per process runs the queued closes. :func:`run_queued` runs what is left at a
job's exit.
"""
from __future__ import annotations

import collections
import contextlib
import logging
import os
import threading
from typing import Callable, Deque, Optional

logger = logging.getLogger(__name__)


class _Closer:
    """The queue and thread of one process."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.queue: Deque[Callable[[], None]] = collections.deque()
        self.running = threading.Lock()   # held while closes run (a job's exit waits on it)
        self.wake_r, self.wake_w = os.pipe()
        os.set_blocking(self.wake_w, False)
        threading.Thread(target=self._run, name="fiberrl-dropped-closer", daemon=True).start()

    def _run(self) -> None:
        while True:
            try:
                os.read(self.wake_r, 4096)
            except OSError:
                return
            self.run_queued()

    def run_queued(self) -> None:
        with self.running:
            self._run_all()

    def _run_all(self) -> None:
        while True:
            try:
                close = self.queue.popleft()
            except IndexError:
                return
            try:
                close()
            except Exception:
                logger.debug("closing a dropped object failed", exc_info=True)

    def put(self, close: Callable[[], None]) -> None:
        self.queue.append(close)
        with contextlib.suppress(OSError):   # full: it is awake already
            os.write(self.wake_w, b"\0")


_closer: Optional[_Closer] = None
_start_lock = threading.Lock()


def start() -> None:
    """Start this process's closer thread if it is not running (call it from ordinary
    code, before anything may be dropped: starting a thread takes locks)."""
    global _closer
    if _closer is not None and _closer.pid == os.getpid():
        return
    with _start_lock:
        if _closer is None or _closer.pid != os.getpid():
            _closer = _Closer()


def close_later(close: Callable[[], None]) -> bool:
    """Queue ``close`` for the closer thread (safe in ``__del__``); False when this
    process has none running (nothing is queued then)."""
    closer = _closer
    if closer is None or closer.pid != os.getpid():
        return False
    closer.put(close)
    return True


def run_queued() -> None:
    """Run the queued closes now, in this thread, after any the closer thread is
    running (at a job's exit: every dropped end is closed before its runtime stops)."""
    closer = _closer
    if closer is not None and closer.pid == os.getpid():
        closer.run_queued()


def _forget_in_child() -> None:
    global _closer, _start_lock
    _start_lock = threading.Lock()   # another thread may have held it at the fork
    if _closer is not None:
        for fd in (_closer.wake_r, _closer.wake_w):
            with contextlib.suppress(OSError):
                os.close(fd)
        _closer = None


os.register_at_fork(after_in_child=_forget_in_child)
