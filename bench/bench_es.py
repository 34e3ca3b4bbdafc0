"""OpenAI-ES (rl.algos.es) benchmarks: CartPole acceptance, pool scaling, a large
population, and a short run on any fiberrl backend.

    python bench/bench_es.py [--only acceptance,scaling,large,run] [--backend local|slurm|...]
                             [--seeds 0,1,2] [--budget 200000] [--workers 1,2,4] [-v]

Sections (default: acceptance, scaling, large; ``run`` is meant for other backends):

- ``acceptance``: ES with its defaults on CartPole-v1, one run per seed for
  ``--budget`` training env steps on a ``Pool(2)``. After every generation the
  unperturbed policy is evaluated (10 deterministic episodes,
  :func:`rl.evaluation.evaluate`); the table gives the training env steps at the
  first evaluation >= 475, the final evaluation and the wall time. Target:
  every seed reaches 475 within 200,000 steps.
- ``scaling``: seconds the pool spends evaluating one generation of 512
  Pendulum-v1 episodes (200 steps each, so every generation costs the same
  102,400 steps) with 1, 2 and 4 workers, after one warm-up generation (workers
  up, noise tables built); the worker counts take turns for 5 rounds, and the
  best and median rounds are shown. Speed-up is against 1 worker (best rounds).
- ``large``: a population of 2,000 CartPole episodes (125 tasks) runs.
- ``run``: a short CartPole run (``--generations``, default 10) with per-generation
  figures, and the time from the pool's creation to the first generation's end.

``--backend slurm`` calls ``fiberrl.init(backend="slurm")``; SLURM_CONF must name the
cluster (``eval "$(bash scripts/slurm-up.sh single | tail -1)"``) and
FIBERRL_LISTEN_HOST a routable address of this machine. These are measurements,
not tests: the machine may be shared and noisy.
"""
import argparse
import contextlib
import logging
import os
import statistics
import sys
import time

for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import fiberrl  # noqa: E402
from rl.algos.es import ES  # noqa: E402
from rl.evaluation import evaluate  # noqa: E402

log = logging.getLogger("bench_es")
SOLVED = 475.0


@contextlib.contextmanager
def pool_of(workers):
    """A ``fiberrl.Pool(workers)``, closed and joined on the way out."""
    pool = fiberrl.Pool(workers)
    try:
        yield pool
    finally:
        pool.close()
        pool.join()


def table(title, header, rows):
    """Print ``rows`` under ``header`` as an aligned text table."""
    cells = [header] + [[str(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    print(f"\n{title}")
    for i, row in enumerate(cells):
        print("  ".join(c.rjust(w) for c, w in zip(row, widths)))
        if i == 0:
            print("  ".join("-" * w for w in widths))
    sys.stdout.flush()


def acceptance(seeds, budget, workers):
    """Env steps to the first evaluation >= 475 and the final evaluation, per seed."""
    rows = []
    with pool_of(workers) as pool:
        for seed in seeds:
            started = time.perf_counter()
            es = ES("CartPole-v1", seed=seed, pool=pool)
            first, generations, score = None, 0, 0.0
            while es.env_steps < budget:
                es.generation()
                generations += 1
                score = evaluate(es, "CartPole-v1", episodes=10).mean
                log.info("seed %d generation %d: %d steps, eval %.1f", seed, generations,
                         es.env_steps, score)
                if first is None and score >= SOLVED:
                    first = (es.env_steps, generations)
            rows.append([seed, "-" if first is None else first[0], "-" if first is None else first[1],
                         generations, es.env_steps, f"{score:.1f}", f"{time.perf_counter() - started:.1f}",
                         "yes" if first is not None and first[0] <= budget else "NO"])
    table(f"CartPole-v1 acceptance (ES defaults, Pool({workers}), eval = 10 deterministic episodes, "
          f"budget {budget:,} steps)",
          ["seed", "steps@475", "gen@475", "gens", "steps", "final eval", "wall s", ">=475 in budget"], rows)


def scaling(worker_counts, population=512, rounds=5):
    """Pool evaluation seconds per generation of fixed-length Pendulum episodes.

    All pools stay up and the worker counts take turns, round after round, so that
    load from other users of a shared machine spreads over every count; the table
    gives the best and the median round, and the speed-up of the best rounds.
    """
    samples = {w: [] for w in worker_counts}
    with contextlib.ExitStack() as stack:
        runs = {}
        for workers in worker_counts:
            pool = stack.enter_context(pool_of(workers))
            runs[workers] = ES("Pendulum-v1", population=population, hidden=(32, 32), pool=pool, seed=0)
            runs[workers].generation()  # warm-up: workers start, noise tables are built
        for _ in range(rounds):
            for workers in worker_counts:
                samples[workers].append(runs[workers].generation())
    rows, base = [], None
    for workers, gens in samples.items():
        best = min(g.stats["pool_eval_s"] for g in gens)
        median = statistics.median(g.stats["pool_eval_s"] for g in gens)
        task_s = min(g.stats["worker_s"] for g in gens)
        steps = gens[0].env_steps
        base = base or best
        rows.append([workers, population, steps, f"{best:.2f}", f"{median:.2f}", f"{task_s:.2f}",
                     f"{steps / best:,.0f}", f"{base / best:.2f}x"])
    table(f"Scaling: one generation of {population} Pendulum-v1 episodes (200 steps each), "
          f"{os.cpu_count()} cores, {rounds} rounds",
          ["workers", "episodes", "env steps", "pool eval s (best)", "(median)", "task s (sum, best)",
           "steps/s (best)", "speed-up (best)"], rows)


def large(workers, population=2000):
    """A generation of a population in the thousands."""
    rows = []
    with pool_of(workers) as pool:
        es = ES("CartPole-v1", population=population, pool=pool, seed=0)
        for _ in range(2):
            g = es.generation()
            rows.append([es.generations, population, int(g.stats["tasks"]), g.env_steps,
                         f"{g.stats['return_mean']:.1f}", f"{g.stats['pool_eval_s']:.2f}",
                         f"{g.stats['generation_s']:.2f}"])
    table(f"Large population: CartPole-v1, Pool({workers})",
          ["gen", "episodes", "tasks", "env steps", "mean return", "pool eval s", "generation s"], rows)


def short_run(workers, generations, backend):
    """A short CartPole run with per-generation figures."""
    rows = []
    created = time.perf_counter()
    with pool_of(workers) as pool:
        es = ES("CartPole-v1", pool=pool, seed=0)
        for _ in range(generations):
            g = es.generation()
            score = evaluate(es, "CartPole-v1", episodes=10).mean
            if es.generations == 1:
                first_s = time.perf_counter() - created
            rows.append([es.generations, g.env_steps, es.env_steps, f"{g.stats['return_mean']:.1f}",
                         f"{score:.1f}", f"{g.stats['pool_eval_s']:.2f}", f"{g.stats['worker_s']:.2f}",
                         f"{g.stats['generation_s']:.2f}"])
    table(f"Short CartPole-v1 run on backend {backend!r}, Pool({workers}); pool created -> "
          f"first generation done: {first_s:.2f} s",
          ["gen", "gen steps", "total steps", "mean return", "eval", "pool eval s", "task s (sum)",
           "generation s"], rows)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--only", default="acceptance,scaling,large",
                        help="comma-separated sections: acceptance, scaling, large, run")
    parser.add_argument("--backend", default=None, help="fiberrl backend (default: local)")
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--budget", type=int, default=200_000, help="training env steps per seed")
    parser.add_argument("--workers", default="1,2,4", help="worker counts for the scaling section")
    parser.add_argument("--pool", type=int, default=2, help="workers for the other sections")
    parser.add_argument("--generations", type=int, default=10, help="generations of the run section")
    parser.add_argument("-v", "--verbose", action="store_true")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(asctime)s %(name)s %(message)s")
    if args.backend:
        fiberrl.init(backend=args.backend)
    backend = args.backend or "local"
    sections = args.only.split(",")
    print(f"bench_es: backend {backend}, {os.cpu_count()} cores, sections {sections}")
    if "acceptance" in sections:
        acceptance([int(s) for s in args.seeds.split(",")], args.budget, args.pool)
    if "scaling" in sections:
        scaling([int(w) for w in args.workers.split(",")])
    if "large" in sections:
        large(args.pool)
    if "run" in sections:
        short_run(args.pool, args.generations, backend)


if __name__ == "__main__":
    main()
