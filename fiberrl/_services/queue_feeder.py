"""A remote producer's side of a queue: the :class:`Feeder` thread and its batches.

Data flow::

    put() in a process that does not own the queue --append--> Feeder._pending
    Feeder thread --one "put_many" call per batch (pickle streams joined in the signed
    frame, out-of-band buffers as frames of their own)--> the owner's broker

A process waits for its feeders before it exits (:func:`flush_all`) unless the queue's
``cancel_join_thread()`` was called: a fiberrl job calls it at its end, and every
process (a stdlib child handed a fiberrl queue too) runs it among the stdlib's exit
finalizers, which ``BaseProcess._bootstrap`` and the root's ``atexit`` run.
"""
from __future__ import annotations

import collections
import itertools
import logging
import os
import threading
import weakref
from multiprocessing import util as _mp_util
from typing import Any, Deque, List, Optional

from .._runtime.rpc import RpcClient

logger = logging.getLogger(__name__)

#: A feeder batch ends at this many items or bytes; the rest goes in the next batch,
#: so the owner starts handing items out while later ones are still on their way.
_BATCH_ITEMS = 8192
_BATCH_BYTES = 4 << 20


def pack_batch(batch: List[List[Any]]) -> tuple:
    """Items' frames -> ``(sizes, buffer_counts, body)`` of one ``put_many`` message:
    the pickle streams joined in the first frame, the one the wire signs in full,
    then the out-of-band buffers as frames of their own, uncopied."""
    sizes = [len(frames[0]) for frames in batch]
    body: List[Any] = [b"".join([frames[0] for frames in batch])]
    counts: Optional[List[int]] = None
    if any(len(frames) > 1 for frames in batch):
        counts = [len(frames) - 1 for frames in batch]
        body.extend(buf for frames in batch for buf in frames[1:])
    return sizes, counts, body


def unpack_batch(body: List[Any], sizes: List[int], counts: Optional[List[int]]) -> List[List[Any]]:
    """The inverse of :func:`pack_batch`: each item's frames (views, no copy)."""
    stream, starts = memoryview(body[0]), itertools.accumulate(sizes, initial=0)
    if counts is None:  # no out-of-band buffers (the common case)
        return [[stream[start:start + size]] for start, size in zip(starts, sizes)]
    buffers = iter(body[1:])
    return [[stream[start:start + size], *itertools.islice(buffers, count)]
            for start, size, count in zip(starts, sizes, counts)]


class Feeder:
    """Background thread that sends a remote process's puts in batches.

    ``put`` appends the pickled item (no lock; it wakes the thread only if it sleeps).
    The thread sends what piled up, up to ``_BATCH_ITEMS``/``_BATCH_BYTES``, in one
    message and waits for the broker's acknowledgement, so batches grow with load and
    this process's other operations (``get``, ``qsize``...) can wait for earlier puts.
    """

    def __init__(self, client: RpcClient, qid: str) -> None:
        self.client, self.qid, self.pid = client, qid, os.getpid()
        self.cancelled = False
        self._pending: Deque[List[Any]] = collections.deque()
        self._wake = threading.Event()
        self._sleeping = False
        self._busy = False
        self._done = threading.Condition()  # notified after each batch
        self._error: Optional[BaseException] = None
        self._thread = threading.Thread(target=self._run, name="fiberrl-queue-feeder", daemon=True)
        self._thread.start()
        _flush_at_exit()

    def put(self, frames: List[Any]) -> None:
        """Queue one item's frames for sending (buffers are copied now)."""
        if self._error is not None:
            raise self._error
        if len(frames) > 1:  # the item must not change after put()
            frames = [frames[0], *[bytes(f) for f in frames[1:]]]
        self._pending.append(frames)
        if self._sleeping:
            self._wake.set()

    def flush(self, timeout: Optional[float] = None) -> bool:
        """Wait until every put so far was acknowledged by the broker."""
        with self._done:
            done = self._done.wait_for(lambda: not self._pending and not self._busy
                                       or self._error is not None, timeout)
            if self._error is not None:
                raise self._error
            return done

    def _wait_for_items(self) -> None:
        # _sleeping is set before the last look at _pending, and put() appends
        # before it reads _sleeping: one of the two sees the other.
        while not self._pending:
            self._wake.clear()
            self._sleeping = True
            if not self._pending:
                self._wake.wait()
            self._sleeping = False

    def _take_batch(self) -> List[List[Any]]:
        pending, batch, size = self._pending, [], 0
        while pending and len(batch) < _BATCH_ITEMS and size < _BATCH_BYTES:
            frames = pending.popleft()
            batch.append(frames)
            size += len(frames[0]) if len(frames) == 1 else sum(map(len, frames))
        return batch

    def _run(self) -> None:
        while True:
            self._wait_for_items()
            self._busy = True  # before items leave _pending: flush() must not miss them
            batch = self._take_batch()
            sizes, counts, body = pack_batch(batch)
            try:
                self.client.call("queue", "put_many", self.qid, sizes, counts, body=body)
            except BaseException as exc:  # the owner is gone: report it on the next call
                logger.error("could not deliver %d queued item(s): %s", len(batch), exc)
                with self._done:
                    self._error, self._busy = exc, False
                    self._done.notify_all()
                return
            with self._done:
                self._busy = False
                self._done.notify_all()


feeders: "weakref.WeakSet[Feeder]" = weakref.WeakSet()


_exit_flush = {"pid": None}


def _flush_at_exit() -> None:
    """Make this process flush its feeders among the stdlib's exit finalizers (once)."""
    if _exit_flush["pid"] != os.getpid():
        _exit_flush["pid"] = os.getpid()
        _mp_util.Finalize(None, flush_all, exitpriority=10)


def flush_all(timeout: float = 30.0) -> None:
    """At job exit: wait for every feeder of this process (unless cancelled)."""
    for feeder in list(feeders):
        if feeder.pid == os.getpid() and not feeder.cancelled:
            try:
                feeder.flush(timeout)
            except BaseException as exc:
                logger.warning("queue items lost at exit: %s", exc)
