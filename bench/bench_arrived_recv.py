"""A receive whose message arrived already: fiberrl's pipe against the stdlib's, paired.

    python bench/bench_arrived_recv.py [--samples S] [--gap-ms G] [--load N]

The second of two replies, or any reply on a loaded machine (where the receiver is
often preempted before it asks), is in the socket before ``recv`` is called. Then the
receive's cost is its own code and system calls, run cold: the process slept or ran
something else in between, so its caches and the CPU's are cold. Here a parent and a
child of the stdlib's fork context hold a fiberrl ``Pipe`` and a stdlib ``Pipe``; in
turn on each, the parent asks for a 64-byte message, sleeps ``G`` ms (it has arrived
by then) and times one ``recv_bytes``. The figure is the median of each library's
samples, and their ratio. A measurement, not a test.
"""
import argparse
import multiprocessing
import statistics
import time

import fiberrl
from machine_load import add_load_option, cpu_load, describe

PAYLOAD = b"x" * 64
LIBRARIES = ("stdlib", "fiberrl")


def _answer(pipes, samples):
    """The child: one message back for every request, on the pipe it came by."""
    for _ in range(samples):
        for name in LIBRARIES:
            conn = pipes[name]
            conn.recv_bytes()
            conn.send_bytes(PAYLOAD)


def measure(samples: int, gap_s: float) -> dict:
    """Seconds each library's ``recv_bytes`` of an arrived message took, per sample."""
    stdlib_parent, stdlib_child = multiprocessing.get_context("fork").Pipe()
    fiberrl_parent, fiberrl_child = fiberrl.Pipe()
    pipes = {"stdlib": stdlib_parent, "fiberrl": fiberrl_parent}
    child = multiprocessing.get_context("fork").Process(
        target=_answer, args=({"stdlib": stdlib_child, "fiberrl": fiberrl_child}, samples))
    child.start()
    took = {name: [] for name in LIBRARIES}
    clock = time.perf_counter
    for _ in range(samples):
        for name in LIBRARIES:
            conn = pipes[name]
            conn.send_bytes(b"go")
            time.sleep(gap_s)
            started = clock()
            message = conn.recv_bytes()
            took[name].append(clock() - started)
            assert message == PAYLOAD
    child.join()
    return took


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=2000)
    parser.add_argument("--gap-ms", type=float, default=0.5,
                        help="sleep between the request and the receive (default 0.5)")
    add_load_option(parser)
    args = parser.parse_args()
    if args.samples < 1 or args.gap_ms < 0:
        parser.error("--samples must be at least 1 and --gap-ms not negative")
    with cpu_load(args.load):
        took = measure(args.samples, args.gap_ms / 1000)
    print(describe(args.load))
    median = {name: statistics.median(took[name]) * 1e6 for name in LIBRARIES}
    tenth = {name: sorted(took[name])[len(took[name]) // 10] * 1e6 for name in LIBRARIES}
    for name in LIBRARIES:
        print(f"{name:8s} recv_bytes of an arrived message: median {median[name]:.1f} us, "
              f"10th percentile {tenth[name]:.1f} us ({args.samples} samples, "
              f"{args.gap_ms:g} ms after the request)")
    print(f"fiberrl / stdlib: {median['fiberrl'] / median['stdlib']:.2f}x")


if __name__ == "__main__":
    main()
