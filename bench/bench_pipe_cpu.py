"""Where a small pipe message's CPU goes, loaded or idle: the floor, the stdlib, fiberrl.

    python bench/bench_pipe_cpu.py [--rounds R] [--load N]

The ping-pong of ``bench_core.py`` (its own function: 64 bytes each way,
``send_bytes``/``recv_bytes``), CPU of both ends per round trip and the median round
trip, side by side:

- ``raw``: two forked processes calling ``send``/``recv`` on a socket pair: what the
  kernel and two interpreters cost before any library code (the floor);
- the stdlib's ``fork``, ``forkserver`` (Python 3.14's default on Linux) and ``spawn``
  contexts: one code path, processes made three ways;
- fiberrl;
- ``fiberrl-fork``: fiberrl's pipe between this process and a child made by the
  stdlib's fork context: fiberrl's code, with the process model of fork (a child that
  shares its parent's memory page for page), which separates what fiberrl's code costs
  from what a fresh interpreter costs.

``--same-core`` pins both ends of every ping-pong to one core. Where the two ends run
decides the CPU more than any code does: on this project's VM a pair on two cores pays
a cross-core wake-up per message (loaded, up to several times the CPU of the same pair
on one core, for the stdlib and fiberrl alike), and which placement a run gets is up
to the scheduler, which keeps it for the run. Pinned, every target is measured in the
same placement.

Medians of R interleaved rounds (one round on a 2-core VM swings by 2-3x). Run it
idle and with ``--load $(nproc)``. A measurement, not a test.
"""
import argparse
import functools
import multiprocessing
import os
import socket
import statistics
import time

import fiberrl
from bench_core import pipe_pingpong
from machine_load import add_load_option, cpu_load, cpu_seconds, describe

PAYLOAD = b"x" * 64   # as bench_core's ping-pong
ROUNDS = 2000


def _raw_echo(sock, n, report):
    started = cpu_seconds()
    for _ in range(n):
        sock.send(sock.recv(4096))
    os.write(report, repr(cpu_seconds() - started).encode())


def raw_pingpong(rounds=ROUNDS, core=None):
    """The floor, measured as ``bench_core.pipe_pingpong`` measures a library: two forked
    processes, bare ``send``/``recv`` on a socket pair; (p50 round trip in us, CPU of
    both ends per round trip in us, the echo's warm-up rounds included)."""
    ours, theirs = socket.socketpair()
    report_r, report_w = os.pipe()
    mask = os.sched_getaffinity(0)
    if core is not None:
        os.sched_setaffinity(0, {core})   # the child inherits it
    pid = os.fork()
    if pid == 0:   # pragma: no cover - the child
        ours.close()
        _raw_echo(theirs, rounds + 200, report_w)
        os._exit(0)
    theirs.close()
    for _ in range(200):
        ours.send(PAYLOAD)
        ours.recv(4096)
    samples = []
    cpu = cpu_seconds()
    for _ in range(rounds):
        started = time.perf_counter()
        ours.send(PAYLOAD)
        ours.recv(4096)
        samples.append(time.perf_counter() - started)
    cpu = cpu_seconds() - cpu
    os.sched_setaffinity(0, mask)
    os.waitpid(pid, 0)
    cpu += float(os.read(report_r, 64))
    for fd in (report_r, report_w):
        os.close(fd)
    ours.close()
    return statistics.median(samples) * 1e6, cpu / rounds * 1e6


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7, help="interleaved rounds")
    add_load_option(parser)
    parser.add_argument("--same-core", action="store_true",
                        help="pin both ends of every ping-pong to one core")
    args = parser.parse_args()
    core = min(os.sched_getaffinity(0)) if args.same_core else None
    print(describe(args.load) + (f"; both ends on core {core}" if args.same_core
                                 else "; ends placed by the scheduler"))
    measures = {"raw": functools.partial(raw_pingpong, core=core)}
    for method in ("fork", "forkserver", "spawn"):
        context = multiprocessing.get_context(method)
        measures[method] = functools.partial(pipe_pingpong, context, ROUNDS, core=core)
    measures["fiberrl"] = functools.partial(pipe_pingpong, fiberrl, ROUNDS, core=core)
    measures["fiberrl-fork"] = functools.partial(pipe_pingpong, fiberrl, ROUNDS,
                                                 multiprocessing.get_context("fork"), core)
    results = {name: [] for name in measures}
    with cpu_load(args.load):
        for _ in range(args.rounds):
            for name, measure in measures.items():
                results[name].append(measure())
    cpu = {name: statistics.median(c for _, c in runs) for name, runs in results.items()}
    print(f"ping-pong of {len(PAYLOAD)} B, medians of {args.rounds} interleaved rounds")
    for name, runs in results.items():
        wall = statistics.median(w for w, _ in runs)
        print(f"{name:11} round trip p50 {wall:7.1f} us   CPU both ends {cpu[name]:6.1f} us   "
              f"runs {' '.join(f'{c:.0f}' for _, c in runs)}")
    print(f"CPU per round trip: fiberrl / stdlib fork {cpu['fiberrl'] / cpu['fork']:.2f}x "
          "(target <= 1.5), "
          f"fiberrl / stdlib forkserver {cpu['fiberrl'] / cpu['forkserver']:.2f}x, "
          f"fiberrl / stdlib spawn {cpu['fiberrl'] / cpu['spawn']:.2f}x; "
          f"fiberrl's pipe to a forked child / stdlib fork "
          f"{cpu['fiberrl-fork'] / cpu['fork']:.2f}x; "
          f"above the floor: stdlib fork {cpu['fork'] - cpu['raw']:+.1f} us, "
          f"fiberrl {cpu['fiberrl'] - cpu['raw']:+.1f} us")


if __name__ == "__main__":
    main()
