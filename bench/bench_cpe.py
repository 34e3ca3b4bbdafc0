"""Timings for cpe on large synthetic logs (run by hand: ``python bench/bench_cpe.py``).

Targets (one core, 200 bootstrap replicates):

* 1,000,000 bandit rows, ips/snips/dm/dr with standard errors: < 2 s;
* 100,000 episodes of length 20: is/wis/dm/dr/wdr < 5 s, magic < 30 s.

BLAS threads are pinned to one before numpy is imported.
"""

from __future__ import annotations

import argparse
import os

for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import cpe  # noqa: E402


def _softmax(logits: np.ndarray) -> np.ndarray:
    """Row-wise softmax."""
    z = np.exp(logits - logits.max(axis=-1, keepdims=True))
    return z / z.sum(axis=-1, keepdims=True)


def _sample(probs: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """One categorical draw per row of ``probs``."""
    u = rng.random(probs.shape[0])[:, None]
    return np.minimum((probs.cumsum(axis=1) < u).sum(axis=1), probs.shape[1] - 1)


def bandit_arrays(n: int, k: int, rng: np.random.Generator) -> dict:
    """Synthetic contextual-bandit log (keyword arguments of BanditLog) with a reward model."""
    mu = _softmax(rng.normal(size=(n, k)))
    pi = _softmax(rng.normal(size=(n, k)))
    actions = _sample(mu, rng)
    means = rng.random((n, k))
    rewards = means[np.arange(n), actions] + rng.normal(scale=0.1, size=n)
    estimates = means + rng.normal(scale=0.05, size=(n, k))
    return dict(actions=actions, rewards=rewards, logged_propensities=mu[np.arange(n), actions],
                target_probs=pi, reward_estimates=estimates)


def bandit_log(n: int, k: int, rng: np.random.Generator) -> cpe.BanditLog:
    """Synthetic contextual-bandit log with a reward model."""
    return cpe.BanditLog(**bandit_arrays(n, k, rng))


def trajectory_arrays(n_episodes: int, length: int, k: int, rng: np.random.Generator,
                      gamma: float = 0.95) -> dict:
    """Synthetic episodes of fixed length, rows shuffled (keyword arguments of Trajectories)."""
    n = n_episodes * length
    mu = _softmax(rng.normal(size=(n, k)))
    pi = _softmax(0.3 * rng.normal(size=(n, k)) + np.log(mu))
    actions = _sample(mu, rng)
    q = rng.random((n, k))
    rewards = q[np.arange(n), actions] * 0.2 + rng.normal(scale=0.1, size=n)
    order = rng.permutation(n)
    ids = np.repeat(np.arange(n_episodes), length)[order]
    seq = np.tile(np.arange(length), n_episodes)[order]
    return dict(mdp_ids=ids, sequence_numbers=seq, actions=actions[order], rewards=rewards[order],
                logged_propensities=mu[np.arange(n), actions][order], target_probs=pi[order],
                q_estimates=q[order], gamma=gamma)


def trajectories(n_episodes: int, length: int, k: int, rng: np.random.Generator,
                 gamma: float = 0.95) -> cpe.Trajectories:
    """Synthetic episodes of fixed length, rows shuffled."""
    return cpe.Trajectories(**trajectory_arrays(n_episodes, length, k, rng, gamma))


def _timed(label: str, fn) -> object:
    """Run ``fn``, print its wall time, return its result."""
    start = time.perf_counter()
    result = fn()
    print(f"{label:<58s} {time.perf_counter() - start:7.2f} s", flush=True)
    return result


def main() -> None:
    """Run the benchmarks and print timings and the reports."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--bandit-rows", type=int, default=1_000_000)
    parser.add_argument("--episodes", type=int, default=100_000)
    parser.add_argument("--length", type=int, default=20)
    parser.add_argument("--actions", type=int, default=4)
    parser.add_argument("--n-bootstrap", type=int, default=200)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    b = args.n_bootstrap

    arrays = bandit_arrays(args.bandit_rows, args.actions, rng)
    log = _timed(f"bandit {args.bandit_rows:,} rows: validate BanditLog",
                 lambda: cpe.BanditLog(**arrays))
    report = _timed(f"bandit {args.bandit_rows:,} rows: ips/snips/dm/dr, {b} bootstrap",
                    lambda: cpe.evaluate(log, n_bootstrap=b, seed=1))
    print(report.table(), flush=True)

    arrays = trajectory_arrays(args.episodes, args.length, args.actions, rng)
    data = _timed(f"trajectories {args.episodes:,} x {args.length}: validate",
                  lambda: cpe.Trajectories(**arrays))
    _timed("trajectories: sort + pad episodes", data.episodes)
    fast = ["is", "wis", "dm", "dr", "wdr"]
    report = _timed(f"trajectories: {'/'.join(fast)}, {b} bootstrap",
                    lambda: cpe.evaluate(data, fast, n_bootstrap=b, seed=1))
    print(report.table(), flush=True)
    report = _timed(f"trajectories: magic, {b} bootstrap",
                    lambda: cpe.evaluate(data, ["magic"], n_bootstrap=b, seed=1))
    print(report.table(), flush=True)
    _timed(f"trajectories: end to end (validate + sort + all six), {b} bootstrap",
           lambda: cpe.evaluate(cpe.Trajectories(**arrays), n_bootstrap=b, seed=1))


if __name__ == "__main__":
    main()
