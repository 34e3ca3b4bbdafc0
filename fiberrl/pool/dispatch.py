"""The pool's dispatcher: idle workers pull tasks; results come back and fill results.

It runs on the process's one I/O loop (:mod:`fiberrl._runtime.reactor`): the loop
reads the workers' streams and calls back here. Everything below is guarded by one
re-entrant lock; the loop takes it to handle a worker's messages, a caller's thread
takes it to queue tasks and hand them straight to a worker with room, which saves a
thread wake-up per call; the supervisor talks to it through
:meth:`Dispatcher.call_soon`::

    caller threads --submit--> inbox --> task queue --(credit)--> worker links
                                            ^   pending table <---'   |
                                            '-- re-queue (lost worker) |
    result objects <--------------- results <--------------------------'

Each worker link has *credit*: how many tasks it may hold. Tasks go only to links
with free credit, and credit comes back with results, so a worker gets work exactly
when it has room for it (an early worker cannot take everything). Credit is sized
from the measured cost of the call's tasks: about 5 ms of work per worker, plus one
task ahead while tasks are short, one task at a time while the cost is unknown, and
never more than a fair share of what is queued. A task re-queued after its worker
died is *suspect*: it goes alone to an empty worker (see :mod:`.pending`).

Deaths are declared by the supervisor thread (it knows the backend's reason); the
dispatcher only reports what it sees: a closed connection, or a worker silent for
``heartbeat_timeout`` (neither a message from it nor a heartbeat of its job's watch
stream, which the job watch of this process hears).
"""
from __future__ import annotations

import collections
import functools
import logging
import selectors
import threading
import time
from typing import Any, Callable, Dict, List, Optional

from .. import reduction
from ..errors import PoolTerminatedError, TaskRetryError
from .._runtime.liveness import job_watch
from .._runtime.runtime import runtime
from .._wire.stream import Channel
from .links import WorkerLink
from .pending import PendingTable
from .broadcast import Broadcast
from .rerun import Rerun
from .shared import DEFAULT_ARG_CACHE_BYTES, BufferTable, SharedBuffer
from .tasks import Task
from .wire import PoolChannel

logger = logging.getLogger(__name__)

BATCH_SECONDS = 0.005     # work handed to a worker at once, when tasks are short
MAX_BATCH = 512
PREFETCH_BELOW = 0.05     # tasks shorter than this get one more task queued behind them
TICK = 0.1


class Dispatcher:
    """Owns the task queue, the pending table and every worker link.

    Workers reach it through the process's one listener: their streams, labelled
    ``"pool:<name>"``, are handed over by the runtime's acceptor (:meth:`_adopt`).
    """

    def __init__(self, name: str, max_task_retries: int, heartbeat_timeout: float,
                 idle_timeout: Optional[float], supervisor_events: Any,
                 error_retries: int = 0) -> None:
        rt = runtime()
        self.acceptor = rt.acceptor
        self.label = f"pool:{name}"
        self.address = (rt.address, self.label)
        self.heartbeat_timeout = heartbeat_timeout
        self.idle_timeout = idle_timeout
        self.events = supervisor_events
        self.queue: "collections.deque[Task]" = collections.deque()
        self.suspects_queued = 0                   # suspect tasks in the queue
        self.pending = PendingTable(max_task_retries)
        self.error_retries = error_retries         # runs again of a task that raised
        self.error_reruns = 0                      # tasks run again after they raised
        self.links: Dict[int, WorkerLink] = {}
        self.expected: Dict[int, tuple] = {}       # worker id -> (token, maxtasks)
        self.job_tokens: Dict[int, str] = {}       # worker id -> its job's token
        self.jobs = job_watch()
        self.calls: Dict[int, Any] = {}            # live calls, for terminate
        self.hungry: "collections.deque[WorkerLink]" = collections.deque()
        self.target = 1
        self.completed = 0
        self.buffers: Optional[BufferTable] = None  # set by the pool: its argument cache
        self.arg_cache_bytes = DEFAULT_ARG_CACHE_BYTES
        self.payload_bytes_sent = 0
        self.cached_arg_sends = 0
        self.cached_arg_hits = 0
        self.broadcast = Broadcast(self._send_message, self._make_hungry)
        self.closing = False
        self._stopped = False
        self.reactor = rt.reactor
        self._streams: Dict[int, list] = {}        # fd -> [channel, link or None]
        self._done = threading.Event()             # set once every stream is closed
        self._started = False
        self.lock = threading.RLock()
        self.acceptor.route(self.label, self._adopt)

    # -- any thread --------------------------------------------------------------
    def start(self) -> None:
        """Start the dispatcher's clock (its streams are served as they arrive)."""
        self._started = True
        self.reactor.call_later(TICK, self._on_tick)

    def running(self) -> bool:
        """False once the dispatcher stopped (terminated, or failed)."""
        return not self._done.is_set()

    def wait_stopped(self, timeout: Optional[float] = None) -> bool:
        """Wait until the dispatcher stopped; False on timeout."""
        return self._done.wait(timeout)

    def call_soon(self, fn: Callable[[], Any]) -> None:
        """Run ``fn`` on the I/O loop under the lock, in submission order."""
        self.reactor.call_soon(functools.partial(self._guarded, fn))

    # -- on the loop -------------------------------------------------------------
    def _guarded(self, fn: Callable[[], Any]) -> None:
        """Run ``fn`` then dispatch, under the lock; a bug stops the pool, not the loop."""
        if self._done.is_set():
            return
        with self.lock:
            try:
                fn()
                self._dispatch()
            except Exception:
                logger.exception("the pool's dispatcher failed; the pool stops")
                self._stopped = True
                self._abort_all(PoolTerminatedError("the pool's dispatcher failed; see the log"))
                self.events.put(("terminate", 0, None))
                self._close_sockets()

    def _on_tick(self) -> None:
        if self._stopped:
            self._guarded(self._close_sockets)
            return
        self._guarded(self._tick)
        if not self._done.is_set():
            self.reactor.call_later(TICK, self._on_tick)

    def _register(self, data: list) -> None:
        fd = data[0].fileno()
        self._streams[fd] = data
        self.reactor.add_reader(fd, functools.partial(self._on_io, data, selectors.EVENT_READ))

    def _on_io(self, data: list, mask: int) -> None:
        self._guarded(functools.partial(self._on_event, data, mask))

    def _adopt(self, label: str, sock: Any, send_key: bytes, recv_key: bytes,
               leftover: bytes) -> bool:
        """A worker's authenticated stream, from the runtime's acceptor (its loop)."""
        with self.lock:
            if self._stopped:
                return False
            data = [PoolChannel(Channel(sock, send_key, recv_key, leftover)), None]
            self._register(data)
        if leftover:  # the worker's first messages came with its hello
            self._on_io(data, selectors.EVENT_READ)
        return True

    def submit(self, call: Any, tasks: List[Task], last: bool) -> None:
        """Queue ``tasks`` of ``call`` and dispatch what can go now; ``last`` says the
        call has no more."""
        with self.lock:
            self._enqueue(call, tasks, last)
            self._dispatch()

    # -- I/O thread --------------------------------------------------------------
    def _enqueue(self, call: Any, tasks: List[Task], last: bool) -> None:
        if self._stopped:
            call._abort(PoolTerminatedError("the pool was terminated"))
            return
        self.calls.setdefault(id(call), call)
        call._tasks_added(len(tasks))
        self.queue.extend(tasks)
        if last:
            call._all_submitted()
            self._forget_if_done(call)

    def _forget_if_done(self, call: Any) -> None:
        if call._released:
            self.calls.pop(id(call), None)

    def forget_function(self, entry: Any) -> None:
        """No call uses ``entry`` any more: workers may drop it (any thread)."""
        with self.lock:
            for link in self.links.values():
                if entry.id in link.known:
                    link.known.discard(entry.id)
                    link.drops.append(entry.id)

    def forget_buffer(self, entry: SharedBuffer) -> None:
        """No task uses ``entry`` any more: its holders drop it (any thread)."""
        with self.lock:
            for cache in list(entry.holders):
                cache.forget(entry)

    def _on_event(self, data: list, mask: int) -> None:
        channel = data[0]
        if channel.fileno() not in self._streams:
            return   # closed meanwhile
        try:
            if mask & selectors.EVENT_WRITE:
                channel.on_writable()
            if mask & selectors.EVENT_READ:
                for header, buffers in channel.on_readable():
                    self._on_message(data, header, buffers)
            self._watch_writes(channel, data)
        except ConnectionError as exc:
            self._connection_lost(data, str(exc))

    def _watch_writes(self, channel: PoolChannel, data: list) -> None:
        # (safe from any thread: epoll_ctl is thread-safe, and the loop's tables are dicts)
        writer = (functools.partial(self._on_io, data, selectors.EVENT_WRITE)
                  if channel.wants_write else None)   # (the common case: all was written)
        self.reactor.set_writer(channel.fileno(), writer)

    def _unregister(self, channel: PoolChannel) -> None:
        fd = channel.fileno()
        if self._streams.pop(fd, None) is not None:
            self.reactor.remove(fd)

    def _connection_lost(self, data: list, why: str) -> None:
        channel, link = data
        self._unregister(channel)
        channel.close()
        if link is not None and not link.dead:
            link.dead = True
            self.events.put(("disconnected", link.id, why))

    def _on_message(self, data: list, header: tuple, buffers: list) -> None:
        link: Optional[WorkerLink] = data[1]
        kind = header[0]
        if link is None:
            self._identify(data, header)
            return
        link.last_seen = time.monotonic()
        if kind == "results":
            self._on_results(link, header[1], buffers)
            if header[2] is not None:
                self._on_run(link, *header[2])
            if self.pending.held_by(link.id) == 0:
                link.solo = False
                link.idle_since = time.monotonic()
            self._make_hungry(link)
        elif kind == "need":
            self.payload_bytes_sent += self.broadcast.need(link, header[1])
        elif kind == "have":
            self.broadcast.have(link, header[1])
        elif kind == "bye":
            link.retiring = True

    def _identify(self, data: list, header: tuple) -> None:
        kind = header[0]
        if kind not in ("hello", "init_failed") or self.expected.get(header[1], (None,))[0] != header[2]:
            raise ConnectionError(f"unexpected first message {kind!r} from a pool worker")
        worker_id = header[1]
        token, maxtasks = self.expected.pop(worker_id)
        if kind == "init_failed":
            self.events.put(("init_failed", worker_id, header[3]))
            raise ConnectionError("initializer failed")
        _, _, _, pid, host, opened_probe = header
        link = WorkerLink(worker_id, data[0], pid, host, maxtasks, self.arg_cache_bytes,
                          *self.broadcast.roles(host, opened_probe))
        link.job_token = self.job_tokens.pop(worker_id, None)
        data[1] = link
        self.links[worker_id] = link
        self.events.put(("hello", worker_id, pid))
        self._make_hungry(link)

    def _on_results(self, link: WorkerLink, results: list, buffers: list) -> None:
        position = 0
        complete, link_id, cache, table = self.pending.complete, link.id, link.cache, self.buffers
        resilient = self.error_retries > 0
        call, group = None, []   # consecutive results of one call are finished together
        for task_id, ok, stream, count, seconds in results:
            if count >= 0:
                frames = [stream, *buffers[position:position + count]]
                position += count
            task = complete(task_id, link_id)
            if task is None:
                continue  # a late duplicate of a task that was re-queued
            if cache.by_task:
                cache.unpin(task_id)
            if count < 0:
                value = stream   # a scalar result, or a list of them, sent as itself
            else:
                try:
                    value = reduction.loads(frames)
                except Exception as exc:  # e.g. an exception class that needs other arguments
                    from multiprocessing.pool import MaybeEncodingError
                    ok, value = False, MaybeEncodingError(exc, f"<result of {task.describe()}>")
            if resilient and (not ok or task.rerun is not None):
                outcome = Rerun.after(task, ok, value, self.error_retries)
                if outcome is None:   # it raised: it runs again (see .rerun)
                    self._run_again(task)
                    continue
                ok, value = outcome
            if table is not None and len(task.frames) > 1:   # one frame: nothing shared
                table.release(task.frames)
            if task.call is not call:
                if group:
                    self._finish_tasks(call, group)
                call, group = task.call, []
            group.append((task, ok, value, seconds))
        if group:
            self._finish_tasks(call, group)

    def _run_again(self, task: Task) -> None:
        """Queue ``task``, which raised, at the front (``error_handling``)."""
        task.suspect = False   # it returned: its worker is not in question
        self.queue.appendleft(task)
        self.error_reruns += 1

    def _on_run(self, link: WorkerLink, task_ids: list, values: list, seconds: float) -> None:
        """Results of a run of map tasks (see :mod:`.worker`): each value fills one item."""
        complete, link_id = self.pending.complete, link.id
        mean = seconds / max(1, len(task_ids))
        call, tasks, got = None, [], []
        for task_id, value in zip(task_ids, values):
            task = complete(task_id, link_id)
            if task is None:
                continue  # a late duplicate of a task that was re-queued
            if task.call is not call:
                if tasks:
                    self._finish_run(call, tasks, got, mean)
                call, tasks, got = task.call, [], []
            tasks.append(task)
            got.append(value)
        if tasks:
            self._finish_run(call, tasks, got, mean)

    def _finish_run(self, call: Any, tasks: list, values: list, mean: float) -> None:
        self.completed += len(tasks)
        try:
            call._run_done(tasks, values, mean)
        except Exception:  # a bug; user code (callbacks, progress sinks) is guarded inside
            logger.exception("finishing tasks of %s failed", tasks[0].describe())
        self._forget_if_done(call)

    def _finish_tasks(self, call: Any, done: list) -> None:
        """Finish ``(task, ok, value, seconds)`` of ``call``, whose shared buffers are released."""
        self.completed += len(done)
        try:
            call._tasks_done(done)
        except Exception:  # a bug; user code (callbacks, progress sinks) is guarded inside
            logger.exception("finishing tasks of %s failed", done[0][0].describe())
        self._forget_if_done(call)

    def _finish_task(self, task: Task, ok: bool, value: Any, seconds: float) -> None:
        if self.buffers is not None and len(task.frames) > 1:   # one frame: nothing shared
            self.buffers.release(task.frames)
        try:
            task.call._task_done(task, ok, value, seconds)
        except Exception:  # user code runs in there (callbacks, progress sinks)
            logger.exception("finishing %s failed", task.describe())
        self._forget_if_done(task.call)

    def _make_hungry(self, link: WorkerLink) -> None:
        if not link.hungry and not link.dead:
            link.hungry = True
            self.hungry.append(link)

    # -- dispatch ------------------------------------------------------------------
    def _free_credit(self, link: WorkerLink, head: Task) -> int:
        held = self.pending.held_by(link.id)
        if link.dead or link.retiring or (link.solo and held):
            return 0
        if head.suspect:
            return 1 if held == 0 else 0
        mean = head.call.mean_duration
        if mean is None:
            capacity = 1
        else:
            capacity = max(1, min(MAX_BATCH, int(BATCH_SECONDS / max(mean, 1e-7))))
            if mean < PREFETCH_BELOW:
                capacity += 1
        free = capacity - held
        if link.quota_left is not None:
            free = min(free, link.quota_left)
        return free

    def _dispatch(self) -> None:
        queue, hungry = self.queue, self.hungry
        rounds = len(hungry)
        while queue and hungry and rounds > 0:
            rounds -= 1
            link = hungry.popleft()
            link.hungry = False
            free = self._free_credit(link, queue[0])
            if free > 0 and self.broadcast.defer(link, queue[0]):
                continue   # until its host's relay has the bytes
            if free <= 0:
                if not link.dead and not link.retiring and queue[0].suspect:
                    self._make_hungry(link)  # may take a normal task once the suspect is placed
                continue
            fair = -(-len(queue) // max(1, self.target))
            if self.suspects_queued == 0:   # the common case: take the batch at once
                popleft = queue.popleft
                batch = [popleft() for _ in range(min(free, fair, len(queue)))]
            else:
                batch = [queue.popleft()]
                if batch[0].suspect:
                    self.suspects_queued -= 1
                else:
                    limit = min(free, fair)
                    while queue and len(batch) < limit and not queue[0].suspect:
                        batch.append(queue.popleft())
            self._send(link, batch)
            if queue and self._free_credit(link, queue[0]) > 0:
                self._make_hungry(link)
                rounds += 1

    def _send(self, link: WorkerLink, batch: List[Task]) -> None:
        header, buffers, sends, hits, mapped = link.task_message(batch)
        self.cached_arg_sends += sends
        self.cached_arg_hits += hits
        self.broadcast.maps += mapped
        self.pending.assign_all(batch, link.id)
        if link.quota_left is not None:
            link.quota_left -= len(batch)
            if link.quota_left <= 0:
                link.retiring = True
                self.events.put(("retiring", link.id, "maxtasksperchild reached"))
        self.payload_bytes_sent += self._send_message(link, header, buffers)

    def _send_message(self, link: WorkerLink, header: tuple, buffers: List[Any]) -> int:
        """Send one message to ``link``; its size in bytes (0 if the worker is gone)."""
        try:
            size = link.channel.send(header, buffers)
            self._watch_writes(link.channel, self._streams.get(link.channel.fileno(),
                                                               [link.channel, link]))
            return size
        except (ConnectionError, KeyError) as exc:
            self._connection_lost([link.channel, link], str(exc))
            return 0

    # -- supervision (called by the supervisor through call_soon) -----------------
    def expect(self, worker_id: int, token: str, maxtasks: Optional[int]) -> None:
        """A worker is starting: accept its hello."""
        self.expected[worker_id] = (token, maxtasks)

    def job_started(self, worker_id: int, job_token: str) -> None:
        """The job of ``worker_id`` was started with ``job_token`` (its heartbeats)."""
        link = self.links.get(worker_id)
        if link is not None:
            link.job_token = job_token
        elif worker_id in self.expected:
            self.job_tokens[worker_id] = job_token

    def _silence(self, link: WorkerLink, now: float) -> float:
        """Seconds since the worker was last heard: a message, or its job's heartbeat."""
        silent = now - link.last_seen
        if link.job_token is not None:
            heartbeat = self.jobs.silence(link.job_token)
            if heartbeat is not None:
                silent = min(silent, heartbeat)
        return silent

    def worker_lost(self, worker_id: int, how: str, unexpected: bool) -> None:
        """The supervisor declared ``worker_id`` gone: take its tasks back."""
        self.expected.pop(worker_id, None)
        self.job_tokens.pop(worker_id, None)
        link = self.links.pop(worker_id, None)
        if link is not None:
            link.dead = True
            self._unregister(link.channel)
            link.channel.close()
            link.cache.close()   # (and it is no relay any more: those waiting go on)
            self.broadcast.wake_deferred()
        requeue, exhausted = self.pending.worker_lost(worker_id, how)
        if requeue:
            logger.log(logging.WARNING if unexpected else logging.INFO,
                       "pool worker %d %s (%s): re-running %d task(s)", worker_id,
                       "lost" if unexpected else "gone", how, len(requeue))
        self.queue.extendleft(reversed(requeue))
        self.suspects_queued += len(requeue)   # every re-queued task is suspect
        for task in exhausted:
            error = TaskRetryError(task.describe(), task.deaths)
            logger.error("%s", error)
            self._finish_task(task, False, error, -1.0)

    def retire(self, worker_id: int) -> None:
        """Give ``worker_id`` no more tasks and stop it once it holds none."""
        link = self.links.get(worker_id)
        if link is not None:
            link.retiring = True

    def fail_queued(self, error: BaseException) -> None:
        """Fail every queued task with ``error`` (workers cannot start)."""
        while self.queue:
            self._finish_task(self.queue.popleft(), False, error, -1.0)
        self.suspects_queued = 0

    def _tick(self) -> None:
        now = time.monotonic()
        self.broadcast.wake_deferred()   # (a relay that never says "have" is not waited for)
        idle_release = self.idle_timeout is not None and not self.queue
        for link in list(self.links.values()):
            if link.dead:
                continue
            held = self.pending.held_by(link.id)
            if link.cache.drops and not link.stop_sent:  # freed entries, to an idle worker
                drops, link.cache.drops = link.cache.drops, []
                self._send_message(link, ("tasks", [], [], [], False, [], drops, []), [])
            silent = self._silence(link, now)
            if silent > self.heartbeat_timeout:
                link.dead = True
                self.events.put(("unresponsive", link.id, f"no heartbeat for {silent:.1f} s"))
            elif link.retiring and held == 0:
                self._stop_link(link)
            elif (idle_release and held == 0 and not link.retiring
                  and now - link.idle_since > self.idle_timeout):
                link.retiring = True
                self.events.put(("released", link.id, "idle"))
                self._stop_link(link)
            elif held == 0 and self.closing and self.drained():
                self._stop_link(link)
        if self.closing and self.drained():
            self.events.put(("drained", 0, ""))

    def _stop_link(self, link: WorkerLink) -> None:
        if link.stop_sent:
            return
        link.stop_sent = True
        try:
            link.channel.send(("stop",))
        except ConnectionError:
            pass

    def drained(self) -> bool:
        """No task queued, pending or still to be submitted."""
        return not self.queue and not len(self.pending) and not self.calls

    def has_work(self) -> bool:
        """Racy but safe read for the supervisor: is anything queued or running?"""
        return bool(self.queue) or len(self.pending) > 0

    def _abort_all(self, error: BaseException) -> None:
        self.queue.clear()
        self.suspects_queued = 0
        self.pending.drain()
        calls, self.calls = list(self.calls.values()), {}
        for call in calls:
            call._abort(error)

    def terminate(self) -> None:
        """Fail every outstanding result and close every worker stream (on the loop)."""
        self._abort_all(PoolTerminatedError("the pool was terminated before this result was ready"))
        self._stopped = True
        self._close_sockets()

    def _close_sockets(self) -> None:
        if self._done.is_set():
            return
        for data in list(self._streams.values()):
            self._unregister(data[0])
            data[0].close()
        self.broadcast.close()
        self.acceptor.unroute(self.label)
        self._done.set()

    def stop(self) -> None:
        """Stop the dispatcher from any thread and wait for it (not on the loop itself)."""
        self.call_soon(self.terminate)
        if not self.reactor.in_loop():
            self._done.wait(10.0)
