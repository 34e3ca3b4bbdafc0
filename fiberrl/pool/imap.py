"""The iterator of ``imap`` and ``imap_unordered``: chunks delivered in order, or as
they finish, to a consumer that reads them one item at a time.

A feeder thread (:func:`feed`) reads the input and submits chunks a
bounded window ahead of the consumer; results are added on the pool's I/O loop.
"""
from __future__ import annotations

import collections
import itertools
import logging
import threading
import time
from multiprocessing.pool import RUN, TERMINATE
from typing import Any, Callable, Optional

from ..errors import PoolTerminatedError, TimeoutError
from .tasks import Call

logger = logging.getLogger(__name__)


class IMapIterator(Call):
    """The iterator of ``imap`` (ordered) and ``imap_unordered``.

    Chunks are flattened; a chunk whose task raised raises its exception once, at
    its place, and iteration goes on after it. The input is read by a feeder thread
    that keeps at most ``window`` chunks submitted and not yet consumed.
    """

    def __init__(self, pool_core: Any, func, ordered: bool, window: int, progress: Any = None,
                 total_items: Optional[int] = None, chunksize: int = 1) -> None:
        super().__init__(pool_core, func, None, None, progress, total_items, chunksize)
        self._ordered = ordered
        self._window = window
        self._cond = threading.Condition()
        self._ready: "collections.deque" = collections.deque()  # (ok, value) chunks to yield
        self._parked: dict = {}     # ordered: chunks that arrived ahead of their turn
        self._next_index = 0        # ordered: the chunk to yield next
        self._items: "collections.deque" = collections.deque()
        self._length: Optional[int] = None  # number of chunks, once the input is exhausted
        self._delivered = 0         # chunks handed to the consumer
        self._completed = 0         # chunks finished by workers (or failed at the input)
        self._aborted: Optional[BaseException] = None

    def __iter__(self) -> "IMapIterator":
        return self

    def __next__(self) -> Any:
        return self.next()

    def next(self, timeout: Optional[float] = None) -> Any:
        """The next item; raises the chunk's error at its place, TimeoutError after ``timeout``."""
        if self._items:
            return self._items.popleft()
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while True:
                if self._items:
                    return self._items.popleft()
                if self._ready:
                    ok, value = self._ready.popleft()
                    self._delivered += 1
                    self._cond.notify_all()
                    if not ok:
                        raise value
                    self._items.extend(value)
                    continue
                if self._aborted is not None:
                    raise self._aborted
                if self._length is not None and self._delivered >= self._length:
                    raise StopIteration
                wait = None if deadline is None else deadline - time.monotonic()
                if wait is not None and wait <= 0:
                    raise TimeoutError(f"no result within {timeout} s")
                self._cond.wait(wait if wait is not None else 1.0)

    __next__.__doc__ = "The next item (see :meth:`next`)."

    # -- feeder side ---------------------------------------------------------------
    def _wait_for_room(self, submitted: int, closing: Callable[[], bool],
                       stopped: Callable[[], bool]) -> bool:
        """Block the feeder until fewer than ``window`` chunks are in flight; False if stopped."""
        with self._cond:
            while not stopped():
                done = self._completed if closing() else self._delivered
                if submitted - done < self._window:
                    return True
                self._cond.wait(0.2)
        return False

    def _input_failed(self, index: int, exc: BaseException) -> None:
        """The input iterable raised while chunk ``index`` was being built."""
        with self._cond:
            self._length = index + 1
            self._add_chunk(index, False, exc)

    def _input_done(self, n_chunks: int) -> None:
        with self._cond:
            self._length = n_chunks
            self._cond.notify_all()

    # -- I/O thread side -----------------------------------------------------------
    def _set(self, index: int, ok: bool, value: Any) -> None:
        with self._cond:
            self._add_chunk(index, ok, value)

    def _add_chunk(self, index: int, ok: bool, value: Any) -> None:
        self._completed += 1
        if not self._ordered:
            self._ready.append((ok, value))
        else:
            self._parked[index] = (ok, value)
            while self._next_index in self._parked:
                self._ready.append(self._parked.pop(self._next_index))
                self._next_index += 1
        self._cond.notify_all()

    def _abort(self, exc: BaseException) -> None:
        with self._cond:
            self._aborted = exc
            self._cond.notify_all()


#: the stdlib's name for the unordered iterator (one class serves both orders here)
IMapUnorderedIterator = IMapIterator


def feed(core: Any, result: IMapIterator, iterator: Any, chunksize: int, mode: int) -> None:
    """Read an imap's input a bounded window ahead of its consumer (feeder thread)."""
    dispatcher = core.dispatcher
    closing = lambda: core.state != RUN  # noqa: E731
    stopped = lambda: core.state == TERMINATE  # noqa: E731
    index = 0
    try:
        while result._wait_for_room(index, closing, stopped):
            try:
                chunk = list(itertools.islice(iterator, chunksize))
            except Exception as exc:
                result._input_failed(index, exc)
                dispatcher.submit(result, [], True)
                return
            if not chunk:
                break
            try:
                task = result._make_task(index, mode, chunk, len(chunk), index * chunksize)
            except Exception as exc:
                result._input_failed(index, exc)
                dispatcher.submit(result, [], True)
                return
            dispatcher.submit(result, [task], False)
            index += 1
        result._input_done(index)
        dispatcher.submit(result, [], True)
    except BaseException as exc:  # noqa: BLE001 - the consumer must hear of it
        logger.exception("imap feeder failed")
        result._abort(exc)
        dispatcher.submit(result, [], True)
    if stopped():
        result._abort(PoolTerminatedError("the pool was terminated"))
