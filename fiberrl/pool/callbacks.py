"""Where a pool runs its users' callbacks: a thread of their own, started on first use.

Results arrive on the process's I/O loop, which must never block; a callback is user
code and may (it may even wait for another of the pool's results). So callbacks run
here, one at a time and in order of completion, as the stdlib runs them in its
result-handler thread; a call's result becomes ready only after its callback ran,
as in the stdlib.
"""
from __future__ import annotations

import logging
import queue
import threading
from typing import Any, Callable, Optional

logger = logging.getLogger(__name__)

_STOP = object()


class CallbackRunner:
    """Runs ``fn()`` s handed to :meth:`run` on one daemon thread, in order."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._queue: "queue.SimpleQueue[Any]" = queue.SimpleQueue()
        self._thread: Optional[threading.Thread] = None
        self._lock = threading.Lock()

    def run(self, fn: Callable[[], Any]) -> None:
        """Run ``fn`` soon on the callback thread (any thread)."""
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._serve, daemon=True,
                                                name=f"fiberrl-{self.name}-callbacks")
                self._thread.start()
        self._queue.put(fn)

    def _serve(self) -> None:
        while True:
            fn = self._queue.get()
            if fn is _STOP:
                return
            try:
                fn()
            except Exception:  # a failing callback must not stop the ones after it
                logger.exception("pool callback %r failed", fn)

    def stop(self, timeout: Optional[float] = None) -> None:
        """Run what is queued, then end the thread (waits up to ``timeout`` unless called
        from a callback itself)."""
        with self._lock:
            thread = self._thread
        if thread is None:
            return
        self._queue.put(_STOP)
        if thread is not threading.current_thread():
            thread.join(timeout)
