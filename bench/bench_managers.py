"""Manager, lock/event and remote-env benchmarks: fiberrl side by side with the stdlib in one run.

    python bench/bench_managers.py [--quick] [--only NAME ...] [-v]

Libraries (the table's columns):

- ``std-shm``: stdlib ``multiprocessing`` (spawn context) objects without a server:
  ``Lock()`` and ``Event()`` are shared-memory semaphores, so they are much faster
  than any server round trip; their ratios are reported, not targeted;
- ``std-mgr``: objects of a stdlib manager, ``multiprocessing.get_context("spawn")
  .Manager()`` (or a stdlib ``BaseManager`` subclass for the envs): one request/reply
  on a Unix socket per operation, the fair comparison;
- ``fiberrl``: ``fiberrl.Manager()`` objects, ``fiberrl.Lock()``/``Event()`` (kept by
  the coordination service of this process, which calls them directly; a child
  reaches them through the service's socket), fiberrl managers for the envs: one
  request/reply per operation, on an abstract Unix socket between processes of one
  host (TCP between hosts).

Measures:

- ``dict``: manager dict ``d[k] = v`` and ``d[k]`` round trips (p50, p90, mean);
  target fiberrl <= 0.7x the stdlib manager (issue 20: both sides spin briefly for a reply instead of paying a wake-up);
- ``lock_event``: ``Lock`` acquire+release and ``Event`` set() / wait() (already set)
  round trips from this process, the same against each library's manager
  (``Manager().Lock()``), and a child process (``fiberrl.Process`` / stdlib spawn
  ``Process``) timing the acquire+release and wait() loops and reporting them
  through a queue;
- ``envs``: 16 remote ``CartPole-v1`` environments stepped 1,000 times each (reset at
  the end of an episode): one blocking call after another through ordinary proxies
  (both libraries); asynchronously, all 16 steps of a round in flight at once
  (fiberrl: ``AsyncManager`` + ``gather``, with one server or four servers of four envs
  each; the stdlib has no async proxies, its column uses 16 threads making blocking
  calls); and the speed-ups over the serial loop.

All the libraries of a measure are set up at once and timed in alternating rounds
(10 in a full run), so that a shared machine's slow spells fall on each of them
alike. These are measurements, not tests: the machine may be shared and noisy.
"""
import argparse
import concurrent.futures
import contextlib
import functools
import logging
import multiprocessing
import multiprocessing.managers
import os
import platform
import statistics
import sys
import time
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import numpy as np  # noqa: E402

import fiberrl  # noqa: E402
import fiberrl.managers  # noqa: E402
from fiberrl.asyncproxy import AsyncManager, AsyncProxy, gather  # noqa: E402
from time_limits import deadline  # noqa: E402

log = logging.getLogger("bench_managers")

LIBS = ("std-shm", "std-mgr", "fiberrl")
WAIT_S = 120.0  # longest wait for any one result
N_ENVS = 16


# -- remote environments (module level: stdlib spawn servers import them by name) --------
class RemoteCartPole:
    """A gymnasium ``CartPole-v1`` living in a manager server."""

    def __init__(self, seed: int = 0) -> None:
        import gymnasium
        self._env = gymnasium.make("CartPole-v1")
        self._seed = seed

    def reset(self) -> np.ndarray:
        """Start an episode (seeds 0, 1, 2... per env); return the first observation."""
        obs, _info = self._env.reset(seed=self._seed)
        self._seed += 1
        return obs

    def step(self, action: int) -> Tuple[np.ndarray, float, bool, bool]:
        """One step: ``(observation, reward, terminated, truncated)``."""
        obs, reward, terminated, truncated, _info = self._env.step(action)
        return obs, float(reward), bool(terminated), bool(truncated)


ENV_METHODS = ("reset", "step")


class StdEnvManager(multiprocessing.managers.BaseManager):
    """Stdlib manager serving envs (blocking proxies)."""


StdEnvManager.register("CartPole", RemoteCartPole, exposed=ENV_METHODS)


class FiberEnvManager(fiberrl.managers.BaseManager):
    """fiberrl manager serving envs (blocking proxies)."""


FiberEnvManager.register("CartPole", RemoteCartPole, exposed=ENV_METHODS)


class FiberAsyncEnvManager(AsyncManager):
    """fiberrl manager serving envs through asynchronous proxies."""


FiberAsyncEnvManager.register("CartPole", RemoteCartPole, exposed=ENV_METHODS)


# -- timing helpers -----------------------------------------------------------------------
def time_ops(op: Callable[[], Any], n: int, warmup: int = 50) -> List[float]:
    """Seconds taken by each of ``n`` calls of ``op`` (after ``warmup`` untimed ones)."""
    for _ in range(warmup):
        op()
    samples = []
    clock = time.perf_counter
    for _ in range(n):
        started = clock()
        op()
        samples.append(clock() - started)
    return samples


def summary(samples: Sequence[float]) -> Dict[str, float]:
    """p50, p90 and mean of ``samples`` (seconds), in microseconds."""
    return {"p50": statistics.median(samples) * 1e6,
            "p90": statistics.quantiles(samples, n=10)[8] * 1e6,
            "mean": statistics.fmean(samples) * 1e6}


def acquire_release(lock: Any) -> Callable[[], None]:
    """One acquire() and release() of ``lock``."""
    def op() -> None:
        lock.acquire()
        lock.release()
    return op


# -- measures ---------------------------------------------------------------------------------
# Each measure takes (quick, stack, errors): it enters what it starts into ``stack`` (closed
# when it ends), records a library it cannot set up in ``errors`` and goes on with the
# others, and returns {row key: {library: figure}}. Libraries are timed in alternating
# rounds, all set up at once, so that the machine's noise falls on each of them alike.
Figures = Dict[str, Dict[str, float]]


def interleaved(ops: Dict[str, Callable[[], Any]], n: int, rounds: int) -> Dict[str, List[float]]:
    """``n`` timed calls of each library's op, in ``rounds`` alternating rounds."""
    samples: Dict[str, List[float]] = {lib: [] for lib in ops}
    libs = list(ops)
    for r in range(rounds):
        for lib in libs if r % 2 == 0 else reversed(libs):
            samples[lib] += time_ops(ops[lib], n // rounds, warmup=10)
    return samples


def set_up(errors: Dict[str, str], libs: Sequence[str],
           make: Callable[[str], Any]) -> Dict[str, Any]:
    """``{lib: make(lib)}`` for each library whose set-up works; the others go to ``errors``."""
    made = {}
    for lib in libs:
        try:
            made[lib] = make(lib)
        except Exception as exc:  # one library's failure must not stop the others
            log.debug("setting up %s failed", lib, exc_info=True)
            errors[lib] = f"{type(exc).__name__}: {exc}"
    return made


def m_dict(quick: bool, stack: contextlib.ExitStack, errors: Dict[str, str]) -> Figures:
    """Manager dict: ``d[k] = v`` and ``d[k]``, each call timed on its own (us)."""
    n, rounds = (300, 3) if quick else (2000, 10)
    spawn = multiprocessing.get_context("spawn")
    makers = {"std-mgr": spawn.Manager, "fiberrl": fiberrl.Manager}
    dicts = set_up(errors, makers, lambda lib: stack.enter_context(makers[lib]()).dict())

    def setter(shared: Any) -> Callable[[], None]:
        values = iter(range(10 ** 9))
        return lambda: shared.__setitem__("key", next(values))

    sets = interleaved({lib: setter(d) for lib, d in dicts.items()}, n, rounds)
    gets = interleaved({lib: (lambda d=d: d["key"]) for lib, d in dicts.items()}, n, rounds)
    figures: Figures = {"set_p50": {}, "get_p50": {}, "mean": {}, "p90": {}}
    for lib in dicts:
        both = summary(sets[lib] + gets[lib])
        figures["set_p50"][lib] = summary(sets[lib])["p50"]
        figures["get_p50"][lib] = summary(gets[lib])["p50"]
        figures["mean"][lib], figures["p90"][lib] = both["mean"], both["p90"]
    return figures


def m_lock_event(quick: bool, stack: contextlib.ExitStack, errors: Dict[str, str]) -> Figures:
    """Lock and Event round trips from this process, against managers, from a child (us)."""
    n, rounds = (300, 3) if quick else (2000, 10)
    spawn = multiprocessing.get_context("spawn")

    def make(lib: str) -> Dict[str, Any]:
        if lib == "std-shm":
            return {"lock": spawn.Lock(), "event": spawn.Event(), "Process": spawn.Process,
                    "queue": spawn.Queue()}
        if lib == "std-mgr":
            manager = stack.enter_context(spawn.Manager())
            lock = manager.Lock()
            return {"lock": lock, "event": manager.Event(), "mgr_lock": lock,
                    "Process": spawn.Process, "queue": spawn.Queue()}
        manager = stack.enter_context(fiberrl.Manager())  # the fair match of std-mgr's lock
        return {"lock": fiberrl.Lock(), "event": fiberrl.Event(), "mgr_lock": manager.Lock(),
                "Process": fiberrl.Process, "queue": fiberrl.Queue()}

    subjects = set_up(errors, LIBS, make)
    figures: Figures = {}

    def record(prefix: str, samples: Dict[str, List[float]], stats: Sequence[str]) -> None:
        for lib, values in samples.items():
            summarised = summary(values)
            for stat in stats:
                figures.setdefault(f"{prefix}_{stat}", {})[lib] = summarised[stat]

    record("lock", interleaved({lib: acquire_release(s["lock"]) for lib, s in subjects.items()},
                               n, rounds), ("p50", "mean"))
    record("mgr_lock", interleaved({lib: acquire_release(s["mgr_lock"])
                                    for lib, s in subjects.items() if "mgr_lock" in s},
                                   n, rounds), ("p50",))
    for s in subjects.values():
        s["event"].set()
    record("set", interleaved({lib: s["event"].set for lib, s in subjects.items()}, n, rounds),
           ("p50",))
    record("wait", interleaved({lib: s["event"].wait for lib, s in subjects.items()}, n, rounds),
           ("p50",))

    # children: one per library and pass, passes in alternating order, samples pooled
    passes = 1 if quick else 2
    child_lock: Dict[str, List[float]] = {lib: [] for lib in subjects}
    child_wait: Dict[str, List[float]] = {lib: [] for lib in subjects}
    for p in range(passes):
        for lib in list(subjects) if p % 2 == 0 else reversed(list(subjects)):
            s = subjects[lib]
            try:
                lock_samples, wait_samples = run_child(s, n // passes)
            except Exception as exc:
                log.debug("the child of %s failed", lib, exc_info=True)
                errors[lib] = f"child: {type(exc).__name__}: {exc}"
                continue
            child_lock[lib] += lock_samples
            child_wait[lib] += wait_samples
    record("child_lock", {lib: v for lib, v in child_lock.items() if v}, ("p50", "mean"))
    record("child_wait", {lib: v for lib, v in child_wait.items() if v}, ("p50",))
    return figures


def child_loops(lock: Any, event: Any, n: int, results: Any) -> None:
    """In a child process: time ``n`` lock round trips and ``n`` waits on a set event."""
    results.put((time_ops(acquire_release(lock), n), time_ops(event.wait, n)))


def run_child(subject: Dict[str, Any], n: int) -> Tuple[List[float], List[float]]:
    """Start a child running :func:`child_loops` on ``subject``'s objects; its samples."""
    child = subject["Process"](target=child_loops,
                               args=(subject["lock"], subject["event"], n, subject["queue"]))
    child.start()
    try:
        samples = subject["queue"].get(timeout=WAIT_S)
    finally:
        child.join(WAIT_S)
        if child.is_alive():
            child.kill()
            child.join(10)
    if child.exitcode != 0:
        raise RuntimeError(f"the child exited with code {child.exitcode}")
    return samples


def step_serial(envs: Sequence[Any], steps: int, first: int = 0) -> float:
    """``steps`` rounds of one blocking ``step`` per env (reset at episode ends); seconds."""
    started = time.perf_counter()
    for i in range(first, first + steps):
        for env in envs:
            _obs, _reward, terminated, truncated = env.step(i % 2)
            if terminated or truncated:
                env.reset()
    return time.perf_counter() - started


def step_async(envs: Sequence[AsyncProxy], steps: int, first: int = 0) -> float:
    """``steps`` rounds of ``gather([env.step(a) for env in envs])``, then the resets; seconds."""
    started = time.perf_counter()
    for i in range(first, first + steps):
        outcomes = gather([env.step(i % 2) for env in envs], timeout=WAIT_S)
        ended = [env.reset() for env, (_o, _r, terminated, truncated) in zip(envs, outcomes)
                 if terminated or truncated]
        if ended:
            gather(ended, timeout=WAIT_S)
    return time.perf_counter() - started


def step_threads(envs: Sequence[Any], steps: int, pool: concurrent.futures.Executor,
                 first: int = 0) -> float:
    """``steps`` rounds of blocking calls made from one thread per env; seconds."""
    def one(pair: Tuple[int, Any]) -> None:
        i, env = pair
        _obs, _reward, terminated, truncated = env.step(i % 2)
        if terminated or truncated:
            env.reset()

    started = time.perf_counter()
    for i in range(first, first + steps):
        list(pool.map(one, [(i, env) for env in envs]))
    return time.perf_counter() - started


def m_envs(quick: bool, stack: contextlib.ExitStack, errors: Dict[str, str]) -> Figures:
    """16 CartPole envs x ``steps`` steps: serial, async, and the speed-ups (s, x).

    Every variant's envs are up at once (7 servers); the steps are taken in
    alternating rounds and each variant's time is the sum of its rounds.
    """
    steps, rounds, warmup = (100, 2, 5) if quick else (1000, 10, 10)
    runners: Dict[str, Callable[[int, int], float]] = {}  # variant -> run(steps, first)

    def blocking(manager_type: type, **options: Any) -> List[Any]:
        manager = stack.enter_context(manager_type(**options))
        envs = [manager.CartPole(seed) for seed in range(N_ENVS)]
        for env in envs:
            env.reset()
        return envs

    def make(lib: str) -> None:
        if lib == "std-mgr":
            envs = blocking(StdEnvManager, ctx=multiprocessing.get_context("spawn"))
            pool = stack.enter_context(concurrent.futures.ThreadPoolExecutor(N_ENVS))
            runners["std-mgr serial"] = functools.partial(step_serial, envs)
            runners["std-mgr async1"] = functools.partial(step_threads, envs, pool=pool)
            return
        envs = blocking(FiberEnvManager)
        runners["fiberrl serial"] = functools.partial(step_serial, envs)
        for servers in (1, 4):
            managers = [stack.enter_context(FiberAsyncEnvManager()) for _ in range(servers)]
            async_envs = [managers[seed % servers].CartPole(seed) for seed in range(N_ENVS)]
            for env in async_envs:
                stack.callback(env._close)
            gather([env.reset() for env in async_envs], timeout=WAIT_S)
            runners[f"fiberrl async{servers}"] = functools.partial(step_async, async_envs)

    libs = set_up(errors, ("std-mgr", "fiberrl"), make)
    totals = {variant: 0.0 for variant in runners}
    for run in runners.values():
        run(warmup, first=0)  # connections, server threads, the envs' first episodes
    per_round = steps // rounds
    for r in range(rounds):
        for variant in list(runners) if r % 2 == 0 else reversed(list(runners)):
            totals[variant] += runners[variant](per_round, first=warmup + r * per_round)
    figures: Figures = {}
    for variant, seconds in totals.items():
        lib, row = variant.split()
        figures.setdefault(row, {})[lib] = seconds
    for lib in libs:
        for servers in (1, 4):
            if f"{lib} async{servers}" in totals:
                figures.setdefault(f"speedup{servers}", {})[lib] = (
                    totals[f"{lib} serial"] / totals[f"{lib} async{servers}"])
    return figures


# -- targets, rows, measures and the report ---------------------------------------------------
@dataclass(frozen=True)
class Target:
    """fiberrl's figure divided by ``against``'s, ``op`` ``value``."""
    op: str
    value: float
    against: str = "std-mgr"

    def text(self) -> str:
        """The target as printed."""
        return f"fib/{self.against.split('-')[1]} {self.op} {self.value:g}x"

    def met(self, figures: Dict[str, float]) -> str:
        """'yes', 'NO', or '?' when a figure is missing."""
        if "fiberrl" not in figures or self.against not in figures:
            return "?"
        ratio = figures["fiberrl"] / figures[self.against]
        ok = {"<=": ratio <= self.value, ">=": ratio >= self.value}[self.op]
        return "yes" if ok else "NO"


@dataclass(frozen=True)
class Row:
    key: str
    label: str
    unit: str
    target: Optional[Target] = None


@dataclass
class Measure:
    name: str
    func: Callable[[bool, contextlib.ExitStack, Dict[str, str]], Figures]
    rows: List[Row]
    libs: Tuple[str, ...] = LIBS
    budget_s: float = 300.0


MEASURES = [
    Measure("dict", m_dict, [
        Row("set_p50", "mgr dict d[k]=v p50", "us", Target("<=", 0.7)),
        Row("get_p50", "mgr dict d[k] p50", "us", Target("<=", 0.7)),
        Row("mean", "mgr dict set+get mean", "us", Target("<=", 0.7)),
        Row("p90", "mgr dict set+get p90", "us")],
        libs=("std-mgr", "fiberrl")),
    Measure("lock_event", m_lock_event, [
        Row("lock_p50", "Lock acquire+release p50", "us"),
        Row("lock_mean", "Lock acquire+release mean", "us"),
        Row("mgr_lock_p50", "Manager().Lock() acq+rel p50", "us"),
        Row("set_p50", "Event set() p50", "us"),
        Row("wait_p50", "Event wait() (set) p50", "us"),
        Row("child_lock_p50", "child: Lock acq+rel p50", "us"),
        Row("child_lock_mean", "child: Lock acq+rel mean", "us"),
        Row("child_wait_p50", "child: Event wait() p50", "us")]),
    Measure("envs", m_envs, [
        Row("serial", f"{N_ENVS} envs: serial blocking", "s"),
        Row("async1", f"{N_ENVS} envs: async (std: threads)", "s"),
        Row("async4", f"{N_ENVS} envs: async, 4 servers", "s"),
        Row("speedup1", "speed-up serial/async", "x"),
        Row("speedup4", "speed-up serial/async, 4 srv", "x")],
        libs=("std-mgr", "fiberrl")),
]

COLUMNS = "{:<31} {:>9} {:>9} {:>9} {:<5} {:>8} {:>8}  {:<14} {:<3}"


def fmt(value: float) -> str:
    """A figure with a sensible number of digits."""
    return f"{value:,.0f}" if value >= 1000 else f"{value:.1f}" if value >= 10 else f"{value:.2f}"


def run_measure(measure: Measure, quick: bool) -> Tuple[Figures, Dict[str, str]]:
    """Run a measure: ({row key: {lib: figure}}, {lib: error}); never raises."""
    errors: Dict[str, str] = {}
    log.info("%s", measure.name)
    try:
        with deadline(measure.budget_s, measure.name), contextlib.ExitStack() as stack:
            figures = measure.func(quick, stack, errors)
    except Exception as exc:  # one measure's failure must not stop the run
        log.debug("%s failed", measure.name, exc_info=True)
        errors["all"] = f"{type(exc).__name__}: {exc}"
        figures = {}
    return {row.key: figures.get(row.key, {}) for row in measure.rows}, errors


def report(measure: Measure, figures: Dict[str, Dict[str, float]], errors: Dict[str, str],
           note: str) -> None:
    """Print a measure's rows, then its errors and its note."""
    for row in measure.rows:
        values = figures[row.key]
        cells = ["n/a" if lib not in measure.libs else fmt(values[lib]) if lib in values
                 else "error" if lib in errors or "all" in errors else "-" for lib in LIBS]
        ratios = [f"{values['fiberrl'] / values[lib]:.2f}"
                  if "fiberrl" in values and lib in values else "-" for lib in LIBS[:2]]
        target = row.target.text() if row.target else "(report only)"
        met = row.target.met(values) if row.target else ""
        print(COLUMNS.format(row.label, *cells, row.unit, *ratios, target, met))
    for lib, error in errors.items():
        print(f"    {measure.name} on {lib}: {error[:300]}")
    if note:
        print(f"    {note}")


def main() -> None:
    """Parse the command line, run the chosen measures, print the table."""
    names = [m.name for m in MEASURES]
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer operations and steps")
    parser.add_argument("--only", nargs="+", choices=names, metavar="NAME",
                        help=f"measures to run, among: {', '.join(names)}")
    parser.add_argument("-v", "--verbose", action="store_true", help="progress and tracebacks")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    log.setLevel(logging.DEBUG if args.verbose else logging.WARNING)
    sys.stdout.reconfigure(line_buffering=True)  # rows appear as measures finish

    ops, rounds, steps, warmup = (300, 3, 100, 5) if args.quick else (2000, 10, 1000, 10)
    notes = {"dict": f"{ops} sets, then {ops} gets, per library, in {rounds} alternating "
                     "rounds of each (10 untimed ops before each round)",
             "lock_event": f"{ops} ops per row and library, in {rounds} alternating rounds; "
                           "fiberrl.Lock()/Event() live in this process's coordination "
                           "service: called directly here, reached by the child through "
                           "its same-host socket (TCP across hosts)",
             "envs": f"{N_ENVS} envs x {steps} steps (actions 0,1,0,1...) per variant, in "
                     f"{2 if args.quick else 10} alternating rounds, after {warmup} untimed "
                     "steps; fiberrl async = AsyncManager + gather"}
    print(f"bench_managers: python {platform.python_version()}, {os.cpu_count()} cpus, "
          f"{'quick' if args.quick else 'full'} run")
    print(COLUMNS.format("measure", *LIBS, "unit", "fib/shm", "fib/mgr", "target", "met"))
    for measure in MEASURES:
        if args.only and measure.name not in args.only:
            continue
        report(measure, *run_measure(measure, args.quick), notes[measure.name])


if __name__ == "__main__":
    main()
