"""How much Python a small pipe message runs: bytecodes per round trip, stdlib and fiberrl.

    python bench/bench_pipe_bytecodes.py [--rounds R] [--top K]

On a loaded machine a pipe round trip costs what its two processes compute, and on
this project's 2-core VM the timings of one code swing by 1.5x from run to run, more
than a change of a few percent can show. The number of bytecodes the interpreter runs
does not swing: it is the same in every run. So this counts them, in the parent, for
R round trips of the ping-pong the busy-machine benchmark uses (a small tuple with
``send``/``recv``) and of ``bench_core.py``'s (64 bytes with
``send_bytes``/``recv_bytes``), on the stdlib's fork context and on fiberrl, and
prints the counts per round trip, their ratio, and the K functions that run the most.

Only Python bytecode counts: C code (pickle, the MAC, system calls) runs outside it.
Each bytecode costs ~10 ns on the 2-core VM, so 100 bytecodes a round trip are ~1 us
of each side's CPU. The counts depend on the Python version (the tracer counts each
instruction the interpreter dispatches). fiberrl's receiver does not spin here, as on a
machine with no core to spare (a spin's polls would count as long as the peer takes).
A measurement, not a test.
"""
import argparse
import collections
import multiprocessing
import os
import sys

# Waits sleep at once, as on a machine with no core to spare: a spin's polls would count
# as many bytecodes as the peer is slow to answer.
os.environ["FIBERRL_SPIN_WAIT_US"] = "0"
import fiberrl  # noqa: E402

PAYLOAD = b"x" * 64


def _echo(conn):
    while True:
        message = conn.recv_bytes()
        if message == b"stop":
            return
        conn.send_bytes(message)


def _round_trips(conn, rounds, kind):
    if kind == "object":
        for i in range(rounds):
            conn.send((i, "x"))
            conn.recv()
    else:
        for _ in range(rounds):
            conn.send_bytes(PAYLOAD)
            conn.recv_bytes()


def _object_echo(conn):
    while True:
        message = conn.recv()
        if message is None:
            return
        conn.send(message)


def count_bytecodes(context, kind, rounds):
    """``(bytecodes per round trip, Counter of bytecodes by function)`` in this process."""
    parent, child = context.Pipe()
    proc = context.Process(target=_object_echo if kind == "object" else _echo, args=(child,))
    proc.start()
    _round_trips(parent, 300, kind)   # warm: connected, specialized, caches filled
    by_function = collections.Counter()

    def trace(frame, event, arg):
        if event == "call":
            frame.f_trace_opcodes = True
            frame.f_trace_lines = False
            return trace
        if event == "opcode":
            code = frame.f_code
            by_function[f"{code.co_filename.rsplit('/', 1)[-1]}:{code.co_name}"] += 1
        return trace

    sys.settrace(trace)
    try:
        _round_trips(parent, rounds, kind)
    finally:
        sys.settrace(None)
    del by_function["bench_pipe_bytecodes.py:_round_trips"]   # the loop itself
    if kind == "object":
        parent.send(None)
    else:
        parent.send_bytes(b"stop")
    proc.join()
    return sum(by_function.values()) / rounds, by_function


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=200, help="round trips counted")
    parser.add_argument("--top", type=int, default=8, help="functions listed per row")
    args = parser.parse_args()
    if args.rounds < 1 or args.top < 0:
        parser.error("--rounds must be at least 1 and --top at least 0")
    print(f"Python {sys.version.split()[0]}; bytecodes run in the parent per round trip "
          f"(its send and its receive), {args.rounds} round trips")
    for kind in ("object", "bytes"):
        counts = {}
        for name, context in (("stdlib fork", multiprocessing.get_context("fork")),
                              ("fiberrl", fiberrl)):
            per_trip, by_function = count_bytecodes(context, kind, args.rounds)
            counts[name] = per_trip
            print(f"{kind:6s} {name:12s} {per_trip:6.0f}")
            for function, count in by_function.most_common(args.top):
                print(f"         {count / args.rounds:6.1f}  {function}")
        print(f"{kind:6s} fiberrl / stdlib fork: {counts['fiberrl'] / counts['stdlib fork']:.2f}x")


if __name__ == "__main__":
    main()
