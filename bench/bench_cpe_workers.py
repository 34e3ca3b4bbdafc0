"""``fiberrl cpe evaluate --workers``: one worker against N, side by side in one run
(run by hand: ``python bench/bench_cpe_workers.py``).

For each size of a synthetic bandit log (4 actions, with a reward model) it times, in
the same process and in turn:

* ``serial``: ``cpe.evaluate`` in this process (what ``--workers 1`` runs);
* ``msg W``: ``--workers W`` as before the shared file: features in the pool's
  messages, one copy per worker (``evaluate_on_pool(..., same_host=False)``);
* ``file W``: what ``--workers W`` runs now on the local backend: features in one
  file in ``/dev/shm`` that every worker maps (``same_host=True``);
* ``start W``: the pool's start alone, until every worker has run a task.

Pool start is included in ``msg`` and ``file`` (as the command pays it).

``--cli``: the command itself instead, end to end on a JSON lines file of each size
(loading included; the pool starts while the data loads), ``--workers 1`` against
``--workers W`` with the size threshold turned off.
Replicates are checked to be equal to the serial ones (the bootstrap is bit-for-bit
the same on a pool). Each figure is the median of ``--repeats`` runs. BLAS threads are
pinned to one before numpy is imported, as in ``bench_cpe.py``.
"""

from __future__ import annotations

import argparse
import os

for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import statistics  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import cpe  # noqa: E402
import fiberrl  # noqa: E402
from bench_cpe import bandit_log  # noqa: E402
from cpe.cli import evaluate_on_pool  # noqa: E402
from cpe.evaluate import DEFAULT_N_BOOTSTRAP  # noqa: E402


def _timed(fn) -> tuple[float, object]:
    start = time.perf_counter()
    result = fn()
    return time.perf_counter() - start, result


def _pool_start(workers: int) -> float:
    """Seconds from ``Pool(workers)`` until every worker has run a task."""
    start = time.perf_counter()
    with fiberrl.Pool(workers) as pool:
        pool.map(time.sleep, [0.05] * workers, chunksize=1)
        return time.perf_counter() - start


def _cli(args: argparse.Namespace) -> None:
    """Time ``fiberrl cpe evaluate FILE --workers W`` end to end (in this process)."""
    import contextlib
    import io
    import json
    import tempfile
    from cpe import cli
    cli.POOL_MIN_WORK = 0  # measure the pool at every size
    counts = [1] + [int(w) for w in args.workers.split(",")]
    print(f"cpu count {os.cpu_count()}, load {os.getloadavg()[0]:.1f}, "
          f"{args.n_bootstrap} replicates, median of {args.repeats}, JSON lines input", flush=True)
    print(f"{'rows':>9}" + "".join(f" {'workers ' + str(w):>10}" for w in counts)
          + "   (ratio to 1 worker)", flush=True)
    with tempfile.TemporaryDirectory() as folder:
        for n in (int(s) for s in args.sizes.split(",")):
            arrays = bandit_log(n, 4, np.random.default_rng(0))
            path = os.path.join(folder, f"log{n}.jsonl")
            with open(path, "w") as out:
                for i in range(n):
                    out.write(json.dumps({"action": int(arrays.actions[i]),
                                          "reward": float(arrays.rewards[i]),
                                          "action_probability": float(
                                              arrays.logged_propensities[i]),
                                          "target_probs": arrays.target_probs[i].tolist(),
                                          "reward_estimates":
                                              arrays.reward_estimates[i].tolist()}) + "\n")
            times = {w: [] for w in counts}
            for _ in range(args.repeats):
                for w in counts:
                    argv = ["evaluate", path, "--seed", "0", "--n-bootstrap",
                            str(args.n_bootstrap), "--workers", str(w), "--json"]
                    with contextlib.redirect_stdout(io.StringIO()):
                        took, code = _timed(lambda: cli.run(argv))
                    assert code == 0
                    times[w].append(took)
            base = statistics.median(times[1])
            print(f"{n:>9,}" + "".join(
                f" {statistics.median(times[w]):>5.2f}" + (f" {base / statistics.median(times[w]):>3.2f}x" if w > 1 else "     ")
                for w in counts), flush=True)


def main() -> None:
    """Run the comparison and print one row per size."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="5000,20000,50000,100000,200000,500000,1000000")
    parser.add_argument("--workers", default="2")
    parser.add_argument("--n-bootstrap", type=int, default=DEFAULT_N_BOOTSTRAP)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--cli", action="store_true", help="time the command end to end")
    args = parser.parse_args()
    if args.cli:
        return _cli(args)
    sizes = [int(s) for s in args.sizes.split(",")]
    counts = [int(w) for w in args.workers.split(",")]
    options = dict(estimators=None, n_bootstrap=args.n_bootstrap, seed=0, confidence=0.95)
    print(f"cpu count {os.cpu_count()}, load {os.getloadavg()[0]:.1f}, "
          f"{args.n_bootstrap} replicates, median of {args.repeats}", flush=True)
    header = f"{'rows':>9} {'serial':>7}" + "".join(
        f" {'msg ' + str(w):>7} {'file ' + str(w):>7} {'ratio':>6} {'start':>6}" for w in counts)
    print(header + "   (ratio: serial / file)", flush=True)
    for n in sizes:
        data = bandit_log(n, 4, np.random.default_rng(0))
        serial = []
        timings = {(w, how): [] for w in counts for how in ("msg", "file", "start")}
        for _ in range(args.repeats):
            took, report = _timed(lambda: cpe.evaluate(data, **options))
            serial.append(took)
            reference = report.to_dict()
            for w in counts:
                for how, same_host in (("msg", False), ("file", True)):
                    took, report = _timed(lambda: evaluate_on_pool(data, options, w, None,
                                                                    same_host))
                    timings[w, how].append(took)
                    assert report.to_dict() == reference, "pool result differs from serial"
                timings[w, "start"].append(_pool_start(w))
        base = statistics.median(serial)
        row = f"{n:>9,} {base:>7.2f}"
        for w in counts:
            msg, file, start = (statistics.median(timings[w, how])
                                for how in ("msg", "file", "start"))
            row += f" {msg:>7.2f} {file:>7.2f} {base / file:>5.2f}x {start:>6.2f}"
        print(row, flush=True)


if __name__ == "__main__":
    main()
