"""Liveness: how a process learns that a job, a peer or a host is gone. One mechanism.

Every job holds a *watch stream* to its parent's runtime (label ``"watch:<token>"``)
and sends a heartbeat on it every ``heartbeat_interval`` seconds. That one stream
answers every question:

* **the parent, about its jobs** (:class:`JobWatch`): a backend that hears of its
  jobs' ends says so at once (the local fork server reports each exit; no descriptor
  per job), a job on this host that no backend reports on is watched by its pid (a
  ``pidfd`` on the I/O loop), and a job elsewhere is polled through its backend by one
  thread, at once when its watch stream ends and otherwise every
  :data:`POLL_INTERVAL` seconds; a job that stops sending heartbeats
  (stopped, hung in C code, its host cut off) is reported by :meth:`JobWatch.silence`.
  A job elsewhere whose stream ended and who opened no other for ``lost_after``
  seconds has ended, whatever its backend still says (a Slurm job stuck
  *completing* on a dead node, a pod on a lost node): cut off from its parent, it
  exits by then of its own accord (below), so nobody waits for it any longer.
  Whoever cares subscribes with :meth:`JobWatch.on_end` (queue brokers requeue what
  was in flight to the job, the pipe rendezvous drops its copies, a pool replaces a
  worker) instead of polling;
* **the job's start and end**: the stream's first message is the job's hello
  (``H``: its pid and host), answered with what it runs (``P``, handed out by whoever
  :meth:`JobWatch.serve_jobs`: the spawn service; ``E`` with a reason when refused),
  and its last one reports its exit code (``X``); so a job's one stream to its parent
  is this one, whatever else it opens later;
* **the job, about its parent** (:class:`ParentWatch`): the stream ending, or a
  heartbeat that cannot be written, means the parent may be gone; if no new stream
  can be opened for ``parent_grace`` seconds, ``parent_process().is_alive()`` turns
  False and the job exits ``parent_grace`` seconds later (no orphans);
* **hosts**: every TCP stream has keepalive probes tuned to the same heartbeat
  settings (:func:`fiberrl._wire.sockets.tune`), so a host that vanishes without a
  word ends its streams.
"""
from __future__ import annotations

import collections
import functools
import logging
import os
import pickle
import select
import threading
import time
import weakref
from typing import Any, Callable, Dict, List, Optional, Tuple

from .._wire.sockets import Address
from .._wire.stream import open_stream
from .link import Link
from .rpc import pack_body, unpack_body
from .runtime import Runtime, service

logger = logging.getLogger(__name__)

POLL_INTERVAL = 0.2
REMEMBERED = 4096
_HEARTBEAT = b"h"
_HELLO, _PAYLOAD, _REFUSED, _EXIT = b"H", b"P", b"E", b"X"
#: ``(token, pid, host) -> (prep, frames)``: what a job that said hello runs
Greeter = Callable[[str, int, str], Tuple[Any, List[Any]]]


class _Watched:
    __slots__ = ("popen", "polled", "last_heard", "link", "ended", "sentinel", "lost_after",
                 "given_up")

    def __init__(self, popen: Any, lost_after: Optional[float]) -> None:
        self.popen = weakref.ref(popen)
        self.lost_after = lost_after
        self.given_up = False   # declared lost (its end is on its way to the loop)
        self.polled = not popen.backend.shares_host   # its backend is asked, by a thread
        self.last_heard: Optional[float] = None
        self.link: Optional[Link] = None
        self.ended = False
        self.sentinel: Optional[int] = None   # a pidfd of the job's process, on the loop


class JobWatch:
    """The jobs this process started, and who wants to hear when one ends."""

    def __init__(self, rt: Runtime) -> None:
        self.reactor = rt.reactor
        self.jobs: Dict[str, _Watched] = {}
        self._listeners: List[Callable[[str], Any]] = []
        self._recently_ended: "collections.OrderedDict[str, None]" = collections.OrderedDict()
        self._lock = threading.Lock()
        self._poll_now = threading.Event()
        self._poller: Optional[threading.Thread] = None
        self._greeter: Optional[Greeter] = None
        self._on_exit: Optional[Callable[[str, int], Any]] = None
        rt.acceptor.route("watch", self._take)

    def serve_jobs(self, greeter: Greeter, on_exit: Callable[[str, int], Any]) -> None:
        """Answer jobs' hellos with ``greeter(token, pid, host)`` (raise ``LookupError``
        to refuse one) and hear the exit codes they report with ``on_exit(token, code)``;
        both run on the loop."""
        self._greeter, self._on_exit = greeter, on_exit

    # -- any thread ------------------------------------------------------------------
    def watch(self, token: str, popen: Any, lost_after: Optional[float] = None) -> None:
        """Watch the job to be started for ``token`` (its backend's view; on this host,
        from :meth:`launched` on). A job elsewhere whose watch stream ended and stayed
        gone for ``lost_after`` seconds is given up: ``popen.lost(reason)``, then ended
        (None: only its backend tells)."""
        entry = _Watched(popen, lost_after)
        with self._lock:
            self.jobs[token] = entry
        if entry.polled:
            self._ensure_poller()

    def launched(self, token: str, job: Any) -> None:
        """The backend started the job of ``token`` (on this host): learn of its end as
        the backend reports it, or from its process."""
        entry = self.jobs.get(token)
        popen = entry.popen() if entry is not None else None
        if popen is None or entry.polled:
            return
        check = functools.partial(self._sentinel, token)
        if popen.backend.notify_end(job, lambda: self.reactor.call_soon(check)):
            return
        try:
            entry.sentinel = os.pidfd_open(job.pid)
        except (AttributeError, OSError, TypeError):   # no pidfd here: ask the backend
            entry.polled = True
            self._ensure_poller()
            self._poll_now.set()
            return
        self.reactor.add_reader(entry.sentinel, check)

    def on_end(self, listener: Callable[[str], Any]) -> None:
        """Call ``listener(token)`` on the I/O loop when a watched job has ended."""
        self._listeners.append(listener)

    def ended(self, token: Optional[str]) -> bool:
        """Whether the job of ``token`` is known to have ended (remembered for the last
        :data:`REMEMBERED` ended jobs, for messages that arrive after their sender's end)."""
        if not token:
            return False
        entry = self.jobs.get(token)
        return (entry is not None and entry.ended) or token in self._recently_ended

    def cut_off(self, token: Optional[str]) -> bool:
        """Whether the job of ``token``, not known to have ended, held a watch stream to
        this process and holds none now: it has just died, its host is gone, or it is
        opening a new stream. Whoever would probe its address had better wait for the
        verdict (:meth:`ended`), which comes within ``lost_after`` seconds at most."""
        entry = self.jobs.get(token) if token else None
        return (entry is not None and not entry.ended and entry.link is None
                and entry.last_heard is not None)

    def silence(self, token: str) -> Optional[float]:
        """Seconds since the job's last heartbeat (None before the first)."""
        entry = self.jobs.get(token)
        if entry is None or entry.last_heard is None:
            return None
        return time.monotonic() - entry.last_heard

    # -- the watch streams (loop) --------------------------------------------------------
    def _take(self, label: str, sock: Any, send_key: bytes, recv_key: bytes,
              leftover: bytes) -> bool:
        token = label.partition(":")[2]
        entry = self.jobs.get(token)
        if entry is None or entry.ended:
            return False
        if entry.link is not None:
            entry.link.close("replaced")
        entry.link = Link(self.reactor, sock, send_key, recv_key, leftover, self._heard,
                          self._lost, data=token)
        entry.last_heard = time.monotonic()
        return True

    def _heard(self, link: Link, kind: bytes, frames: list) -> None:
        token = link.data
        entry = self.jobs.get(token)
        if entry is not None:
            entry.last_heard = time.monotonic()
        if kind == _HEARTBEAT:
            return
        if kind == _HELLO:
            self._greet(link, token, frames)
        elif kind == _EXIT and self._on_exit is not None:
            self._on_exit(token, int(bytes(frames[0])))

    def _greet(self, link: Link, token: str, frames: list) -> None:
        try:
            pid, host = pickle.loads(frames[0])
            if self._greeter is None:
                raise LookupError("this process starts no jobs")
            prep, body = self._greeter(token, pid, host)
        except Exception as exc:   # refused: the job reports it and exits
            link.send(_REFUSED, [str(exc).encode()])
            return
        first, rest = pack_body(body)
        link.send(_PAYLOAD, [pickle.dumps((prep, first), protocol=5), *rest])

    def _lost(self, link: Link, why: str) -> None:
        entry = self.jobs.get(link.data)
        if entry is not None and entry.link is link:
            entry.link = None
            if entry.polled:
                self._poll_now.set()  # ask its backend now rather than at the next round

    # -- ends ------------------------------------------------------------------------
    def _sentinel(self, token: str, delay: float = 0.0) -> None:
        entry = self.jobs.get(token)
        if entry is None or entry.ended:
            return
        if entry.sentinel is not None:
            self.reactor.remove(entry.sentinel)
            os.close(entry.sentinel)
            entry.sentinel = None
        popen = entry.popen()
        if popen is not None and popen.poll() is None:
            # it is exiting (its pidfd fired): the kernel has not reaped it yet
            delay = min(0.2, max(0.001, delay * 2))
            self.reactor.call_later(delay, lambda: self._sentinel(token, delay))
            return
        self._ended(token)

    def _ended(self, token: str) -> None:
        entry = self.jobs.get(token)
        if entry is None or entry.ended:
            return
        entry.ended = True
        if entry.sentinel is not None:
            self.reactor.remove(entry.sentinel)
            os.close(entry.sentinel)
            entry.sentinel = None
        popen = entry.popen()
        if popen is not None:
            popen._job_ended()
        if entry.link is not None:
            entry.link.close("the job ended")
        for listener in list(self._listeners):
            try:
                listener(token)
            except Exception:
                logger.exception("a job-end listener failed")
        with self._lock:  # keep only a bounded record of ended jobs
            self.jobs.pop(token, None)
            self._recently_ended[token] = None
            if len(self._recently_ended) > REMEMBERED:
                self._recently_ended.popitem(last=False)

    def _ensure_poller(self) -> None:
        with self._lock:
            if self._poller is None or not self._poller.is_alive():
                self._poller = threading.Thread(target=self._poll_backends, daemon=True,
                                                name="fiberrl-job-poll")
                self._poller.start()

    def _poll_backends(self) -> None:
        """Ask the backend about jobs on other hosts (backend calls may block: not on the
        loop). Closes their sentinels when they end."""
        while True:
            self._poll_now.wait(POLL_INTERVAL)
            self._poll_now.clear()
            with self._lock:
                remote = [(t, e) for t, e in self.jobs.items() if e.polled and not e.ended]
            for token, entry in remote:
                popen = entry.popen()
                try:
                    finished = popen is None or popen.poll() is not None
                except Exception:   # the backend cannot say: the job's silence still can
                    logger.debug("status of job %s failed", token, exc_info=True)
                    finished = False
                if not finished and self._gone_silent(entry):
                    popen.lost(f"no word from the job for {self.silence(token):.0f} s since "
                               "its stream to this process ended: its host is gone or cut "
                               "off (a job cut off from its parent exits by then)")
                    finished = entry.given_up = True
                if finished:
                    self.reactor.call_soon(functools.partial(self._ended, token))

    @staticmethod
    def _gone_silent(entry: _Watched) -> bool:
        """Whether a job that once held a watch stream has had none for ``lost_after`` s."""
        return (entry.lost_after is not None and not entry.given_up and entry.link is None
                and entry.last_heard is not None
                and time.monotonic() - entry.last_heard > entry.lost_after)


def job_watch() -> JobWatch:
    """This process's job watch (starts the runtime if needed)."""
    return service("jobs", JobWatch)


def existing_job_watch() -> Optional[JobWatch]:
    """This process's job watch if it exists (starts nothing)."""
    from .runtime import existing_service
    return existing_service("jobs")


class ParentWatch:
    """A job's watch over its parent, on a thread of its own (see the module docstring).

    :meth:`stop` ends it when the job finishes; :meth:`set_interval` changes how often
    it sends heartbeats (a pool worker uses its pool's).
    """

    def __init__(self, address: Address, token: str, grace: float, interval: float,
                 sentinel_write: int) -> None:
        self.address, self.label = address, f"watch:{token}"
        self.grace, self.interval = grace, interval
        self._sentinel_write = sentinel_write
        self._stop_r, self._stop_w = os.pipe()
        self._stream: Any = None
        self.thread = threading.Thread(target=self._run, name="fiberrl-parent-watch", daemon=True)

    def hello(self, pid: int, host: str, timeout: float) -> Tuple[Any, List[Any]]:
        """Open the stream and say hello on it: ``(prep, frames)``, what this job runs.
        ``OSError`` (or ``TimeoutError``) if the parent cannot be reached, ``LookupError``
        if it refuses the job."""
        self._stream = stream = open_stream(self.address, self.label)
        stream.send(_HELLO, [pickle.dumps((pid, host), protocol=5)])
        got = stream.recv(timeout)
        if got is None:
            raise TimeoutError(f"no answer from the parent at {self.address[0]}:"
                               f"{self.address[1]} to this job's hello within {timeout} s")
        kind, frames = got
        if kind == _REFUSED:
            raise LookupError(bytes(frames[0]).decode(errors="replace"))
        prep, first = pickle.loads(frames[0])
        return prep, unpack_body(first, frames[1:])

    def start(self) -> None:
        """Start watching (on the stream :meth:`hello` opened; a new one if it broke)."""
        self.thread.start()

    def report_exit(self, code: int) -> None:
        """Tell the parent this job's exit code (best effort: the backend knows it too)."""
        stream = self._stream
        if stream is not None:
            try:
                stream.send(_EXIT, [str(int(code)).encode()])
            except OSError:
                pass

    def set_interval(self, seconds: float) -> None:
        """Send heartbeats every ``seconds`` from the next one on."""
        self.interval = max(0.01, seconds)
        os.write(self._stop_w, b"i")

    def stop(self) -> None:
        """Stop watching (the job is ending) and close the stream."""
        os.write(self._stop_w, b"s")
        self.thread.join(1.0)

    def _open(self) -> Any:
        try:
            return open_stream(self.address, self.label, timeout=5.0)
        except (OSError, TimeoutError) as exc:
            logger.debug("no watch stream to the parent at %s: %s", self.address, exc)
            return None

    def _run(self) -> None:
        lost_since = None if self._stream is not None else time.monotonic()
        next_beat = time.monotonic() + self.interval
        while True:
            stream = self._stream
            poller = select.poll()
            poller.register(self._stop_r, select.POLLIN)
            if stream is not None:
                poller.register(stream.fileno(), select.POLLIN)
                wait = max(0.0, next_beat - time.monotonic())
            else:
                wait = 0.2
            ready = {fd for fd, _ in poller.poll(int(wait * 1000) + 1)}
            if self._stop_r in ready:
                if os.read(self._stop_r, 1) == b"s":
                    break
                next_beat = time.monotonic()
                continue
            if stream is not None:
                try:
                    if ready:   # the parent never writes: readable means its end
                        raise EOFError
                    if time.monotonic() >= next_beat:
                        stream.send(_HEARTBEAT, [b""])
                        next_beat = time.monotonic() + self.interval
                    continue
                except (OSError, EOFError):
                    stream.close()
                    self._stream, lost_since = None, time.monotonic()
            self._stream = self._open()
            if self._stream is not None:
                lost_since = None
                next_beat = time.monotonic() + self.interval
            elif time.monotonic() - lost_since >= self.grace:
                self._parent_gone()
        if self._stream is not None:
            self._stream.close()
        os.close(self._stop_r)
        os.close(self._stop_w)

    def _parent_gone(self) -> None:
        # parent_process().is_alive() turns False now; the job gets one more grace
        # period to finish up before it exits
        os.close(self._sentinel_write)
        logger.error("parent process is gone (its runtime at %s:%s unreachable for %.1f s); "
                     "exiting in %.1f s", *self.address, self.grace, self.grace)
        time.sleep(self.grace)
        logging.shutdown()
        os._exit(1)


_parent_watch: Optional[ParentWatch] = None


def start_parent_watch(watch: ParentWatch) -> None:
    """Start ``watch`` as this job's watch over its parent."""
    global _parent_watch
    _parent_watch = watch
    watch.start()


def parent_watch() -> Optional[ParentWatch]:
    """This job's watch over its parent (None in a root process)."""
    return _parent_watch
