"""Core runtime benchmarks, fiberrl side by side with stdlib multiprocessing in one run.

    python bench/bench_core.py [--quick]

Prints, for each measure, the stdlib figure, fiberrl's, and the ratio the issue's
target is stated in. These are measurements, not tests: the machine is shared.
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


def echo(conn, n):
    for _ in range(n):
        conn.send_bytes(conn.recv_bytes())


def produce(queue, n, payload):
    for _ in range(n):
        queue.put(payload)


def noop():
    pass


def pipe_pingpong(lib, rounds):
    a, b = lib.Pipe()
    proc = lib.Process(target=echo, args=(b, rounds + 200))
    proc.start()
    msg = b"x" * 64
    for _ in range(200):  # warm up (connections, caches)
        a.send_bytes(msg)
        a.recv_bytes()
    samples = []
    for _ in range(rounds):
        started = time.perf_counter()
        a.send_bytes(msg)
        a.recv_bytes()
        samples.append(time.perf_counter() - started)
    proc.join()
    return statistics.median(samples) * 1e6


def queue_throughput(lib, n, payload):
    queue = lib.Queue()
    proc = lib.Process(target=produce, args=(queue, n, payload))
    started = time.perf_counter()
    proc.start()
    queue.get()
    first = time.perf_counter()
    for _ in range(n - 1):
        queue.get()
    elapsed = time.perf_counter() - first
    proc.join()
    return (n - 1) / elapsed


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


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer rounds")
    args = parser.parse_args()
    scale = 0.2 if args.quick else 1.0
    spawn = multiprocessing.get_context("spawn")
    print(f"{'measure':<50} {'stdlib':>11} {'fiberrl':>11}")

    # interleaved repeats: on a 2-core VM one pair of processes may share a core (a
    # cheap wake-up) or not (several times dearer), so single runs swing by 3x
    stds, ourss = [], []
    for _ in range(5):
        stds.append(pipe_pingpong(spawn, int(2000 * scale)))
        ourss.append(pipe_pingpong(fiberrl, int(2000 * scale)))
    pipe_std = std = statistics.median(stds)
    ours = statistics.median(ourss)
    row("Pipe ping-pong p50 latency (median of 5 runs)", std, ours, "us", ours / std,
        "target: fiberrl/stdlib <= 1.3")
    print(f"{'':<50} runs: stdlib {' '.join(f'{v:.0f}' for v in stds)} / "
          f"fiberrl {' '.join(f'{v:.0f}' for v in ourss)}")

    small = b"x" * 100
    n = int(200_000 * scale)
    stds, ourss = [], []
    for _ in range(3):   # interleaved, as above
        stds.append(queue_throughput(spawn, n, small))
        ourss.append(queue_throughput(fiberrl, n, small))
    std, ours = statistics.median(stds), statistics.median(ourss)
    row("Queue 1->1, 100-byte messages (median of 3)", std / 1e3, ours / 1e3, "k/s", ours / std,
        "target: fiberrl/stdlib >= 1.5")

    big = np.ones(2 * 1024 * 1024, dtype=np.float64)  # 16 MiB
    n = max(10, int(100 * scale))
    stds, ourss = [], []
    for _ in range(3):   # interleaved, as above
        stds.append(queue_throughput(spawn, n, big) * 16)
        ourss.append(queue_throughput(fiberrl, n, big) * 16)
    std, ours = statistics.median(stds), statistics.median(ourss)
    row("Queue 1->1, 16 MiB numpy arrays (median of 3)", std, ours, "MiB/s", ours / std,
        "target: fiberrl/stdlib >= 4")

    repeats = max(10, int(20 * scale))  # the first 2-3 fiberrl starts warm the fork server up
    std, ours = start_join(spawn, repeats), start_join(fiberrl, repeats)
    row("Process start + join (p50), main imports numpy", std, ours, "ms", ours / std,
        "target: fiberrl/stdlib-spawn <= 1")
    std, ours = start_join_bare("spawn", repeats), start_join_bare("fiberrl", repeats)
    row("Process start + join (p50), bare main", std, ours, "ms", ours / std,
        "target: fiberrl/stdlib-spawn <= 1")
    # fiberrl's local jobs fork from a warm server: the stdlib's forkserver is the peer
    # (interleaved medians of 3 runs: one run swings by a third on a shared machine)
    stds, ourss = [], []
    for _ in range(3):
        stds.append(start_join_bare("forkserver", repeats))
        ourss.append(start_join_bare("fiberrl", repeats))
    std, ours = statistics.median(stds), statistics.median(ourss)
    row("  the same vs the stdlib's forkserver (median of 3)", std, ours, "ms", ours / std,
        "target: fiberrl/stdlib-forkserver <= 1")
    fiberrl.init(spin_wait_us=0)  # jobs inherit it
    try:
        std, ours = pipe_std, pipe_pingpong(fiberrl, int(2000 * scale))
    finally:
        fiberrl.config.reset()
    row("Pipe ping-pong p50, fiberrl without spinning", std, ours, "us", ours / std,
        "for reference: spin_wait_us=0")


if __name__ == "__main__":
    main()
