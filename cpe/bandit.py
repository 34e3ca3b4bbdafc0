"""Contextual-bandit off-policy estimators.

Notation: ``n`` logged rows ``(x_i, a_i, r_i, mu_i)`` with ``mu_i = mu(a_i|x_i)``
the logging propensity, ``pi(.|x_i)`` the evaluated (target) policy, importance
weight ``w_i = pi(a_i|x_i) / mu_i`` and a reward model ``r_hat(x, a)``.

* ``ips``   inverse propensity scoring (Horvitz & Thompson 1952)::

      V = 1/n sum_i w_i r_i

* ``snips`` self-normalised IPS (Swaminathan & Joachims 2015)::

      V = sum_i w_i r_i / sum_i w_i        (defined as 0 when every w_i is 0)

* ``dm``    direct method::

      V = 1/n sum_i sum_a pi(a|x_i) r_hat(x_i, a)

* ``dr``    doubly robust (Dudik, Langford & Li 2011)::

      V = 1/n sum_i [ sum_a pi(a|x_i) r_hat(x_i, a) + w_i (r_i - r_hat(x_i, a_i)) ]

``ips``, ``dm`` and ``dr`` are means of fixed per-row contributions, ``snips`` a
ratio of two such means, so a bootstrap replicate only needs the count-weighted
column sums of the feature matrix built here.
"""

from __future__ import annotations

import logging
from typing import Sequence

import numpy as np

from cpe.data import BanditLog

logger = logging.getLogger(__name__)

#: Estimators available for bandit logs, in report order.
BANDIT_ESTIMATORS = ("ips", "snips", "dm", "dr")
#: Bandit estimators that need reward estimates.
BANDIT_MODEL_ESTIMATORS = frozenset({"dm", "dr"})


def safe_ratio(numerator: np.ndarray, denominator: np.ndarray) -> np.ndarray:
    """Elementwise ``numerator / denominator`` with ``0 / 0`` defined as 0."""
    numerator = np.asarray(numerator, dtype=np.float64)
    denominator = np.asarray(denominator, dtype=np.float64)
    out = np.zeros(np.broadcast(numerator, denominator).shape)
    np.divide(numerator, denominator, out=out, where=denominator != 0)
    return out


class BanditStatistic:
    """Per-row features and the map from their (resampled) sums to estimates.

    Feature columns: ``w*r`` (ips, snips), ``w`` (snips), the direct-method term
    and the doubly robust term; only the columns the requested estimators use are
    built.
    """

    needs_counts = False

    def __init__(self, log: BanditLog, names: Sequence[str]) -> None:
        unknown = set(names) - set(BANDIT_ESTIMATORS)
        if unknown:
            raise ValueError(f"unknown bandit estimators {sorted(unknown)}")
        if set(names) & BANDIT_MODEL_ESTIMATORS and not log.has_model:
            raise ValueError("reward_estimates: required by the dm and dr estimators")
        self.names = tuple(names)
        self.n = log.n
        weights = log.importance_weights()
        columns: dict[str, np.ndarray] = {}
        if {"ips", "snips"} & set(names):
            columns["wr"] = weights * log.rewards
        if "snips" in names:
            columns["w"] = weights
            if not np.any(weights > 0):
                logger.warning("snips: every importance weight is zero; the estimate is 0")
        if {"dm", "dr"} & set(names):
            assert log.reward_estimates is not None
            direct = np.einsum("ij,ij->i", log.target_probs, log.reward_estimates)
            if "dm" in names:
                columns["dm"] = direct
            if "dr" in names:
                logged_estimate = log.reward_estimates[np.arange(log.n), log.actions]
                columns["dr"] = direct + weights * (log.rewards - logged_estimate)
        self._column = {key: j for j, key in enumerate(columns)}
        self.features = np.ascontiguousarray(np.column_stack(list(columns.values())))

    def finish(self, sums: np.ndarray, counts: np.ndarray | None) -> np.ndarray:
        """Estimator values (``(b, len(names))``) from ``(b, p)`` feature sums."""
        col = self._column
        out = np.empty((sums.shape[0], len(self.names)))
        for k, name in enumerate(self.names):
            if name == "ips":
                out[:, k] = sums[:, col["wr"]] / self.n
            elif name == "snips":
                out[:, k] = safe_ratio(sums[:, col["wr"]], sums[:, col["w"]])
            else:
                out[:, k] = sums[:, col[name]] / self.n
        return out


def logged_value(log: BanditLog) -> float:
    """Observed value of the logging policy: the mean logged reward."""
    return float(np.mean(log.rewards))
