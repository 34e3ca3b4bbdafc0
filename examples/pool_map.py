"""A fiberrl Pool as the README's "The pool" section uses it: map, lazy imap over an
endless generator, resize and stats. Run: .venv/bin/python examples/pool_map.py"""
import itertools

import fiberrl as mp


def evaluate(candidate):
    """Score one candidate (here: a cheap closed-form score)."""
    return -sum((x - 0.5) ** 2 for x in candidate)


def simulate(seed):
    """One simulated episode's return (here: a seeded pseudo-random number)."""
    return (seed * 7919) % 100 / 100.0


def endless_generator():
    """Seeds forever: imap reads them lazily, a bounded window ahead."""
    return itertools.count()


if __name__ == "__main__":
    population = [[i / 10, 1 - i / 10] for i in range(11)]
    with mp.Pool(2, max_task_retries=3, heartbeat_timeout=10, idle_timeout=None) as pool:
        scores = pool.map(evaluate, population, progress=True)   # text bar on stderr
        for result in pool.imap(simulate, endless_generator()):   # read lazily, bounded
            if result > 0.9:
                break
        pool.resize(4)         # grow (or shrink) while it runs
        print(pool.stats())    # PoolStats(target=4, alive=2, starting=2, queued=..., ...)
    print("best candidate", population[scores.index(max(scores))], "first result > 0.9:", result)
