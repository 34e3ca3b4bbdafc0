"""Docker benchmarks: container start to the first message on the hub, and Pool(8) to its
first result, on the docker backend vs the local one, in one run.

    bash scripts/docker-up.sh && python bench/bench_docker.py [--rounds N] [--pid-modes]

``--pid-modes`` instead compares the first and the second job's start in a fresh
backend with ``docker_pid_namespace`` "private" and "run" (where the first job also
starts the run's PID-namespace holder).

The first message is the job's hello to its parent's hub (the hub records the
job's host). Rounds alternate between the backends. These are measurements, not tests:
the machine may be shared and noisy.
"""
import argparse
import logging
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_pool  # noqa: E402  (pins BLAS threads before numpy loads)

import fiberrl  # noqa: E402
from fiberrl._wire.sockets import default_listen_host  # noqa: E402

WAIT_S = 120.0
# One process uses both backends: its hub must listen where containers reach it.
os.environ.setdefault("FIBERRL_LISTEN_HOST", default_listen_host())


def first_message(backend, **extra):
    """Seconds from Process.start() to the job's hello on the hub."""
    fiberrl.init(backend=backend, extra={"docker_forward_output": False, **extra})
    proc = fiberrl.Process(target=time.sleep, args=(0,))
    started = time.perf_counter()
    proc.start()
    end = time.monotonic() + WAIT_S
    while proc._popen._hello_host is None:  # set when the job's hello arrives
        if time.monotonic() > end:
            raise TimeoutError(f"{backend}: no hello within {WAIT_S:.0f} s")
        time.sleep(0.001)
    took = time.perf_counter() - started
    proc.join(WAIT_S)
    return took


def pool_first_result(backend, workers=8):
    """Seconds from Pool(workers) to its first result."""
    fiberrl.init(backend=backend, extra={"docker_forward_output": False})
    started = time.perf_counter()
    pool = fiberrl.Pool(workers)
    try:
        pool.apply_async(bench_pool.ident, (1,)).get(timeout=WAIT_S)
        return time.perf_counter() - started
    finally:
        pool.terminate()
        pool.join()


def pid_modes(rounds):
    """First and second job's start with each ``docker_pid_namespace`` mode; each
    round's ``init`` retires the backend, so its first job meets no holder."""
    figures = {(m, n): [] for m in ("private", "run") for n in ("first", "second")}
    for _ in range(rounds):
        for mode in ("private", "run"):
            figures[(mode, "first")].append(first_message("docker", docker_pid_namespace=mode))
            proc = fiberrl.Process(target=time.sleep, args=(0,))
            started = time.perf_counter()
            proc.start()
            assert proc.pid is not None  # waits for the hello
            figures[(mode, "second")].append(time.perf_counter() - started)
            proc.join(WAIT_S)
    fiberrl.config.reset()
    print(f"\nProcess.start() to the job's hello, median of {rounds} rounds (seconds)")
    print(f"{'docker_pid_namespace':<24}{'first job':>11}{'second job':>12}")
    for mode in ("private", "run"):
        print(f"{mode:<24}{statistics.median(figures[(mode, 'first')]):>11.3f}"
              f"{statistics.median(figures[(mode, 'second')]):>12.3f}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--pid-modes", action="store_true")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    if args.pid_modes:
        pid_modes(args.rounds)
        return
    figures = {(m, b): [] for m in ("start", "pool8") for b in ("local", "docker")}
    for _ in range(args.rounds):
        for backend in ("local", "docker"):
            figures[("start", backend)].append(first_message(backend))
            figures[("pool8", backend)].append(pool_first_result(backend))
    fiberrl.config.reset()
    print(f"\nDocker vs local, median of {args.rounds} alternating rounds (seconds)")
    print(f"{'measure':<44}{'local':>9}{'docker':>9}{'docker/local':>14}")
    for key, label in (("start", "Process.start() to its first message"),
                       ("pool8", "Pool(8) to its first result")):
        local = statistics.median(figures[(key, "local")])
        docker = statistics.median(figures[(key, "docker")])
        print(f"{label:<44}{local:>9.3f}{docker:>9.3f}{docker / local:>14.2f}")


if __name__ == "__main__":
    main()
