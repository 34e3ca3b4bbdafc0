"""The machine's state for a benchmark run: quiet, or N CPU-bound processes alongside.

A compute node running a pool has a CPU-bound process on every core; a figure taken on
an idle machine says nothing about it (issue 29). Benchmarks take ``--load N`` and run
inside :func:`cpu_load`, and print :func:`describe` with their figures.
"""
from __future__ import annotations

import contextlib
import ctypes
import os
import subprocess
import sys
import time
from typing import Iterator, Sequence

HOG = "while True: pass"

#: the personality flag of ``setarch -R``: programs exec'd with it load at fixed addresses
ADDR_NO_RANDOMIZE = 0x0040000
_QUERY = 0xFFFFFFFF


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
    layout = "; one address layout for every process" if one_layout() else ""
    return f"machine state: {state} (1-min load average at start {load:.1f}){layout}"


def _personality(persona: int) -> int:
    """``personality(2)``: set ``persona``, or with :data:`_QUERY` read the current one;
    ``OSError`` where it fails (or cannot be called: not Linux)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        result = libc.personality(ctypes.c_ulong(persona))
    except AttributeError:
        raise OSError("personality(2) is not available here") from None
    if result == -1:
        raise OSError(ctypes.get_errno(), "personality(2) failed")
    return result


def set_one_layout() -> None:
    """Turn address-space randomization off for every program this process execs from
    now on, and everything those start (``setarch -R``): each interpreter of the run
    then has one address layout, as a forked child has its parent's. With their own
    random layouts, processes taking turns on a core run Python slower than forked ones
    (docs/benchmarks.md, stops 47 and 53); this tells that cost from a library's own.
    ``OSError`` where it cannot (usable as a ``preexec_fn``)."""
    _personality(_personality(_QUERY) | ADDR_NO_RANDOMIZE)


def one_layout() -> bool:
    """Whether this process runs with address-space randomization off."""
    try:
        return bool(_personality(_QUERY) & ADDR_NO_RANDOMIZE)
    except OSError:
        return False


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


def add_layout_option(parser) -> None:
    """``--one-layout`` on an argparse parser (see :func:`apply_layout_option`)."""
    parser.add_argument("--one-layout", action="store_true",
                        help="run every process in one address layout (setarch -R), as "
                             "forked children run in their parent's")


def apply_layout_option(args, argv: Sequence[str]) -> None:
    """Run this benchmark again, with ``argv`` (this script and its arguments), in one
    address layout (:func:`set_one_layout`) when ``--one-layout`` asks and this process
    does not have it yet."""
    if not getattr(args, "one_layout", False) or one_layout():
        return
    try:
        set_one_layout()
    except OSError as exc:
        raise SystemExit(f"--one-layout: cannot turn address randomization off: {exc}")
    os.execv(sys.executable, [sys.executable, *argv])
