"""Estimate pi with job-backed processes and a queue: the stdlib code, with one import changed.

    python examples/monte_carlo_pi.py [--workers 4] [--samples 2000000] [--backend local]
"""
import argparse
import logging
import random
import time

import fiberrl as mp

logger = logging.getLogger("monte_carlo_pi")


def count_inside(samples: int, seed: int, results) -> None:
    """Throw ``samples`` darts at the unit square; report how many land in the circle."""
    rng = random.Random(seed)
    inside = sum(1 for _ in range(samples) if rng.random() ** 2 + rng.random() ** 2 <= 1.0)
    results.put((samples, inside))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--samples", type=int, default=2_000_000, help="darts in total")
    parser.add_argument("--backend", default=None, help="fiberrl backend (default: config)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if args.backend:
        mp.init(backend=args.backend)

    started = time.monotonic()
    results = mp.Queue()
    share = args.samples // args.workers
    workers = [mp.Process(target=count_inside, args=(share, seed, results))
               for seed in range(args.workers)]
    for worker in workers:
        worker.start()
    total = inside = 0
    for _ in workers:
        samples, hits = results.get(timeout=600)
        total, inside = total + samples, inside + hits
    for worker in workers:
        worker.join()
        if worker.exitcode != 0:
            raise SystemExit(f"{worker.name} failed: {worker.exit_reason}")
    logger.info("pi ~ %.5f from %d darts on %d jobs (%s backend) in %.2f s",
                4.0 * inside / total, total, args.workers,
                args.backend or "configured", time.monotonic() - started)


if __name__ == "__main__":
    main()
