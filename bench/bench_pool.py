"""Pool benchmarks: fiberrl.Pool side by side with stdlib multiprocessing.Pool in one run.

    python bench/bench_pool.py [--quick] [--only NAME ...] [--libs fork,spawn,fiberrl,ray] [-v]

Libraries: ``fork`` and ``spawn`` are ``multiprocessing.get_context(...).Pool``,
``fiberrl`` is ``fiberrl.Pool``, ``ray`` is ``ray.util.multiprocessing.Pool`` (run by
default where ray is installed, on the measures listed for it: see ``Measure.libs``).
For each measure the table gives every library's figure, the ratios
fiberrl/stdlib-fork, fiberrl/stdlib-spawn and ray/stdlib-fork, the target (stated
in the direction of the ratio) and whether it is met. A library that fails a measure
shows ``error`` in its cell and the error under the measure's rows; the run goes on.

Measures: noop_chunk1, noop_default, sleep_overhead, apply_latency, cold_start,
cold_interpreter (a fresh interpreter: import, Pool(4), first result),
es_loop (2 workers: the same 100k-float32 vector in all 64 tasks of an iteration),
es_broadcast (the same with a 10M-float32 vector, 40 MB, new every iteration, and tasks of
~20 ms: its ratio to the ideal),
recovery (fiberrl only: a task's re-run after its worker is SIGKILLed, with
the pool's other worker idle, then busy), idle_worker_memory (spawn and fiberrl).
Pools are warmed up with one small map, except for cold_start. BLAS threads are
pinned to one (before numpy is imported) so that workers do not oversubscribe cores.
These are measurements, not tests: the machine may be shared and noisy.
"""
import argparse
import contextlib
import logging
import multiprocessing
import os
import platform
import signal
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import Callable, Optional

for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import psutil  # noqa: E402

import fiberrl  # noqa: E402
from pool_bench_kit import WAIT_S, nap, open_pool, shutdown  # noqa: E402
from time_limits import deadline  # noqa: E402
from pool_es import es_big_setup, es_setup, m_es_broadcast, m_es_loop  # noqa: E402

log = logging.getLogger("bench_pool")

class _Ray:
    """``ray.util.multiprocessing`` with ray started once, quietly, on this machine."""

    def __getattr__(self, name):
        import ray
        from ray.util import multiprocessing as ray_mp
        if not ray.is_initialized():
            ray.init(num_cpus=os.cpu_count(), include_dashboard=False,
                     logging_level=logging.ERROR, log_to_driver=False)
        return getattr(ray_mp, name)


def _have_ray():
    import importlib.util
    return importlib.util.find_spec("ray") is not None


LIBRARIES = {
    "fork": lambda: multiprocessing.get_context("fork"),
    "spawn": lambda: multiprocessing.get_context("spawn"),
    "fiberrl": lambda: fiberrl,
    "ray": _Ray,
}
RECOVERY_SLEEP_S, BLOCKER_S = 5.0, 2.0
MIB = 1024 * 1024


# -- task functions (module level, so that stdlib spawn can pickle them) ---------------
def noop(_):
    """Does nothing."""
    return None


def ident(x):
    """Returns its argument."""
    return x


def attempt(path, sleep_s):
    """Appends ``pid start-time`` to ``path``; the first attempt then sleeps ``sleep_s``."""
    with open(path, "a+") as fh:
        fh.write(f"{os.getpid()} {time.time()!r}\n")
        fh.flush()
        fh.seek(0)
        count = len(fh.readlines())
    if count == 1:
        time.sleep(sleep_s)
    return count


def worker_pids(pool):
    """Pids of a pool's workers: ``pool.workers()`` (fiberrl) or ``pool._pool`` (stdlib)."""
    workers = pool.workers() if hasattr(pool, "workers") else pool._pool
    return [w.pid for w in workers]


def map_rate(pool, n, chunksize, repeats):
    """Median tasks/s of ``map(noop, range(n))`` over ``repeats`` runs."""
    rates = []
    for _ in range(repeats):
        started = time.perf_counter()
        pool.map_async(noop, range(n), chunksize=chunksize).get(timeout=WAIT_S)
        rates.append(n / (time.perf_counter() - started))
    return statistics.median(rates)


def wait_lines(path, count, timeout):
    """Poll ``path`` until it holds ``count`` complete lines; returns them as (pid, time)."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        with contextlib.suppress(FileNotFoundError), open(path) as fh:
            lines = [ln.split() for ln in fh.readlines() if ln.endswith("\n")]
            if len(lines) >= count:
                return [(int(pid), float(when)) for pid, when in lines]
        time.sleep(0.001)
    raise TimeoutError(f"{path} did not reach {count} line(s) in {timeout:.0f} s")


# -- measures: each takes (lib, quick) and returns {row key: figure} -------------------
def noop_rates(lib, chunksize, repeats, sizes=(2, 4)):
    """No-op map over 20,000 items with each of ``sizes`` workers, median of ``repeats``
    (k tasks/s)."""
    out = {}
    for workers in sizes:
        with open_pool(lib, workers) as pool:
            out[f"w{workers}"] = map_rate(pool, 20_000, chunksize, repeats) / 1e3
    return out


def m_noop_chunk1(lib, quick):
    """No-op map, chunksize=1."""
    return noop_rates(lib, 1, 1 if quick else 3)


def m_noop_default(lib, quick):
    """No-op map, default chunksize (a very fast operation: median of 20 runs), 2, 4
    and 15 workers (issue 32's sizes; 15 is for a 16-core machine)."""
    return noop_rates(lib, None, 20, sizes=(2, 4, 15))


SLEEPS = (0.001, 0.010, 0.100)


def m_sleep_overhead(lib, quick):
    """sleep(d) tasks, chunksize=1, 4 workers, ideal time n*d/4 ~ 2 s: elapsed/ideal."""
    ideal = 1.0 if quick else 2.0
    out = {}
    with open_pool(lib, 4) as pool:
        for d in SLEEPS:
            n = round(ideal * 4 / d)
            started = time.perf_counter()
            pool.map_async(nap, [d] * n, chunksize=1).get(timeout=WAIT_S)
            out[f"{d * 1e3:g}ms"] = (time.perf_counter() - started) / (n * d / 4)
    return out


def m_apply_latency(lib, quick):
    """apply_async(ident, (1,)).get() round trips with 2 workers: p50 and p90 (us)."""
    samples = []
    with open_pool(lib, 2) as pool:
        for _ in range(500 if quick else 2000):
            started = time.perf_counter()
            pool.apply_async(ident, (1,)).get(timeout=WAIT_S)
            samples.append(time.perf_counter() - started)
    deciles = statistics.quantiles(samples, n=10)
    return {"p50": statistics.median(samples) * 1e6, "p90": deciles[8] * 1e6}


def m_cold_start(lib, quick):
    """Pool(4) constructor to the first apply result, median of 5 runs (ms)."""
    samples = []
    for _ in range(3 if quick else 5):
        started = time.perf_counter()
        pool = lib.Pool(4)
        try:
            pool.apply_async(ident, (1,)).get(timeout=WAIT_S)
            samples.append(time.perf_counter() - started)
        finally:
            shutdown(pool)
    return {"first": statistics.median(samples) * 1e3}


_COLD_SCRIPT = """
import time
started = time.perf_counter()
import sys
if sys.argv[1] == "fiberrl":
    import fiberrl as ctx
else:
    import multiprocessing
    ctx = multiprocessing.get_context(sys.argv[1])

if __name__ == "__main__":
    pool = ctx.Pool(4)
    pool.apply(abs, (-1,))
    print(time.perf_counter() - started)
    pool.terminate()
    pool.join()
"""


def m_cold_interpreter(lib, quick):
    """A fresh interpreter's ``import``, ``Pool(4)`` and first ``apply`` result, timed
    inside the script from its first line, median of 5 runs (ms)."""
    import subprocess
    name = "fiberrl" if lib is fiberrl else lib.get_start_method()
    with tempfile.TemporaryDirectory(prefix="bench_cold_") as tmp:
        script = os.path.join(tmp, "cold.py")
        with open(script, "w") as fh:
            fh.write(_COLD_SCRIPT)
        samples = []
        for _ in range(3 if quick else 5):
            out = subprocess.run([sys.executable, script, name], capture_output=True, text=True,
                                 timeout=WAIT_S, cwd=tmp)
            if out.returncode != 0:
                raise RuntimeError(out.stderr[-500:])
            samples.append(float(out.stdout.split()[-1]))
    return {"first": statistics.median(samples) * 1e3}


def wait_idle(pool, timeout=WAIT_S):
    """Wait until every worker of a fiberrl pool is connected and idle (``pool.stats()``)."""
    end = time.monotonic() + timeout
    while (stats := pool.stats()).idle < stats.target:
        if time.monotonic() > end:
            raise TimeoutError(f"pool not back to {stats.target} idle workers: {stats}")
        time.sleep(0.005)


def recover_once(pool, busy):
    """SIGKILL the worker running a sleeping task, the other worker idle or (``busy``)
    running a BLOCKER_S task; seconds from the kill until the task starts again."""
    wait_idle(pool)
    with tempfile.TemporaryDirectory(prefix="bench_pool_") as tmp:
        path, other = os.path.join(tmp, "attempts"), os.path.join(tmp, "blocker")
        result = pool.apply_async(attempt, (path, RECOVERY_SLEEP_S))
        blocker = pool.apply_async(attempt, (other, BLOCKER_S)) if busy else None
        (pid, _), = wait_lines(path, 1, WAIT_S)
        if busy and wait_lines(other, 1, WAIT_S)[0][0] == pid:
            raise RuntimeError("the task and the blocker ran in the same worker")
        pids = worker_pids(pool)
        if pid not in pids:
            raise RuntimeError(f"task runs in pid {pid}, not in pool.workers() pids {pids}")
        killed = time.time()
        os.kill(pid, signal.SIGKILL)
        rerun = wait_lines(path, 2, 30.0)[1][1]
        result.get(timeout=WAIT_S)
        if blocker:
            blocker.get(timeout=WAIT_S)
        return rerun - killed


def m_recovery(lib, quick):
    """Pool(2): kill the worker of a running task, time until its re-run starts (ms),
    with the other worker idle (re-dispatch) and busy (wait for a replacement)."""
    out = {}
    with open_pool(lib, 2) as pool:
        for case, busy in (("idle", False), ("busy", True)):
            samples = [recover_once(pool, busy) for _ in range(3 if quick else 5)]
            out[f"{case}_p50"] = statistics.median(samples) * 1e3
            out[f"{case}_max"] = max(samples) * 1e3
    return out


def m_idle_memory(lib, quick):
    """RSS and USS of an idle worker of a warmed-up Pool(4), median over workers (MiB)."""
    with open_pool(lib, 4) as pool:
        time.sleep(0.5)
        infos = [psutil.Process(pid).memory_full_info() for pid in worker_pids(pool)]
    return {"rss": statistics.median(i.rss for i in infos) / MIB,
            "uss": statistics.median(i.uss for i in infos) / MIB}


# -- targets, rows, measures and the report -------------------------------------------
@dataclass(frozen=True)
class Target:
    """fiberrl's figure, divided by ``against``'s (or alone if empty), ``op`` ``value``."""
    op: str
    value: float
    against: tuple = ("fork", "spawn")

    def text(self, unit):
        """The target as printed."""
        if not self.against:
            return f"fiberrl {self.op} {self.value:g} {unit}"
        name = "std" if len(self.against) > 1 else self.against[0]
        return f"fib/{name} {self.op} {self.value:g}x"

    def met(self, figures):
        """'yes', 'NO', or '?' when the figures needed are missing."""
        ours = figures.get("fiberrl")
        theirs = [figures[lib] for lib in self.against if lib in figures]
        if ours is None or (self.against and not theirs):
            return "?"
        checks = [ours / t for t in theirs] if self.against else [ours]
        ok = {">=": float.__ge__, "<=": float.__le__, "<": float.__lt__}[self.op]
        return "yes" if all(ok(float(c), self.value) for c in checks) else "NO"


@dataclass(frozen=True)
class Row:
    key: str
    label: str
    unit: str
    target: Optional[Target] = None


@dataclass
class Measure:
    name: str
    func: Callable
    rows: list
    libs: tuple = ("fork", "spawn", "fiberrl")
    budget_s: float = 300.0
    setup: Optional[Callable] = None
    rounds: int = 1   # >1: the libraries take turns, round after round; medians are shown


MEASURES = [
    Measure("noop_chunk1", m_noop_chunk1, [
        Row("w2", "noop map chunk=1, 2 workers", "ktask/s", Target(">=", 3)),   # issue 20
        Row("w4", "noop map chunk=1, 4 workers", "ktask/s", Target(">=", 3))]),
    Measure("noop_default", m_noop_default, [
        Row("w2", "noop map default chunk, 2 w", "ktask/s", Target(">=", 1)),   # issue 32
        Row("w4", "noop map default chunk, 4 w", "ktask/s", Target(">=", 1)),
        Row("w15", "noop map default chunk, 15 w", "ktask/s", Target(">=", 1))]),
    Measure("sleep_overhead", m_sleep_overhead, [
        Row(f"{d * 1e3:g}ms", f"sleep {d * 1e3:g} ms tasks, 4 w", "x ideal", Target("<=", 1))
        for d in SLEEPS]),
    Measure("apply_latency", m_apply_latency, [
        Row("p50", "apply round trip p50, 2 w", "us", Target("<=", 1.2)),   # issue 20
        Row("p90", "apply round trip p90, 2 w", "us")]),
    Measure("cold_start", m_cold_start, [
        Row("first", "Pool(4) to first apply result", "ms", Target("<=", 1, ("spawn",)))]),
    Measure("cold_interpreter", m_cold_interpreter, [
        Row("first", "fresh python: Pool(4) 1st result", "ms", Target("<=", 1, ("spawn",)))],
        rounds=3),   # issue 32
    Measure("es_loop", m_es_loop, [
        Row("its", "ES loop 64x100k, 2 w", "iter/s", Target(">=", 1.8, ("fork",))),
        Row("maps", "  its map alone (no update)", "maps/s", Target(">=", 1.8, ("fork",))),
        Row("update", "  its update, in the caller", "ms"),
        Row("ideal", "  ideal loop: update + 64 t/2 w", "iter/s"),
        Row("map_ideal", "  map: ideal time / measured", "x")],
        setup=es_setup, libs=("fork", "spawn", "fiberrl", "ray"), rounds=3),
    Measure("es_broadcast", m_es_broadcast, [
        Row("s_it", "ES loop 64x40 MB new each it, 2w", "s/iter"),
        Row("map_s", "  its map alone", "s"),
        Row("update", "  its update, in the caller", "ms"),
        Row("task", "  one task, serially, before", "ms"),
        Row("ideal", "  ideal: update + 64 t/2 w", "s/iter"),
        Row("x_ideal", "  measured / ideal", "x", Target("<=", 1.3, ())),   # issue 32
        Row("control", "  the map with a 4 KB vector", "s"),
        Row("x_control", "  map / that map (broadcast cost)", "x")],
        setup=es_big_setup, rounds=3),
    Measure("recovery", m_recovery, [
        Row(f"{case}_{stat}", f"kill to re-run {stat}, other {case}", "ms",
            Target("<", 1000, ())) for case in ("idle", "busy") for stat in ("p50", "max")],
        libs=("fiberrl",)),
    Measure("idle_worker_memory", m_idle_memory, [
        Row("rss", "idle worker RSS (median)", "MiB"),
        Row("uss", "idle worker USS (median)", "MiB")],
        libs=("spawn", "fiberrl")),
]

COLUMNS = "{:<31} {:>9} {:>9} {:>9} {:>9} {:<8} {:>8} {:>9} {:>8}  {:<17} {:<3}"
SHOWN = ("fork", "spawn", "ray", "fiberrl")


def fmt(value):
    """A figure with a sensible number of digits."""
    return f"{value:,.0f}" if value >= 1000 else f"{value:.1f}" if value >= 10 else f"{value:.2f}"


def run_measure(measure, libs, quick):
    """Run a measure on each library: ({row key: {lib: figure}}, {lib: error}, notes)."""
    kwargs, notes = {}, []
    if measure.setup:
        kwargs, note = measure.setup(quick)
        notes.append(note)
    samples, errors = {row.key: {} for row in measure.rows}, {}
    rounds = 1 if quick else measure.rounds
    for _ in range(rounds):
        for name in libs:
            if name not in measure.libs or name in errors:
                continue
            log.info("%s: %s", measure.name, name)
            try:
                with deadline(measure.budget_s, f"{measure.name} on {name}"):
                    result = measure.func(LIBRARIES[name](), quick, **kwargs)
            except Exception as exc:  # one library's failure must not stop the run
                log.debug("%s failed on %s", measure.name, name, exc_info=True)
                errors[name] = f"{type(exc).__name__}: {exc}"
                continue
            for key, value in result.items():
                samples[key].setdefault(name, []).append(value)
    figures = {key: {name: statistics.median(values) for name, values in per_lib.items()}
               for key, per_lib in samples.items()}
    if rounds > 1:
        for key, per_lib in samples.items():
            spread = ", ".join(f"{name} {fmt(min(v))}-{fmt(max(v))}" for name, v in per_lib.items())
            notes.append(f"{key}: median of {rounds} interleaved rounds; range {spread}")
    return figures, errors, notes


def report(measure, libs, figures, errors, notes):
    """Print a measure's rows, then its errors and notes."""
    for row in measure.rows:
        values = figures[row.key]
        cells = []
        for name in SHOWN:
            if name not in libs or name not in measure.libs:
                cells.append("n/a")
            else:
                cells.append("error" if name in errors else fmt(values[name])
                             if name in values else "-")
        ratios = [f"{values[a] / values[b]:.2f}" if a in values and b in values else "-"
                  for a, b in (("fiberrl", "fork"), ("fiberrl", "spawn"), ("ray", "fork"))]
        target = row.target.text(row.unit) if row.target else "(report only)"
        met = row.target.met(values) if row.target else ""
        print(COLUMNS.format(row.label, *cells, row.unit, *ratios, target, met))
    for name, error in errors.items():
        print(f"    {measure.name} on {name}: {error[:300]}")
    for note in notes:
        print(f"    {note}")


def main():
    """Parse the command line, run the chosen measures, print the table."""
    names = [m.name for m in MEASURES]
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer rounds, shorter runs")
    parser.add_argument("--only", nargs="+", choices=names, metavar="NAME",
                        help=f"measures to run, among: {', '.join(names)}")
    parser.add_argument("--libs", default=None,
                        help="comma-separated libraries among fork, spawn, fiberrl, ray "
                             "(default: all, ray where installed)")
    parser.add_argument("-v", "--verbose", action="store_true", help="progress and tracebacks")
    args = parser.parse_args()
    default = "fork,spawn,fiberrl" + (",ray" if _have_ray() else "")
    libs = [lib.strip() for lib in (args.libs or default).split(",") if lib.strip()]
    unknown = sorted(set(libs) - set(LIBRARIES))
    if unknown:
        parser.error(f"unknown libraries {unknown}; choose among {sorted(LIBRARIES)}")
    logging.basicConfig(level=logging.WARNING,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    log.setLevel(logging.DEBUG if args.verbose else logging.WARNING)
    sys.stdout.reconfigure(line_buffering=True)  # rows appear as measures finish

    print(f"bench_pool: python {platform.python_version()}, {os.cpu_count()} cpus, "
          f"{'quick' if args.quick else 'full'} run, libs: {', '.join(libs)}")
    print(COLUMNS.format("measure", *SHOWN, "unit", "fib/fork", "fib/spawn", "ray/fork",
                         "target", "met"))
    for measure in MEASURES:
        if (args.only and measure.name not in args.only) or not set(libs) & set(measure.libs):
            continue
        report(measure, libs, *run_measure(measure, libs, args.quick))


if __name__ == "__main__":
    main()
