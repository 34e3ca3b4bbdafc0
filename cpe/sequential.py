"""Sequential (episodic) off-policy estimators.

Notation: ``n`` episodes padded to horizon ``T`` (see :mod:`cpe.episodes`),
per-step ratio ``rho[i,t] = pi(a_t|s_t) / mu(a_t|s_t)``, cumulative weight
``W[i,t] = prod_{k<=t} rho[i,k]`` (``W[i,-1] = 1``; an ended episode keeps its
final weight), ``S_t = sum_i W[i,t]`` (``S_{-1} = n``), discount ``g_t = gamma**t``,
model ``Q[i,t] = Q(s_t, a_t)`` and ``V[i,t] = sum_a pi(a|s_t) Q(s_t, a)``.

* ``is``  per-decision importance sampling (Precup, Sutton & Singh 2000),
  averaged over *all* episodes::

      V = 1/n sum_i sum_t g_t W[i,t] r[i,t]

* ``wis`` weighted per-decision importance sampling: at every step the weights
  are normalised over all episodes (0/0 := 0)::

      V = sum_t g_t sum_i W[i,t] r[i,t] / S_t

* ``dm``  direct method, the model value of the first state::

      V = 1/n sum_i V[i,0]

* ``dr``  sequential doubly robust (Jiang & Li 2016), the unrolled recursion
  ``V_DR(s_t) = V(s_t) + rho_t (r_t + gamma V_DR(s_{t+1}) - Q(s_t, a_t))``::

      V = 1/n sum_i sum_t g_t [ W[i,t] (r[i,t] - Q[i,t]) + W[i,t-1] V[i,t] ]

* ``wdr`` weighted doubly robust (Thomas & Brunskill 2016)::

      V = sum_t g_t [ sum_i W[i,t] (r[i,t] - Q[i,t]) / S_t + sum_i W[i,t-1] V[i,t] / S_{t-1} ]

* ``magic`` blends j-step returns, see :mod:`cpe.magic`.

All of them are functions of four count-weighted per-step sums --
``sum_i c_i W``, ``sum_i c_i W r``, ``sum_i c_i W (r - Q)`` and ``sum_i c_i W_prev V`` --
which the episode bootstrap gets with one matrix product (MAGIC also needs the
per-episode terms for its covariance).
"""

from __future__ import annotations

import logging
from typing import Sequence

import numpy as np

from cpe.bandit import safe_ratio
from cpe.episodes import EpisodeData
from cpe.magic import DEFAULT_CI_LEVEL, MagicResult, blend, j_step_contributions, select_j_steps

logger = logging.getLogger(__name__)

#: Estimators available for trajectories, in report order.
SEQUENTIAL_ESTIMATORS = ("is", "wis", "dm", "dr", "wdr", "magic")
#: Sequential estimators that need Q estimates.
SEQUENTIAL_MODEL_ESTIMATORS = frozenset({"dm", "dr", "wdr", "magic"})


class SequentialStatistic:
    """Per-episode features and the map from their (resampled) sums to estimates.

    ``features`` is a Fortran-ordered ``(n, 2T)`` or ``(n, 4T)`` matrix with column
    blocks ``W``, ``W r`` and, with a model, ``W (r - Q)`` and ``W_prev V``.
    """

    def __init__(
        self,
        episodes: EpisodeData,
        names: Sequence[str],
        magic_j_steps: int | Sequence[int] | None = None,
        magic_ci_level: float = DEFAULT_CI_LEVEL,
    ) -> None:
        unknown = set(names) - set(SEQUENTIAL_ESTIMATORS)
        if unknown:
            raise ValueError(f"unknown trajectory estimators {sorted(unknown)}")
        has_model = episodes.q_logged is not None and episodes.v_target is not None
        if set(names) & SEQUENTIAL_MODEL_ESTIMATORS and not has_model:
            raise ValueError("q_estimates: required by the dm, dr, wdr and magic estimators")
        if not 0.0 < magic_ci_level < 1.0:
            raise ValueError(f"magic_ci_level: must lie in (0, 1), got {magic_ci_level}")
        self.names = tuple(names)
        self.n = episodes.n_episodes
        self.horizon = horizon = episodes.horizon
        self.discounts = episodes.discounts
        self.needs_counts = "magic" in self.names
        self.magic_ci_level = float(magic_ci_level)
        self.j_steps = select_j_steps(horizon, magic_j_steps) if self.needs_counts else None

        weights = episodes.weights
        with_model = has_model and bool(set(names) & SEQUENTIAL_MODEL_ESTIMATORS)
        self.features = np.empty((self.n, (4 if with_model else 2) * horizon), order="F")
        np.copyto(self._block(self.features, 0), weights)
        np.multiply(weights, episodes.rewards, out=self._block(self.features, 1))
        if with_model:
            assert episodes.q_logged is not None and episodes.v_target is not None
            np.multiply(weights, episodes.rewards - episodes.q_logged,
                        out=self._block(self.features, 2))
            np.multiply(episodes.weights_prev, episodes.v_target, out=self._block(self.features, 3))

    def _block(self, array: np.ndarray, k: int) -> np.ndarray:
        """Column block ``k`` (0: W, 1: W r, 2: W (r - Q), 3: W_prev V) of ``array``."""
        return array[:, k * self.horizon:(k + 1) * self.horizon]

    def finish(self, sums: np.ndarray, counts: np.ndarray | None) -> np.ndarray:
        """Estimator values (``(b, len(names))``) from ``(b, p)`` feature sums."""
        n = float(self.n)
        g = self.discounts
        step_sums = self._block(sums, 0)
        weighted_rewards = self._block(sums, 1)
        out = np.empty((sums.shape[0], len(self.names)))
        for k, name in enumerate(self.names):
            if name == "is":
                out[:, k] = weighted_rewards @ g / n
            elif name == "wis":
                out[:, k] = safe_ratio(weighted_rewards, step_sums) @ g
            elif name == "dm":
                out[:, k] = self._block(sums, 3)[:, 0] / n
            elif name == "dr":
                out[:, k] = (self._block(sums, 2) + self._block(sums, 3)) @ g / n
            elif name == "wdr":
                prev = np.hstack([np.full((sums.shape[0], 1), n), step_sums[:, :-1]])
                terms = safe_ratio(self._block(sums, 2), step_sums)
                terms += safe_ratio(self._block(sums, 3), prev)
                out[:, k] = terms @ g
            elif name == "magic":
                assert counts is not None
                out[:, k] = [self.magic(counts[r], step_sums[r]).value for r in range(len(counts))]
        return out

    def magic(self, counts: np.ndarray | None = None,
              step_sums: np.ndarray | None = None) -> MagicResult:
        """Run MAGIC on the episodes weighted by ``counts`` (default: the original data)."""
        if self.j_steps is None:
            raise ValueError("magic was not requested for this statistic")
        if counts is None:
            counts = np.ones(self.n)
        if step_sums is None:
            step_sums = counts @ self._block(self.features, 0)
        contributions = j_step_contributions(
            self._block(self.features, 2),
            self._block(self.features, 3),
            self.discounts,
            step_sums,
            float(self.n),
            self.j_steps,
        )
        return blend(contributions, counts, self.j_steps, self.magic_ci_level)


def logged_value(episodes: EpisodeData) -> float:
    """Observed value of the logging policy: the mean discounted logged return."""
    return float(np.mean(episodes.logged_returns()))
