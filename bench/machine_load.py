"""The machine's state for a benchmark run: quiet, or N CPU-bound processes alongside.

A compute node running a pool has a CPU-bound process on every core; a figure taken on
an idle machine says nothing about it (issue 29). Benchmarks take ``--load N`` and run
inside :func:`cpu_load`, and print :func:`describe` with their figures.
"""
from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from typing import Iterator

HOG = "while True: pass"


@contextlib.contextmanager
def cpu_load(processes: int) -> Iterator[None]:
    """``processes`` CPU-bound Python processes for the block's duration (0: none)."""
    hogs = [subprocess.Popen([sys.executable, "-c", HOG]) for _ in range(processes)]
    try:
        if hogs:
            time.sleep(0.5)   # in the run queue before the first measure
        yield
    finally:
        for hog in hogs:
            hog.kill()
        for hog in hogs:
            hog.wait()


def describe(processes: int) -> str:
    """One line naming the machine's state during the run."""
    cores = len(os.sched_getaffinity(0))
    load = os.getloadavg()[0]
    state = (f"loaded: {processes} CPU-bound process(es) on {cores} cores" if processes
             else f"quiet: no added load on {cores} cores")
    return f"machine state: {state} (1-min load average at start {load:.1f})"


def cpu_seconds() -> float:
    """User + system CPU seconds of this process so far, every thread (not rounded to
    clock ticks, unlike ``os.times``)."""
    return time.process_time()


def process_cpu(pid: int) -> float:
    """On-CPU seconds of every thread of process ``pid``, to the nanosecond
    (``/proc/PID/task/*/schedstat``; ``os.times`` rounds to clock ticks); 0 if it is gone."""
    total = 0
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{tid}/schedstat") as fh:
                total += int(fh.read().split()[0])
    except OSError:
        pass
    return total / 1e9


def add_load_option(parser) -> None:
    """``--load N`` on an argparse parser (default 0)."""
    parser.add_argument("--load", type=int, default=0, metavar="N",
                        help="run with N CPU-bound processes alongside (one per core is a "
                             "busy compute node); 0: the machine as it is")
