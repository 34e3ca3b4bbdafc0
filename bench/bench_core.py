"""Core runtime benchmarks, fiberrl side by side with stdlib multiprocessing in one run.

    python bench/bench_core.py [--quick] [--load N] [--one-layout]

Prints, for each measure, the stdlib figure, fiberrl's, and the ratio the issue's
target is stated in; beside the latency of the pipe and the queue, the CPU each costs
(user + system, every process involved). ``--load N`` runs everything with N
CPU-bound processes alongside (one per core: a busy compute node, issue 29's
condition); run it with ``--load 0`` and ``--load $(nproc)`` to see both states.
``--one-layout`` runs every process in one address layout, as forked children run
(``bench/machine_load.py``). These are measurements, not tests: the machine is shared.
"""
import argparse
import multiprocessing
import os
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

import fiberrl
from machine_load import (add_layout_option, add_load_option, apply_layout_option, cpu_load,
                          cpu_seconds, describe)


def echo(conn, n, core=None, objects=False):
    if core is not None:
        os.sched_setaffinity(0, {core})
    started = cpu_seconds()
    if objects:
        for _ in range(n):
            conn.send(conn.recv())
    else:
        for _ in range(n):
            conn.send_bytes(conn.recv_bytes())
    conn.send(cpu_seconds() - started)


def produce(queue, n, payload):
    started = cpu_seconds()
    for _ in range(n):
        queue.put(payload)
    queue.put(cpu_seconds() - started)


def noop():
    pass


def pipe_pingpong(lib, rounds, process_lib=None, core=None, objects=False):
    """(p50 round trip in us, CPU of both ends per round trip in us) of 64 B each way
    (``objects``: a small tuple, pickled by ``send``, as a request and its reply are).
    The child is made by ``process_lib`` (default: ``lib``); with ``core``, both ends
    run on that core."""
    a, b = lib.Pipe()
    proc = (process_lib or lib).Process(target=echo, args=(b, rounds + 200, core, objects))
    proc.start()
    mask = os.sched_getaffinity(0)
    if core is not None:
        os.sched_setaffinity(0, {core})
    msg = (1, "x") if objects else b"x" * 64
    send, receive = (a.send, a.recv) if objects else (a.send_bytes, a.recv_bytes)
    try:
        for _ in range(200):  # warm up (connections, caches, the echo's pinning)
            send(msg)
            receive()
        samples = []
        cpu = cpu_seconds()
        for _ in range(rounds):
            started = time.perf_counter()
            send(msg)
            receive()
            samples.append(time.perf_counter() - started)
        cpu = cpu_seconds() - cpu + a.recv()   # the echo's CPU includes its warm-up rounds
    finally:
        os.sched_setaffinity(0, mask)
    proc.join()
    return statistics.median(samples) * 1e6, cpu / rounds * 1e6


def queue_throughput(lib, n, payload):
    """(items per second, CPU of producer and consumer per item in us)."""
    queue = lib.Queue()
    proc = lib.Process(target=produce, args=(queue, n, payload))
    proc.start()
    queue.get()
    first, cpu = time.perf_counter(), cpu_seconds()
    for _ in range(n - 1):
        queue.get()
    elapsed = time.perf_counter() - first
    cpu = cpu_seconds() - cpu + queue.get()
    proc.join()
    return (n - 1) / elapsed, cpu / n * 1e6


def start_join(lib, repeats):
    samples = []
    for _ in range(repeats):
        started = time.perf_counter()
        proc = lib.Process(target=noop)
        proc.start()
        proc.join()
        samples.append(time.perf_counter() - started)
    return statistics.median(samples) * 1e3


# The stdlib's spawn re-imports the parent's main module in the child (here numpy and
# fiberrl); fiberrl's job does not. A script that imports nothing heavy shows the other
# side: what each child costs on its own.
_BARE_SCRIPT = """
import statistics, sys, time
def noop():
    pass
if __name__ == "__main__":
    if sys.argv[1] == "fiberrl":
        import fiberrl as mp
    else:
        import multiprocessing
        mp = multiprocessing.get_context(sys.argv[1])
    samples = []
    for _ in range(int(sys.argv[2])):
        started = time.perf_counter()
        proc = mp.Process(target=noop)
        proc.start()
        proc.join()
        samples.append(time.perf_counter() - started)
    print(statistics.median(samples) * 1e3)
"""


def start_join_bare(lib_name, repeats):
    with tempfile.TemporaryDirectory() as tmp:
        script = os.path.join(tmp, "bare.py")
        with open(script, "w") as fh:
            fh.write(_BARE_SCRIPT)
        out = subprocess.run([sys.executable, script, lib_name, str(repeats)], cwd=tmp,
                             capture_output=True, text=True, check=True)
    return float(out.stdout.split()[-1])


def row(name, stdlib, ours, unit, ratio, target):
    print(f"{name:<50} {stdlib:>11.1f} {ours:>11.1f} {unit:<6} ratio {ratio:5.2f}  ({target})")


def interleaved(measure, runs, *libs):
    """``measure(lib)`` for each lib, ``runs`` times interleaved (on a 2-core VM one pair
    of processes may share a core, a cheap wake-up, or not: single runs swing by 3x);
    a list of result lists, one per lib."""
    results = [[] for _ in libs]
    for _ in range(runs):
        for out, lib in zip(results, libs):
            out.append(measure(lib))
    return results


def medians(runs):
    """Per-field medians of a list of result tuples."""
    return [statistics.median(field) for field in zip(*runs)]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer rounds")
    add_load_option(parser)
    add_layout_option(parser)
    args = parser.parse_args()
    apply_layout_option(args, sys.argv)
    print(describe(args.load))
    with cpu_load(args.load):
        run(0.2 if args.quick else 1.0)


def run(scale):
    spawn = multiprocessing.get_context("spawn")
    print(f"{'measure':<50} {'stdlib':>11} {'fiberrl':>11}")

    rounds = int(2000 * scale)
    stds, ourss = interleaved(lambda lib: pipe_pingpong(lib, rounds), 5, spawn, fiberrl)
    (std, std_cpu), (ours, ours_cpu) = medians(stds), medians(ourss)
    pipe_std = std
    row("Pipe ping-pong p50 latency (median of 5 runs)", std, ours, "us", ours / std,
        "target: fiberrl/stdlib <= 1.3")
    print(f"{'':<50} runs: stdlib {' '.join(f'{v:.0f}' for v, _ in stds)} / "
          f"fiberrl {' '.join(f'{v:.0f}' for v, _ in ourss)}")
    row("  CPU per round trip, both ends (median of 5)", std_cpu, ours_cpu, "us",
        ours_cpu / std_cpu, "target: fiberrl/stdlib <= 1.5")

    small = b"x" * 100
    n = int(200_000 * scale)
    stds, ourss = interleaved(lambda lib: queue_throughput(lib, n, small), 3, spawn, fiberrl)
    (std, std_cpu), (ours, ours_cpu) = medians(stds), medians(ourss)
    row("Queue 1->1, 100-byte messages (median of 3)", std / 1e3, ours / 1e3, "k/s", ours / std,
        "target: fiberrl/stdlib >= 1.5")
    row("  CPU per item, both ends (median of 3)", std_cpu, ours_cpu, "us", ours_cpu / std_cpu,
        "for reference")

    big = np.ones(2 * 1024 * 1024, dtype=np.float64)  # 16 MiB
    n = max(10, int(100 * scale))
    stds, ourss = interleaved(lambda lib: queue_throughput(lib, n, big), 3, spawn, fiberrl)
    (std, std_cpu), (ours, ours_cpu) = medians(stds), medians(ourss)
    row("Queue 1->1, 16 MiB numpy arrays (median of 3)", std * 16, ours * 16, "MiB/s",
        ours / std, "target: fiberrl/stdlib >= 4")
    row("  CPU per array, both ends (median of 3)", std_cpu / 1e3, ours_cpu / 1e3, "ms",
        ours_cpu / std_cpu, "for reference")

    repeats = max(10, int(20 * scale))  # the first 2-3 fiberrl starts warm the fork server up
    std, ours = start_join(spawn, repeats), start_join(fiberrl, repeats)
    row("Process start + join (p50), main imports numpy", std, ours, "ms", ours / std,
        "target: fiberrl/stdlib-spawn <= 1")
    std, ours = start_join_bare("spawn", repeats), start_join_bare("fiberrl", repeats)
    row("Process start + join (p50), bare main", std, ours, "ms", ours / std,
        "target: fiberrl/stdlib-spawn <= 1")
    # fiberrl's local jobs fork from a warm server: the stdlib's forkserver is the peer
    # (interleaved medians of 3 runs: one run swings by a third on a shared machine)
    stds, ourss = interleaved(lambda name: start_join_bare(name, repeats), 3, "forkserver",
                              "fiberrl")
    std, ours = statistics.median(stds), statistics.median(ourss)
    row("  the same vs the stdlib's forkserver (median of 3)", std, ours, "ms", ours / std,
        "target: fiberrl/stdlib-forkserver <= 1")
    fiberrl.init(spin_wait_us=0)  # jobs inherit it
    try:
        ours, ours_cpu = pipe_pingpong(fiberrl, rounds)
    finally:
        fiberrl.config.reset()
    row("Pipe ping-pong p50, fiberrl without spinning", pipe_std, ours, "us", ours / pipe_std,
        "for reference: spin_wait_us=0")


if __name__ == "__main__":
    main()
