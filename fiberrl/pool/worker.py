"""The loop inside each pool worker job.

A worker is an ordinary :class:`fiberrl.Process` whose target is :func:`run_worker`.
It connects to its pool (:mod:`fiberrl.pool.wire`), runs the initializer,
says hello, then runs the tasks it is handed, in order, and sends results back in
batches: a batch leaves when the worker has nothing left to run, after a
millisecond, or at once for a task the pool marked *suspect* (its previous worker
died), so that the pool knows exactly which task a crash belongs to. The job's watch
over its parent (:mod:`fiberrl._runtime.liveness`) proves the worker is alive while a
long task runs: its heartbeats go to the pool's process at the pool's interval.

A task's ``layout`` says, for each of its out-of-band buffers, whether it is the next
inline frame (None) or an entry of the worker's argument cache (its key): entries
arrive once (see :mod:`fiberrl.pool.shared`), each as ``(key, reference)``: a
reference to a host segment to map (see :mod:`fiberrl.pool.segments`), or None for
bytes that follow as the frames after the functions' (False: the pool has no such
entry, a bug reported by the tasks that use it). An entry whose segment cannot be
mapped is asked for again with ``"need"``, and the tasks using it wait for its bytes.
A large entry that came as bytes is kept in a segment of this worker's own, and
``"have"`` tells the pool where, at once: on a host other than the pool's, the other
workers of this host then map it instead of receiving the bytes too (this worker is
its host's relay).

Messages (headers; pickle streams are bytes inside the header, large buffers follow)::

    pool -> worker  ("tasks", [(func_id, stream, n_buffers)], [dropped func ids],
                     [(task_id, func_id, mode, stream, layout)], flush_each,
                     [added cache keys], [dropped cache keys],
                     [(func_id, [task_id], [item])])
                    ("stop",)
    worker -> pool  ("hello", worker_id, token, pid, host, maps host segments?)
                    ("need", [cache key])
                    ("have", [(cache key, fd, size, tag) or (cache key, None, 0, b"")])
                    ("init_failed", worker_id, token, traceback_text)
                    ("results", [(task_id, ok, stream, n_buffers, seconds)],
                     ([task_id], [value], seconds) or None)
                    ("bye",)

A task's ``mode`` is ``(mode, [offsets])`` when only those items of its chunk are to
run again (a pool with ``error_handling``, whose workers run every item of a chunk
even when one raises and report the chunk's failures as a :class:`~.rerun.ChunkErrors`).
A task's ``stream`` is a tuple of scalars, its chunk itself, for a map over plain
scalars; a result's ``stream`` with ``n_buffers`` -1 is the result itself, a scalar or
a list of scalars. The last field of each is a *run*, for the common ``map(f, numbers,
chunksize=1)``: map tasks of one scalar item each, and their scalar results, in columns
(one Python object per task, not four; ``seconds`` is the run's total).
"""
from __future__ import annotations

import collections
import logging
import os
import socket
import time
import traceback
from multiprocessing.pool import ExceptionWithTraceback, MaybeEncodingError
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from .. import reduction
from ..errors import TaskDeserializationError
from .rerun import ChunkErrors
from .segments import SEGMENT_MIN_BYTES, Segment, can_attach
from .tasks import APPLY, INLINE_MAX, ITEM_ATTRIBUTE, MAP, SCALAR_TYPES, all_scalars
from .wire import WorkerConnection
from .._runtime import interrupts
from .._runtime.liveness import parent_watch

logger = logging.getLogger(__name__)

#: a worker's exit status after Ctrl-C (128 + SIGINT, as a shell reports it): it exits
#: quietly, and the pool logs it as interrupted, not lost (a job interrupted while
#: starting exits with the same status)
INTERRUPTED_EXIT = interrupts.INTERRUPTED_EXIT
_FLUSH_AFTER = 0.001   # seconds a finished result may wait for company
_FLUSH_COUNT = 256


def _take(buffers: List[memoryview], start: int, count: int) -> List[Any]:
    return buffers[start:start + count]


_current: Optional["Worker"] = None  # the worker running in this process, if any


def cached_arg_bytes() -> int:
    """Bytes of shared large arguments this pool worker holds (0 outside a pool worker)."""
    worker = _current
    return sum(len(data) for data in worker.cache.values()) if worker is not None else 0


#: this process's receipts of shared large arguments: bytes that came through its
#: stream (copied), entries mapped from another process's host segment (no copy)
ARG_COUNTERS = {"received_bytes": 0, "mapped": 0}


def cached_arg_segments() -> Dict[int, int]:
    """The host segments this pool worker holds: cache key -> inode (the same inode in
    every process that maps the segment)."""
    worker = _current
    if worker is None:
        return {}
    return {key: data.inode() for key, data in worker.cache.items() if isinstance(data, Segment)}


def _load_arguments(frames: List[Any]) -> Tuple[bool, Any]:
    """``(True, arguments)`` of a task, or ``(False, the error)`` if they do not unpickle."""
    try:
        # a chunk of scalars, or an apply of scalars, came as itself in the header (tasks.Task)
        return True, frames[0] if type(frames[0]) is tuple else reduction.loads(frames)
    except BaseException as exc:  # noqa: BLE001 - reported to the caller
        return False, TaskDeserializationError(
            f"could not unpickle the task's arguments in the worker: {type(exc).__name__}: {exc}",
            traceback.format_exc())


def _execute(func: Any, mode: int, frames: List[Any]) -> Tuple[bool, Any]:
    loaded, args = _load_arguments(frames)
    if not loaded:
        return False, args
    results: List[Any] = []
    try:
        if mode == APPLY:
            return True, func(*args[0], **args[1])
        append = results.append
        if mode == MAP:
            for item in args:
                append(func(item))
        else:
            for item in args:
                append(func(*item))
        return True, results
    except Exception as exc:
        if mode != APPLY:
            exc.__dict__[ITEM_ATTRIBUTE] = len(results)  # the pool names the item's index
        return False, ExceptionWithTraceback(exc, exc.__traceback__)


def _execute_every_item(func: Any, mode: Any, frames: List[Any]) -> Tuple[bool, Any]:
    """:func:`_execute` for a pool with ``error_handling``: an item of a map chunk that
    raises does not stop the others, and the chunk's failure is a
    :class:`~.rerun.ChunkErrors`. ``mode`` may be ``(mode, offsets)``: run only the
    items at those offsets (the others succeeded in an earlier run)."""
    offsets = None
    if type(mode) is tuple:
        mode, offsets = mode
    if mode == APPLY:
        return _execute(func, mode, frames)
    loaded, args = _load_arguments(frames)
    if not loaded:
        return False, args
    if offsets is None:
        offsets = range(len(args))
    values: List[Any] = []
    errors = {}
    for offset in offsets:
        try:
            values.append(func(args[offset]) if mode == MAP else func(*args[offset]))
        except Exception as exc:
            exc.__dict__[ITEM_ATTRIBUTE] = offset   # the pool names the item's index
            errors[offset] = ExceptionWithTraceback(exc, exc.__traceback__)
            values.append(None)
    if errors:
        return False, ChunkErrors(list(offsets), values, errors)
    return True, values


def _inline(mode: int, value: Any) -> bool:
    """True for a result that can travel as itself in the header: scalars, or a map
    chunk's short list of scalars (nothing there can fail to pickle or to unpickle)."""
    if mode == APPLY:
        return type(value) in SCALAR_TYPES
    return type(value) is list and len(value) <= INLINE_MAX and all_scalars(value)


def _encode_result(ok: bool, value: Any) -> Tuple[bool, List[Any]]:
    try:
        return ok, reduction.dumps_data(value)
    except Exception as exc:
        shown = value.exc if isinstance(value, ExceptionWithTraceback) else value
        return False, reduction.dumps(MaybeEncodingError(exc, shown))


class Worker:
    """State of one worker: its connection, known functions, queued tasks, results."""

    def __init__(self, conn: WorkerConnection, worker_id: int, maxtasks: Optional[int],
                 error_handling: bool = False) -> None:
        self.conn = conn
        self.worker_id = worker_id
        self.maxtasks = maxtasks
        self.execute = _execute_every_item if error_handling else _execute
        self.functions: Dict[int, Any] = {}
        self.cache: Dict[int, Any] = {}   # shared large arguments, by key: bytes or Segment
        self.awaited: set = set()         # keys asked for again ("need"), bytes to come
        self.queue: "collections.deque" = collections.deque()
        self.results: List[tuple] = []
        self.buffers: List[Any] = []
        self.run_ids: List[int] = []       # results of a run: scalars, in one column
        self.run_values: List[Any] = []
        self.run_seconds = 0.0
        self.flush_each = False
        self.done = 0
        self.last_flush = time.monotonic()

    def flush(self) -> None:
        if self.results or self.run_ids:
            results, buffers = self.results, self.buffers
            run = (self.run_ids, self.run_values, self.run_seconds) if self.run_ids else None
            self.results, self.buffers, self.run_ids, self.run_values = [], [], [], []
            self.run_seconds = 0.0
            self.conn.send(("results", results, run), buffers)
        self.last_flush = time.monotonic()

    def _flush_due(self) -> bool:
        return (self.flush_each or len(self.results) + len(self.run_ids) >= _FLUSH_COUNT
                or time.monotonic() - self.last_flush >= _FLUSH_AFTER)

    def receive(self, header: tuple, buffers: List[memoryview]) -> bool:
        """Take one message from the pool; False when told to stop."""
        kind = header[0]
        if kind == "stop":
            return False
        if kind != "tasks":
            logger.warning("unexpected message %r from the pool", kind)
            return True
        _, funcs, dropped, tasks, self.flush_each, cache_adds, cache_drops, runs = header
        position = 0
        for func_id, stream, count in funcs:
            frames = [stream, *_take(buffers, position, count)]
            position += count
            try:
                func = reduction.loads(frames)
                self.functions[func_id] = func
            except BaseException as exc:  # noqa: BLE001 - every task using it reports it
                self.functions[func_id] = TaskDeserializationError(
                    f"could not unpickle the task's function in the worker: "
                    f"{type(exc).__name__}: {exc}", traceback.format_exc())
        for func_id in dropped:
            self.functions.pop(func_id, None)
        for key in cache_drops:
            self._drop(key)
        needed, made = [], []
        for key, ref in cache_adds:
            if ref is None:
                made.extend(self._store(key, buffers[position]))
                position += 1
            elif ref is False:
                self.awaited.discard(key)   # never coming: the tasks using it report it
            else:
                try:
                    self._drop(key)
                    self.cache[key] = Segment.attach(ref)
                    ARG_COUNTERS["mapped"] += 1
                except OSError as exc:
                    logger.info("could not map shared argument #%d (%s); asking for its bytes",
                                key, exc)
                    needed.append(key)
        if needed:
            self.awaited.update(needed)
            self.conn.send(("need", needed))
        if made:
            self.conn.send(("have", made))
        for task_id, func_id, mode, stream, layout in tasks:
            frames = [stream]
            for key in layout:  # cached entries are looked up when the task runs
                if key is None:
                    frames.append(buffers[position])
                    position += 1
                else:
                    frames.append(key)
            self.queue.append((task_id, func_id, mode, frames))
        self.queue.extend(runs)   # (func_id, task ids, items): map tasks of one scalar each
        return True

    def _store(self, key: int, frame: Any) -> List[tuple]:
        """Keep an entry that came as bytes: a copy (the frame is a view of the whole
        message), in a segment of its own when large, so tasks map it instead of copying;
        ``[(key, where the segment is)]`` for a large one (``(key, None, 0, b"")`` if no
        segment could be made), else ``[]``."""
        self._drop(key)
        data = None
        if frame.nbytes >= SEGMENT_MIN_BYTES:
            try:
                data = Segment.from_bytes(frame)
            except OSError:
                pass
        self.cache[key] = bytes(frame) if data is None else data
        self.awaited.discard(key)
        ARG_COUNTERS["received_bytes"] += frame.nbytes
        if frame.nbytes < SEGMENT_MIN_BYTES:
            return []
        return [(key, data.fd, data.size, data.tag) if data is not None else (key, None, 0, b"")]

    def _drop(self, key: int) -> None:
        data = self.cache.pop(key, None)
        if isinstance(data, Segment):
            data.close()   # the mappings tasks still use stay valid

    def _await(self, frames: List[Any]) -> bool:
        """Read messages until the entries ``frames`` use that were asked for again have
        come; False if the pool told this worker to stop meanwhile."""
        while any(type(frame) is int and frame in self.awaited for frame in frames[1:]):
            try:
                message = self.conn.recv()
            except EOFError:
                return False
            if not self.receive(*message):
                return False
        return True

    def _resolve(self, frames: List[Any]) -> List[Any]:
        """The task's frames with cached entries as private, writable copies (a segment:
        a copy-on-write mapping, the previous task's again if it wrote nothing and kept
        nothing of it; bytes: a copy)."""
        if len(frames) == 1 or all(type(frame) is not int for frame in frames[1:]):
            return frames
        cache, resolved = self.cache, [frames[0]]
        for frame in frames[1:]:
            if type(frame) is int:
                data = cache[frame]
                frame = (data.lend() if isinstance(data, Segment)
                         else memoryview(bytearray(data)))
            resolved.append(frame)
        return resolved

    def run_map_run(self, func_id: int, task_ids: List[int], items: List[Any]) -> None:
        """Run map tasks of one scalar item each: the common ``map(f, numbers)`` with
        ``chunksize=1``, with a Python call per task only to ``func``."""
        func = self.functions.get(func_id)
        if func is None or isinstance(func, BaseException):
            for task_id, item in zip(task_ids, items):
                self.run_one((task_id, func_id, MAP, [(item,)]))   # it reports the error
            return
        clock, ids, values, scalar = time.perf_counter, self.run_ids, self.run_values, SCALAR_TYPES
        for task_id, item in zip(task_ids, items):
            started = clock()
            try:
                value = func(item)
            except Exception as exc:
                exc.__dict__[ITEM_ATTRIBUTE] = 0   # the pool names the item
                self._add_result(task_id, False, ExceptionWithTraceback(exc, exc.__traceback__),
                                 MAP, clock() - started)
            else:
                if type(value) in scalar:
                    ids.append(task_id)
                    values.append(value)
                    self.run_seconds += clock() - started
                else:
                    self._add_result(task_id, True, [value], MAP, clock() - started)
            self.done += 1
            if self._flush_due():
                self.flush()
                ids, values = self.run_ids, self.run_values

    def _add_result(self, task_id: int, ok: bool, value: Any, mode: int, seconds: float) -> None:
        if ok and _inline(mode, value):
            self.results.append((task_id, True, value, -1, seconds))  # -1: the value itself
        else:
            ok, out = _encode_result(ok, value)
            self.results.append((task_id, ok, bytes(out[0]), len(out) - 1, seconds))
            self.buffers.extend(out[1:])

    def run_one(self, entry: tuple) -> None:
        task_id, func_id, mode, frames = entry
        func = self.functions.get(func_id)
        started = time.perf_counter()
        if isinstance(func, BaseException) or func is None:
            ok, value = False, func or TaskDeserializationError(
                f"the pool sent no function {func_id}", "")
        else:
            try:
                if self.awaited and not self._await(frames):
                    raise EOFError("the pool stopped this worker")
                frames = self._resolve(frames)
            except KeyError as exc:
                ok, value = False, TaskDeserializationError(
                    f"the pool sent no cached argument {exc}", "")
            else:
                ok, value = self.execute(func, mode, frames)
        self._add_result(task_id, ok, value, mode, time.perf_counter() - started)
        self.done += 1
        if self._flush_due():
            self.flush()

    def serve(self) -> None:
        while True:
            if not self.queue:
                self.flush()
                if self.maxtasks is not None and self.done >= self.maxtasks:
                    return
                try:
                    message = self.conn.recv()
                except EOFError:
                    logger.info("pool connection closed; worker %d exits", self.worker_id)
                    return
                if not self.receive(*message):
                    return
                continue
            entry = self.queue.popleft()
            if len(entry) == 3:
                self.run_map_run(*entry)
            else:
                self.run_one(entry)


def run_worker(address: tuple, worker_id: int, token: str, initializer: Optional[Callable[..., Any]],
               initargs: Sequence[Any], maxtasks: Optional[int], heartbeat_interval: float,
               error_handling: bool = False, host_probe: Optional[tuple] = None) -> None:
    """Entry point of a pool worker job (the target of its :class:`fiberrl.Process`);
    ``host_probe`` references the pool process's probe segment (see :mod:`.segments`).

    A Ctrl-C reaches the whole process group, so every worker gets it with its
    master: wherever it finds the worker, from its first connection to its goodbye,
    the worker ends quietly (no traceback per worker) with the shell's status for it.
    """
    try:
        _serve_pool(address, worker_id, token, initializer, initargs, maxtasks,
                    heartbeat_interval, error_handling, host_probe)
    except KeyboardInterrupt:
        logger.info("worker %d interrupted", worker_id)
        raise SystemExit(INTERRUPTED_EXIT) from None


def _serve_pool(address: tuple, worker_id: int, token: str,
                initializer: Optional[Callable[..., Any]], initargs: Sequence[Any],
                maxtasks: Optional[int], heartbeat_interval: float, error_handling: bool,
                host_probe: Optional[tuple]) -> None:
    conn = WorkerConnection(*address)
    maps = can_attach(host_probe)
    watch = parent_watch()   # the job's one liveness stream, to the pool's process
    if watch is not None:
        watch.set_interval(heartbeat_interval)   # as often as this pool needs to hear
    worker = Worker(conn, worker_id, maxtasks, error_handling)
    global _current
    _current = worker
    try:
        if initializer is not None:
            try:
                initializer(*initargs)
            except BaseException:  # noqa: BLE001 - the pool reports it
                conn.send(("init_failed", worker_id, token, traceback.format_exc()))
                raise
        conn.send(("hello", worker_id, token, os.getpid(), socket.gethostname(), maps))
        worker.serve()
        worker.flush()
        conn.send(("bye",))
    except (OSError, EOFError) as exc:
        logger.info("worker %d lost its pool: %s", worker_id, exc)
    finally:
        conn.close()
