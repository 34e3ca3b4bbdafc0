"""When a waiting receiver polls before it sleeps, and how.

Why poll at all: waking a process asleep on another core costs ~40 us on a VM (the
core's idle exit and an inter-processor interrupt), more than a short message's
whole round trip between two awake processes. A receiver that expects an answer soon
polls without blocking for up to ``spin_wait_us`` (a configuration setting) and
sleeps in the kernel (one blocking wait, as the stdlib's receiver does) if nothing
came.

Why not always: a compute node running a pool has a CPU-bound process on every
core. There a spinning receiver takes the core its neighbour would run on, and
giving the core back with ``sched_yield`` is worse: the neighbour gets a whole time
slice (milliseconds), so every message waits a slice. Asleep, the receiver costs
nothing, and the scheduler runs it as soon as its message arrives (a sleeper preempts
a CPU-bound task). So the spin has three rules:

1. **Only with a core to spare** (:func:`core_to_spare`): the kernel's count of
   runnable threads, on the whole machine, including this one (the fourth field of
   ``/proc/loadavg``, read in ~2 us from a descriptor kept open), is at most the
   number of CPUs this process may use (its affinity, capped by its cgroup's CPU
   quota). The reading is reused for :data:`RECHECK_S`, so a conversation of
   thousands of messages a second reads it a few hundred times a second at most.
2. **Never yield**: polls back to back for at most the budget, then one blocking
   wait.
3. **Only while spins pay** (:class:`SpinGate`, one per waiter): a spin that caught
   nothing cost its whole budget and saved nothing, so the waiter then skips the spin
   for its next 1, 2, 4, ... up to :data:`MAX_SKIPS` waits, trying again in between;
   a spin that catches its message makes every wait spin again. Judged by the spin's
   own outcome, not by how long the wait took: a reply that missed the spin comes a
   wake-up late, so a wait's length cannot tell a peer just too slow for the spin
   from a prompt one. The case that decided it: gymnasium's ``AsyncVectorEnv`` on 2
   cores, where each env worker waits ~100 us for the parent's next step, longer than
   the spin; spinning on regardless cost 50 us per step in each worker, in cores
   the parent needed (5,100-5,900 steps/s against 6,700-7,300 with the gate).

Where ``/proc/loadavg`` cannot be read (not Linux), there is never a core to spare:
waits sleep at once, as the stdlib's do.
"""
from __future__ import annotations

import functools
import os
import time
from typing import Callable, List, Optional

#: seconds a reading of the machine's runnable threads is reused
RECHECK_S = 0.002

#: the most waits a waiter goes without a spin after spins that caught nothing
MAX_SKIPS = 64

_LOADAVG = "/proc/loadavg"


def spin_budget() -> float:
    """Seconds a waiting receiver may poll before it sleeps (0 on a single CPU)."""
    from ..config import get_config
    return get_config().spin_wait_us * 1e-6 if usable_cpus() > 1 else 0.0


class Backoff:
    """Whether to try, at each chance, something that pays only when it hits: after a
    miss, the next 1, 2, 4, ... up to :data:`MAX_SKIPS` chances are skipped, with a try
    in between; a hit makes every chance try again."""

    __slots__ = ("skip", "_backoff")

    def __init__(self) -> None:
        self.skip = 0        # chances to skip
        self._backoff = 0    # the skip after the next miss, halved

    def due(self) -> bool:
        """Whether to try at this chance."""
        if self.skip:
            self.skip -= 1
            return False
        return True

    def record(self, hit: bool) -> None:
        """Record whether the try just made hit."""
        if hit:
            self._backoff = 0
        else:
            self._backoff = min(MAX_SKIPS, 2 * self._backoff or 1)
            self.skip = self._backoff


class SpinGate(Backoff):
    """One waiter's spin decisions: before a wait, whether to spin (rules 1 and 3);
    after a spin, :meth:`record` whether it caught the message (rule 3's evidence: a
    spin that caught nothing cost its whole budget and saved nothing).
    """

    __slots__ = ()

    def should_spin(self, budget: float) -> bool:
        """Whether to spin for up to ``budget`` s before the next wait."""
        return bool(budget) and self.due() and _runnable.spare()


def spin_for(ready: Callable[[], bool], seconds: float) -> bool:
    """Call ``ready`` back to back (no yield, rule 2) until it is true or ``seconds``
    have passed; whether it became true."""
    until = time.perf_counter() + seconds
    clock = time.perf_counter
    while True:
        if ready():
            return True
        if clock() >= until:
            return False


class _RunnableThreads:
    """The machine's count of runnable threads, read from ``/proc/loadavg`` and reused
    for :data:`RECHECK_S` (one per process; a forked child reads its own)."""

    def __init__(self) -> None:
        self._fd: Optional[int] = None
        self._read_at = -1.0
        self._spare = False
        self.readings = 0   # how many times the file was read (tests)

    def spare(self) -> bool:
        now = time.perf_counter()
        if now - self._read_at < RECHECK_S:
            return self._spare
        running = self._read()
        self._read_at = now
        self._spare = running is not None and running <= usable_cpus()
        return self._spare

    def _read(self) -> Optional[int]:
        """Runnable threads now (this one included), or None if unknown."""
        try:
            if self._fd is None:
                self._fd = os.open(_LOADAVG, os.O_RDONLY | os.O_CLOEXEC)
            line = os.pread(self._fd, 128, 0)
        except OSError:
            return None
        self.readings += 1
        return parse_runnable(line)

    def forget(self) -> None:
        """Read afresh at the next question (tests, and a changed configuration)."""
        self._read_at = -1.0

    def forked(self) -> None:
        """In a forked child: its own reading (the descriptor itself may be shared)."""
        self._read_at = -1.0
        self.readings = 0


def parse_runnable(line: bytes) -> Optional[int]:
    """The runnable-threads count of a ``/proc/loadavg`` line (``b"0.52 0.58 0.59 3/812
    5471"`` -> 3), or None if the line has another shape."""
    fields: List[bytes] = line.split()
    if len(fields) < 4 or b"/" not in fields[3]:
        return None
    running = fields[3].split(b"/", 1)[0]
    return int(running) if running.isdigit() else None


_runnable = _RunnableThreads()
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_runnable.forked)


def core_to_spare() -> bool:
    """Whether every runnable thread of the machine, this one included, has a CPU this
    process may use (rule 1): a spin then delays nobody."""
    return _runnable.spare()


def runnable_readings() -> int:
    """How many times this process has read the machine's runnable threads."""
    return _runnable.readings


def forget_reading() -> None:
    """Make the next :func:`core_to_spare` read the machine's state afresh."""
    _runnable.forget()


@functools.lru_cache(maxsize=None)
def usable_cpus() -> int:
    """CPUs this process may run on: its affinity, capped by its cgroup's CPU quota."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    quota = _cgroup_cpu_quota()
    if quota is not None:
        cpus = min(cpus or 1, max(1, int(quota)))
    return max(1, cpus or 1)


def _cgroup_cpu_quota(root: str = "/sys/fs/cgroup") -> Optional[float]:
    """CPUs' worth of time the cgroup of this process may use (``--cpus`` of a
    container, a Slurm or systemd CPU quota), or None when unlimited or unknown."""
    try:   # cgroup v2, as seen from inside the group
        with open(os.path.join(root, "cpu.max")) as fh:
            quota, period = fh.read().split()[:2]
        return None if quota == "max" else int(quota) / int(period)
    except (OSError, ValueError):
        pass
    try:   # cgroup v1
        with open(os.path.join(root, "cpu", "cpu.cfs_quota_us")) as fh:
            quota_us = int(fh.read())
        with open(os.path.join(root, "cpu", "cpu.cfs_period_us")) as fh:
            period_us = int(fh.read())
    except (OSError, ValueError):
        return None
    return None if quota_us <= 0 else quota_us / period_us


__all__ = ["spin_budget", "Backoff", "SpinGate", "spin_for", "core_to_spare", "usable_cpus",
           "parse_runnable", "runnable_readings", "forget_reading", "MAX_SKIPS", "RECHECK_S"]
