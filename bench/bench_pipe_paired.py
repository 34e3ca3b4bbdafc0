"""fiberrl's pipe code against the stdlib's, paired: one process pair, both pipes, block by block.

    python bench/bench_pipe_paired.py [--blocks B] [--rounds R] [--load N] [--spread]

Separate runs of a ping-pong differ by up to 1.5x on this project's VM even pinned to
one core: each run gets its own memory layout and its own VM state. Here a parent and
a child of the stdlib's fork context hold a fiberrl ``Pipe`` and a stdlib ``Pipe``, and
switch between them every R round trips (64 bytes each way, ``send_bytes`` /
``recv_bytes``, as ``bench_core.py``), so both pipes are measured in the same processes
at the same moments. Each side counts its CPU per block, every thread (both ends on
one core unless ``--spread``). The figure is the median of the block pairs' ratios: each
pair shares its processes, its memory layout and its moment, which separate runs do not
(on the 2-core VM, 10 blocks of 400: the median ratio still moved 1.43-1.81x between
runs, so compare code changes over several runs).

What it measures is the code's cost (fork's process model for both; the cost of a
fresh interpreter, which fiberrl's jobs are, is ``bench_pipe_cpu.py``'s
``fiberrl`` against ``fiberrl-fork``). A measurement, not a test.
"""
import argparse
import multiprocessing
import os
import statistics

import fiberrl
from machine_load import add_load_option, cpu_load, cpu_seconds, describe

PAYLOAD = b"x" * 64   # as bench_core's ping-pong
LIBRARIES = ("stdlib", "fiberrl")
WARM_UP = 50   # round trips per library before the first block


def _echo(pipes, blocks, rounds, core, report):
    if core is not None:
        os.sched_setaffinity(0, {core})
    for name in LIBRARIES:   # the parent's warm-up
        for _ in range(WARM_UP):
            pipes[name].send_bytes(pipes[name].recv_bytes())
    cpu = {name: [] for name in LIBRARIES}
    for _ in range(blocks):
        for name in LIBRARIES:
            conn = pipes[name]
            conn.send_bytes(conn.recv_bytes())   # the block's start
            started = cpu_seconds()
            for _ in range(rounds):
                conn.send_bytes(conn.recv_bytes())
            cpu[name].append(cpu_seconds() - started)
    report.send(cpu)


def paired(blocks, rounds, core):
    """CPU per round trip of both ends (us) per block, for each library."""
    ours = {"fiberrl": fiberrl.Pipe(), "stdlib": multiprocessing.Pipe()}
    report_r, report_w = multiprocessing.Pipe(duplex=False)
    child = multiprocessing.get_context("fork").Process(
        target=_echo, args=({name: pair[1] for name, pair in ours.items()}, blocks, rounds,
                            core, report_w))
    child.start()
    pipes = {name: pair[0] for name, pair in ours.items()}
    for name in LIBRARIES:   # warm up: fiberrl's ends connect on first use
        for _ in range(WARM_UP):
            pipes[name].send_bytes(PAYLOAD)
            pipes[name].recv_bytes()
    mask = os.sched_getaffinity(0)
    if core is not None:
        os.sched_setaffinity(0, {core})
    cpu = {name: [] for name in LIBRARIES}
    try:
        for _ in range(blocks):
            for name in LIBRARIES:
                conn = pipes[name]
                conn.send_bytes(PAYLOAD)
                conn.recv_bytes()
                started = cpu_seconds()
                for _ in range(rounds):
                    conn.send_bytes(PAYLOAD)
                    conn.recv_bytes()
                cpu[name].append(cpu_seconds() - started)
    finally:
        os.sched_setaffinity(0, mask)
    theirs = report_r.recv()
    child.join()
    return {name: [(mine + other) / rounds * 1e6 for mine, other in zip(cpu[name], theirs[name])]
            for name in LIBRARIES}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blocks", type=int, default=15, help="block pairs")
    parser.add_argument("--rounds", type=int, default=400, help="round trips per block")
    add_load_option(parser)
    parser.add_argument("--spread", action="store_true",
                        help="let the scheduler place the two ends (default: one core)")
    args = parser.parse_args()
    if args.blocks < 1 or args.rounds < 1:
        parser.error("--blocks and --rounds must be at least 1")
    core = None if args.spread else min(os.sched_getaffinity(0))
    print(describe(args.load) + ("; ends placed by the scheduler" if core is None
                                 else f"; both ends on core {core}"))
    with cpu_load(args.load):
        cpu = paired(args.blocks, args.rounds, core)
    ratios = [f / s for f, s in zip(cpu["fiberrl"], cpu["stdlib"])]
    for name in LIBRARIES:
        median = statistics.median(cpu[name])
        blocks = " ".join(f"{x:.0f}" for x in cpu[name])
        print(f"{name:8} CPU per round trip, both ends: median {median:6.1f} us   blocks {blocks}")
    print(f"fiberrl / stdlib, per block pair: median {statistics.median(ratios):.2f}x "
          f"(range {min(ratios):.2f}-{max(ratios):.2f}x; issue 29's target <= 1.5x)")


if __name__ == "__main__":
    main()
