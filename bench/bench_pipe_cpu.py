"""Where a small pipe message's CPU goes, loaded or idle: the floor, the stdlib, fiberrl.

    python bench/bench_pipe_cpu.py [--rounds R] [--load N] [--same-core] [--objects]
                                   [--layouts own|one|both]

The ping-pong of ``bench_core.py`` (its own function: 64 bytes each way,
``send_bytes``/``recv_bytes``; with ``--objects`` a small tuple by ``send``/``recv``,
pickled, as a request and its reply are), CPU of both ends per round trip and the median round
trip, side by side:

- ``raw``: two forked processes calling ``send``/``recv`` on a socket pair: what the
  kernel and two interpreters cost before any library code (the floor);
- the stdlib's ``fork``, ``forkserver`` (Python 3.14's default on Linux) and ``spawn``
  contexts: one code path, processes made three ways;
- fiberrl;
- ``fiberrl-fork``: fiberrl's pipe between this process and a child made by the
  stdlib's fork context: fiberrl's code, with the process model of fork (a child that
  shares its parent's memory page for page), which separates what fiberrl's code costs
  from what a fresh interpreter costs;
- ``fork+mac`` and ``spawn+mac``: the stdlib's own pipe, signing every message with
  fiberrl's MAC as fiberrl does (:mod:`signed_stdlib`), which separates what fiberrl's
  pipe costs from what signing every message costs.

``--same-core`` pins both ends of every ping-pong to one core. Where the two ends run
decides the CPU more than any code does: on this project's VM a pair on two cores pays
a cross-core wake-up per message (loaded, up to several times the CPU of the same pair
on one core, for the stdlib and fiberrl alike), and which placement a run gets is up
to the scheduler, which keeps it for the run. Pinned, every target is measured in the
same placement.

``--layouts both`` runs every round twice, in two fresh bench processes: once as
processes are normally made (each exec'd interpreter at its own random addresses),
once with address-space randomization off for the bench and everything it starts
(``personality(ADDR_NO_RANDOMIZE)``), so that every interpreter of the run has one
address layout, as a forked child has its parent's. On this project's VM, with both
ends on one core and ``--objects``, the fresh interpreters (spawn, forkserver, a
fiberrl job) cost 13-29 us less per round trip in one layout, fork nothing: two
processes taking turns on one core cost less when they run the same code at the same
addresses (likely the CPU's branch predictors, which are indexed by address; the VM
exposes no counters to prove it). A job is an exec'd interpreter, so this is a part of
"fiberrl against fork" that no job-backed process can win, and the stdlib's own
spawn and forkserver pay it too. ``--layouts one`` runs the bench in one layout only.

Medians of R interleaved rounds (one round on a 2-core VM swings by 2-3x). Run it
idle and with ``--load $(nproc)``. A measurement, not a test.
"""
import argparse
import functools
import json
import multiprocessing
import os
import socket
import statistics
import subprocess
import sys
import time

import fiberrl
from bench_core import pipe_pingpong
from machine_load import add_load_option, cpu_load, cpu_seconds, describe, set_one_layout
from signed_stdlib import SignedStdlib

PAYLOAD = b"x" * 64   # as bench_core's ping-pong
ROUNDS = 2000
LAYOUTS = {"own": "each interpreter at its own random addresses (as processes are made)",
           "one": "address-space randomization off: one layout for every interpreter"}


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


def measures_for(core, objects):
    """The targets, by name: a function each returning (p50 round trip, CPU per round trip)."""
    measures = {"raw": functools.partial(raw_pingpong, core=core)}
    for method in ("fork", "forkserver", "spawn"):
        context = multiprocessing.get_context(method)
        measures[method] = functools.partial(pipe_pingpong, context, ROUNDS, core=core,
                                             objects=objects)
    for method in ("fork", "spawn"):
        measures[f"{method}+mac"] = functools.partial(pipe_pingpong, SignedStdlib(method),
                                                      ROUNDS, core=core, objects=objects)
    measures["fiberrl"] = functools.partial(pipe_pingpong, fiberrl, ROUNDS, core=core,
                                            objects=objects)
    measures["fiberrl-fork"] = functools.partial(pipe_pingpong, fiberrl, ROUNDS,
                                                 multiprocessing.get_context("fork"), core,
                                                 objects)
    return measures


def round_here(core, objects):
    """One round of every target in this process: ``{target: (p50, CPU)}``."""
    return {name: measure() for name, measure in measures_for(core, objects).items()}


def round_in(layout, same_core, objects):
    """One round of every target in a fresh bench process of ``layout``."""
    command = [sys.executable, os.path.abspath(__file__), "--one-round"]
    command += ["--same-core"] * same_core + ["--objects"] * objects
    preexec = set_one_layout if layout == "one" else None
    done = subprocess.run(command, capture_output=True, text=True, check=True,
                          preexec_fn=preexec, cwd=os.path.dirname(os.path.abspath(__file__)))
    return json.loads(done.stdout.strip().splitlines()[-1])


def report(results, heading):
    """Print the medians of ``{target: [(wall, cpu), ...]}`` and the ratios."""
    cpu = {name: statistics.median(c for _, c in runs) for name, runs in results.items()}
    print(heading)
    for name, runs in results.items():
        wall = statistics.median(w for w, _ in runs)
        print(f"  {name:12} round trip p50 {wall:7.1f} us   CPU both ends {cpu[name]:6.1f} us   "
              f"runs {' '.join(f'{c:.0f}' for _, c in runs)}")
    print(f"  CPU per round trip: fiberrl / stdlib fork {cpu['fiberrl'] / cpu['fork']:.2f}x "
          "(target <= 1.5), "
          f"fiberrl / stdlib forkserver {cpu['fiberrl'] / cpu['forkserver']:.2f}x, "
          f"fiberrl / stdlib spawn {cpu['fiberrl'] / cpu['spawn']:.2f}x; "
          f"fiberrl's pipe to a forked child / stdlib fork "
          f"{cpu['fiberrl-fork'] / cpu['fork']:.2f}x; "
          f"against the stdlib signing every message: fiberrl / spawn+mac "
          f"{cpu['fiberrl'] / cpu['spawn+mac']:.2f}x, fiberrl-fork / fork+mac "
          f"{cpu['fiberrl-fork'] / cpu['fork+mac']:.2f}x; "
          f"above the floor: stdlib fork {cpu['fork'] - cpu['raw']:+.1f} us, "
          f"fiberrl {cpu['fiberrl'] - cpu['raw']:+.1f} us")
    return cpu


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7, help="interleaved rounds")
    add_load_option(parser)
    parser.add_argument("--same-core", action="store_true",
                        help="pin both ends of every ping-pong to one core")
    parser.add_argument("--layouts", choices=("own", "one", "both"), default="own",
                        help="address layouts of the interpreters (module doc)")
    parser.add_argument("--objects", action="store_true",
                        help="send and receive a small tuple (pickled) instead of 64 bytes")
    parser.add_argument("--one-round", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    core = min(os.sched_getaffinity(0)) if args.same_core else None
    if args.one_round:   # (a round of --layouts, in its own process)
        print(json.dumps(round_here(core, args.objects)))
        return
    print(describe(args.load) + (f"; both ends on core {core}" if args.same_core
                                 else "; ends placed by the scheduler"))
    layouts = ("own", "one") if args.layouts == "both" else (args.layouts,)
    results = {layout: {} for layout in layouts}
    with cpu_load(args.load):
        for _ in range(args.rounds):
            for layout in layouts:
                if args.layouts == "own":
                    one = round_here(core, args.objects)
                else:
                    one = round_in(layout, args.same_core, args.objects)
                for name, figures in one.items():
                    results[layout].setdefault(name, []).append(tuple(figures))
    cpu = {}
    for layout in layouts:
        what = "(1, 'x') by send/recv" if args.objects else f"{len(PAYLOAD)} B"
        cpu[layout] = report(results[layout], f"ping-pong of {what}, medians of "
                             f"{args.rounds} interleaved rounds; {LAYOUTS[layout]}")
    if len(layouts) == 2:
        print("one layout against own layouts, CPU per round trip: " + ", ".join(
            f"{name} {cpu['one'][name] - cpu['own'][name]:+.1f} us" for name in cpu["own"]))


if __name__ == "__main__":
    main()
