"""The busy-machine acceptance gates with the stdlib in fiberrl's seat: what do they say
when fiberrl is not in the run at all?

    python bench/gate_control.py [--busy-bench PATH] [--runs R] [--methods fork,spawn,forkserver]
                                 [--with-fiberrl]

``../shared/tools/busy_bench.py`` compares fiberrl with the stdlib's fork context: the
loaded and quiet pipe ping-pong, CPU per round trip and gymnasium's ``AsyncVectorEnv``,
each with a pass/fail gate. This bench runs that very tool, unchanged, ``R`` times per
method, with ``import fiberrl`` answered by a stand-in package (written to a temporary
folder put first on ``PYTHONPATH``) whose ``Pipe``, ``Process`` and ``get_context`` are
those of the stdlib's context ``METHOD``. So its "fiberrl" column is the stdlib:

- ``fork`` against fork: the stdlib against itself. What the gates reject here is the
  noise of the machine and of the scheduler's placement, not any code;
- ``spawn`` and ``forkserver`` (Python 3.14's default on Linux) against fork: the
  stdlib's own fresh interpreters, the process model a fiberrl job has (an exec'd
  interpreter, as in a container, a pod or a Slurm job);
- ``fork+mac``, ``spawn+mac``, ``forkserver+mac``: the same contexts with every pipe
  message signed as fiberrl signs it (``bench/signed_stdlib.py``): what the gates say
  of the stdlib once it pays for the per-message MAC that fiberrl must keep;
- with ``--with-fiberrl``, fiberrl itself, in the same session, interleaved.

It prints each run's figure line and, per method, how many runs met each gate.
Not a test: run by hand; needs gymnasium and psutil in the interpreter that runs it.
"""
from __future__ import annotations

import argparse
import logging
import os
import re
import subprocess
import sys
import tempfile
from typing import Dict, List, Optional

logger = logging.getLogger("gate_control")

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_BUSY_BENCH = os.path.normpath(os.path.join(HERE, "..", "..", "shared", "tools", "busy_bench.py"))

STAND_IN = '''"""A stand-in for fiberrl: {what} (bench/gate_control.py)."""
{make_context}
Pipe = _context.Pipe
Process = _context.Process


def get_context(method=None):
    """That context, whatever is asked."""
    return _context
'''

#: how a stand-in makes its context: the stdlib's, or the stdlib's with every pipe
#: message signed as fiberrl signs it (``bench/signed_stdlib.py``)
PLAIN_CONTEXT = "import multiprocessing as _mp\n\n_context = _mp.get_context({method!r})\n"
SIGNED_CONTEXT = ("import sys as _sys\n\n_sys.path.insert(0, {bench!r})\n"
                  "from signed_stdlib import SignedStdlib as _SignedStdlib  # noqa: E402\n\n"
                  "_context = _SignedStdlib({method!r})\n")
METHODS = ("fork", "spawn", "forkserver")

#: the figure line busy_bench prints last, one number per gate
FIGURES = re.compile(
    r"loaded pipe (?P<pipe>[\d.]+)x \(worst run (?P<worst>[\d.]+)x\), cpu/rtt (?P<cpu>[\d.]+)x; "
    r"loaded AsyncVectorEnv (?P<ave_loaded>[\d.]+)x; quiet pipe (?P<quiet_pipe>[\d.]+)x, "
    r"cpu/rtt (?P<quiet_cpu>[\d.]+)x; quiet AsyncVectorEnv (?P<ave_quiet>[\d.]+)x")

#: busy_bench's gates: (figure, bound, True when the figure must be at most the bound)
GATES = [("pipe", 1.3, True), ("worst", 3.0, True), ("cpu", 1.5, True),
         ("ave_loaded", 0.9, False), ("ave_quiet", 0.9, False)]


def stand_in_path(root: str, seat: str) -> str:
    """A folder holding a package ``fiberrl`` that is the stdlib's context ``seat``
    (``"spawn"``), or that context with every pipe message signed (``"spawn+mac"``)."""
    folder = os.path.join(root, seat)
    os.makedirs(os.path.join(folder, "fiberrl"), exist_ok=True)
    method, signed = seat.split("+")[0], seat.endswith("+mac")
    if signed:
        what = f"the stdlib's {method!r} context, every pipe message signed"
        make_context = SIGNED_CONTEXT.format(method=method, bench=HERE)
    else:
        what = f"the stdlib's {method!r} context"
        make_context = PLAIN_CONTEXT.format(method=method)
    source = STAND_IN.format(what=what, make_context=make_context)
    with open(os.path.join(folder, "fiberrl", "__init__.py"), "w") as fh:
        fh.write(source)
    return folder


def one_run(busy_bench: str, python: str, stand_in: Optional[str]) -> Optional[Dict[str, float]]:
    """Run busy_bench once; its figures, or None if it printed no figure line."""
    env = dict(os.environ)
    if stand_in is not None:
        env["PYTHONPATH"] = stand_in + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    done = subprocess.run([python, busy_bench, python], capture_output=True, text=True, env=env,
                          timeout=900)
    lines = done.stdout.strip().splitlines()
    for line in lines:
        logger.info("  %s", line)
    match = FIGURES.search(lines[-1]) if lines else None
    if match is None:
        logger.warning("no figure line; stderr: %s", done.stderr.strip()[-400:])
        return None
    return {name: float(value) for name, value in match.groupdict().items()}


def met(figures: Dict[str, float], gate: str, bound: float, at_most: bool) -> bool:
    """Whether one run's figure meets one gate."""
    value = figures[gate]
    return value <= bound if at_most else value >= bound


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--busy-bench", default=DEFAULT_BUSY_BENCH, help="path of busy_bench.py")
    parser.add_argument("--runs", type=int, default=3, help="runs of busy_bench per method")
    parser.add_argument("--methods", default="fork,spawn,forkserver",
                        help="the stdlib's contexts to put in fiberrl's seat, comma-separated "
                             "(a name with '+mac' signs every pipe message, as fiberrl does)")
    parser.add_argument("--with-fiberrl", action="store_true", help="also run fiberrl itself")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if not os.path.exists(args.busy_bench):
        parser.error(f"no busy_bench.py at {args.busy_bench}")
    if args.runs < 1:
        parser.error("--runs must be at least 1")
    methods = [m for m in args.methods.split(",") if m]
    known = set(METHODS) | {f"{method}+mac" for method in METHODS}
    bad = [m for m in methods if m not in known]
    if bad:
        parser.error(f"unknown methods: {', '.join(bad)}")
    seats = methods + (["fiberrl"] if args.with_fiberrl else [])
    results: Dict[str, List[Dict[str, float]]] = {seat: [] for seat in seats}
    with tempfile.TemporaryDirectory(prefix="gate-control-") as root:
        for run in range(args.runs):
            for seat in seats:   # interleaved, so a slow spell of the machine hits every seat
                logger.info("run %d, %s in fiberrl's seat:", run + 1, seat)
                stand_in = None if seat == "fiberrl" else stand_in_path(root, seat)
                figures = one_run(args.busy_bench, sys.executable, stand_in)
                if figures is not None:
                    results[seat].append(figures)
    logger.info("")
    logger.info("runs meeting each gate (figures of the runs in brackets):")
    for seat in seats:
        runs = results[seat]
        cells = []
        for gate, bound, at_most in GATES:
            passed = sum(met(r, gate, bound, at_most) for r in runs)
            values = ", ".join(f"{r[gate]:.2f}" for r in runs)
            cells.append(f"{gate} {'<=' if at_most else '>='} {bound}: {passed}/{len(runs)} [{values}]")
        every = sum(all(met(r, g, b, m) for g, b, m in GATES) for r in runs)
        logger.info("%-10s all gates %d/%d; %s", seat, every, len(runs), "; ".join(cells))
    return 0


if __name__ == "__main__":
    sys.exit(main())
