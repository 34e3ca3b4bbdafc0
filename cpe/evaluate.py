"""One entry point that runs every applicable estimator with bootstrap intervals."""

from __future__ import annotations

import logging
import math
from typing import Iterable, Sequence

import numpy as np

from cpe.bandit import BANDIT_ESTIMATORS, BANDIT_MODEL_ESTIMATORS, BanditStatistic
from cpe.bandit import logged_value as bandit_logged_value
from cpe.bootstrap import PoolLike, bootstrap, point_estimate, summarize
from cpe.data import BanditLog, Trajectories
from cpe.estimate import Estimate, Report
from cpe.magic import DEFAULT_CI_LEVEL
from cpe.sequential import SEQUENTIAL_ESTIMATORS, SEQUENTIAL_MODEL_ESTIMATORS
from cpe.sequential import SequentialStatistic
from cpe.sequential import logged_value as sequential_logged_value

logger = logging.getLogger(__name__)

#: Default number of bootstrap replicates.
DEFAULT_N_BOOTSTRAP = 200


def _choose(
    requested: str | Iterable[str] | None,
    valid: Sequence[str],
    model_only: frozenset[str],
    has_model: bool,
    model_field: str,
) -> list[str]:
    """Resolve the estimator list, validating names and model availability."""
    if requested is None:
        chosen = [name for name in valid if has_model or name not in model_only]
        skipped = [name for name in valid if name not in chosen]
        if skipped:
            logger.info("no %s given; skipping %s", model_field, ", ".join(skipped))
        return chosen
    names = [requested] if isinstance(requested, str) else list(requested)
    unknown = [name for name in names if name not in valid]
    if unknown:
        raise ValueError(
            f"estimators: unknown {', '.join(map(repr, unknown))}; valid: {', '.join(valid)}"
        )
    if not names:
        raise ValueError(f"estimators: empty selection; valid: {', '.join(valid)}")
    needs_model = [name for name in names if name in model_only]
    if needs_model and not has_model:
        raise ValueError(f"{model_field}: required by {', '.join(needs_model)} but not given")
    return list(dict.fromkeys(names))


def _seed_sequence(seed: int | np.random.SeedSequence | None) -> np.random.SeedSequence:
    """A fresh seed sequence (copies a passed sequence so reuse gives equal results)."""
    if isinstance(seed, np.random.SeedSequence):
        return np.random.SeedSequence(seed.entropy, spawn_key=seed.spawn_key,
                                      pool_size=seed.pool_size)
    if seed is not None and (not isinstance(seed, (int, np.integer)) or seed < 0):
        raise ValueError(f"seed: expected a non-negative integer or None, got {seed!r}")
    return np.random.SeedSequence(None if seed is None else int(seed))


def evaluate(
    data: BanditLog | Trajectories,
    estimators: str | Iterable[str] | None = None,
    *,
    n_bootstrap: int = DEFAULT_N_BOOTSTRAP,
    seed: int | np.random.SeedSequence | None = None,
    pool: PoolLike | None = None,
    same_host: bool = False,
    confidence: float = 0.95,
    magic_j_steps: int | Sequence[int] | None = None,
    magic_ci_level: float = DEFAULT_CI_LEVEL,
) -> Report:
    """Estimate the target policy's value with every requested estimator.

    Args:
        data: a :class:`~cpe.data.BanditLog` or :class:`~cpe.data.Trajectories`.
        estimators: names to run (default: all that the data supports; model-based
            ones are skipped when no model estimates were given).
        n_bootstrap: bootstrap replicates (rows / whole episodes resampled at full
            size); 0 gives point estimates with NaN uncertainty, otherwise >= 2.
        seed: seed for the bootstrap (``None``: fresh entropy, recorded in the report).
        pool: optional ``multiprocessing.Pool``-like object; bootstrap chunks are
            mapped over it (same result as serial for the same seed).
        same_host: the pool's workers run on this machine: the bootstrap's features
            reach them through one shared file in ``/dev/shm`` instead of one copy per
            worker in the pool's messages (faster; wrong for workers elsewhere).
        confidence: level of the percentile intervals.
        magic_j_steps: which j-step returns MAGIC blends (see
            :func:`cpe.magic.select_j_steps`).
        magic_ci_level: level of the interval MAGIC measures bias against.

    Raises:
        ValueError: for unknown estimator names, model-based estimators without model
            estimates, or invalid settings.
    """
    if isinstance(n_bootstrap, bool) or not isinstance(n_bootstrap, (int, np.integer)):
        raise ValueError(f"n_bootstrap: expected an integer, got {n_bootstrap!r}")
    if n_bootstrap < 0 or n_bootstrap == 1:
        raise ValueError(f"n_bootstrap: must be 0 (no intervals) or at least 2, got {n_bootstrap}")
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence: must lie in (0, 1), got {confidence}")
    seed_seq = _seed_sequence(seed)

    if isinstance(data, BanditLog):
        names = _choose(estimators, BANDIT_ESTIMATORS, BANDIT_MODEL_ESTIMATORS,
                        data.has_model, "reward_estimates")
        statistic = BanditStatistic(data, names)
        kind, n, logged = "bandit", data.n, bandit_logged_value(data)
    elif isinstance(data, Trajectories):
        names = _choose(estimators, SEQUENTIAL_ESTIMATORS, SEQUENTIAL_MODEL_ESTIMATORS,
                        data.has_model, "q_estimates")
        episodes = data.episodes()
        statistic = SequentialStatistic(episodes, names, magic_j_steps, magic_ci_level)
        kind, n, logged = "trajectories", episodes.n_episodes, sequential_logged_value(episodes)
    else:
        raise TypeError(f"data: expected BanditLog or Trajectories, got {type(data).__name__}")

    values = point_estimate(statistic)
    if n_bootstrap > 0:
        replicates = bootstrap(statistic, int(n_bootstrap), seed_seq, pool, same_host)
        stderr, low, high = summarize(replicates, confidence)
    else:
        stderr = low = high = np.full(len(names), np.nan)

    if logged == 0.0:
        logger.warning("the logged policy's observed value is 0; normalized estimates are NaN")
    estimates = {
        name: Estimate(
            value=float(values[k]),
            stderr=float(stderr[k]),
            ci_low=float(low[k]),
            ci_high=float(high[k]),
            normalized=float(values[k] / logged) if logged != 0.0 else math.nan,
        )
        for k, name in enumerate(names)
    }
    diagnostics = {}
    if isinstance(statistic, SequentialStatistic) and "magic" in names:
        diagnostics["magic"] = statistic.magic().to_dict()
    entropy = seed_seq.entropy if isinstance(seed_seq.entropy, int) else None
    return Report(
        estimates,
        kind=kind,
        n=n,
        logged_value=logged,
        n_bootstrap=int(n_bootstrap),
        confidence=confidence,
        seed=entropy,
        diagnostics=diagnostics,
    )
