"""Opt-in progress reporting for long ``map``/``imap`` calls.

``progress=`` accepts:

- ``True``: a one-line text bar on stderr (count, rate, time left), redrawn at most
  ten times a second;
- an object with an ``update(n)`` method, such as a ``tqdm`` bar: it gets the number
  of items finished since the last call;
- a callable: it is called as ``progress(done, total)`` (``total`` is None when the
  input has no length).

Updates come from the pool's I/O thread; they must be quick.
"""
from __future__ import annotations

import logging
import sys
import time
from typing import Any, Optional, TextIO

logger = logging.getLogger(__name__)


class Progress:
    """Counts finished items and forwards them to the user's sink."""

    def __init__(self, sink: Any, total: Optional[int]) -> None:
        self.sink = sink
        self.total = total
        self.done = 0

    def advance(self, n: int) -> None:
        self.done += n
        try:
            if hasattr(self.sink, "update"):
                self.sink.update(n)
            else:
                self.sink(self.done, self.total)
        except Exception:
            logger.exception("progress sink %r raised; progress reporting stops", self.sink)
            self.sink = _Null()

    def close(self) -> None:
        closer = getattr(self.sink, "close_bar", None)
        if closer is not None:
            try:
                closer()
            except Exception:
                logger.exception("progress bar %r failed to close", self.sink)


class _Null:
    def update(self, n: int) -> None:
        pass


class TextBar:
    """A minimal tqdm-style bar: ``[#####     ] 512/1000  812.3 it/s  0:00:01 left``."""

    def __init__(self, total: Optional[int], stream: Optional[TextIO] = None,
                 width: int = 30, min_interval: float = 0.1) -> None:
        self.total = total
        self.stream = stream or sys.stderr
        self.width = width
        self.min_interval = min_interval
        self.done = 0
        self._start = time.monotonic()
        self._last_draw = 0.0

    def update(self, n: int) -> None:
        self.done += n
        now = time.monotonic()
        if now - self._last_draw >= self.min_interval or self.done == self.total:
            self._last_draw = now
            self._draw(now)

    def _draw(self, now: float) -> None:
        elapsed = max(now - self._start, 1e-9)
        rate = self.done / elapsed
        if self.total:
            filled = int(self.width * self.done / self.total)
            left = (self.total - self.done) / rate if rate > 0 else float("inf")
            left_text = "?" if left == float("inf") else time.strftime("%H:%M:%S", time.gmtime(left))
            line = (f"[{'#' * filled}{' ' * (self.width - filled)}] {self.done}/{self.total}"
                    f"  {rate:.1f} it/s  {left_text} left")
        else:
            line = f"{self.done} done  {rate:.1f} it/s"
        self.stream.write("\r" + line)
        self.stream.flush()

    def close_bar(self) -> None:
        self._draw(time.monotonic())
        self.stream.write("\n")
        self.stream.flush()


def make_progress(progress: Any, total: Optional[int]) -> Optional[Progress]:
    """Build the reporter for a call's ``progress=`` argument (None when off)."""
    if progress is None or progress is False:
        return None
    if progress is True:
        return Progress(TextBar(total), total)
    if hasattr(progress, "update") or callable(progress):
        return Progress(progress, total)
    raise TypeError("progress must be True, a callable progress(done, total), "
                    f"or an object with update(n); got {type(progress).__name__}")
