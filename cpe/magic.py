"""MAGIC: model and guided importance sampling combining (Thomas & Brunskill 2016).

Notation (see :mod:`cpe.sequential`): ``n`` episodes, cumulative importance
weights ``W[i, t]``, their per-step sums ``S_t = sum_i W[i, t]`` with
``S_{-1} = n`` and ``W[i, -1] = 1``, discount ``g_t = gamma ** t``, model values
``Q[i, t] = Q(s_t, a_t)`` and ``V[i, t] = sum_a pi(a|s_t) Q(s_t, a)``.

The off-policy *j-step return* (with WDR control variates) is::

    G(j) = sum_{t<=j} g_t sum_i [ W[i,t] (r[i,t] - Q[i,t]) / S_t + W[i,t-1] V[i,t] / S_{t-1} ]
           + g_{j+1} sum_i W[i,j] V[i,j+1] / S_j

``G(-1)`` is the direct method ``1/n sum_i V[i, 0]`` and ``G(T-1)`` (the full
length, ``j = infinity``) is weighted doubly robust.  For a set ``J`` of
``j`` values MAGIC estimates

* ``Omega``, the covariance of the *estimators* ``G(J)``: the sample covariance of
  the per-episode contributions (each scaled by ``n`` so they average to
  ``G(j)``) divided by ``n`` -- the paper's ``n/(n-1) sum_k (g_k - mean)(...)^T``;
* ``b_j``, the bias of ``G(j)``: its distance to a confidence interval of the
  full-length estimate ``G(T-1)`` (normal interval ``G(T-1) +- z sqrt(Omega_TT)``
  at level ``ci_level``, 0.9 by default);

and blends ``MAGIC = x* . G(J)`` with ``x* = argmin_{x in simplex} x^T (Omega + b b^T) x``
solved exactly by :func:`cpe.simplex_qp.minimize_on_simplex`.

The normal interval (rather than the paper's bootstrap interval) keeps the
procedure free of an inner bootstrap, so every outer bootstrap replicate can
rerun MAGIC exactly as the point estimate does.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from statistics import NormalDist
from typing import Sequence

import numpy as np

from cpe.bandit import safe_ratio
from cpe.simplex_qp import minimize_on_simplex

logger = logging.getLogger(__name__)

#: Default cap on the number of j-step returns blended.
MAX_DEFAULT_J_STEPS = 32
#: Default level of the confidence interval that defines the bias.
DEFAULT_CI_LEVEL = 0.9


@dataclass(frozen=True)
class MagicResult:
    """Outcome of one MAGIC blend (diagnostics for the full-data estimate)."""

    value: float
    j_steps: np.ndarray
    weights: np.ndarray
    returns: np.ndarray
    bias: np.ndarray
    covariance: np.ndarray

    def to_dict(self) -> dict[str, list[float] | list[int] | float]:
        """JSON-friendly view (covariance reduced to per-return standard errors)."""
        return {
            "value": float(self.value),
            "j_steps": [int(j) for j in self.j_steps],
            "weights": [float(x) for x in self.weights],
            "returns": [float(g) for g in self.returns],
            "bias": [float(b) for b in self.bias],
            "stderr": [float(s) for s in np.sqrt(np.clip(np.diag(self.covariance), 0, None))],
        }


def select_j_steps(horizon: int, spec: int | Sequence[int] | None = None) -> np.ndarray:
    """Choose the sorted set ``J`` of j values in ``[-1, horizon - 1]``.

    ``None``: every j if there are at most ``MAX_DEFAULT_J_STEPS`` of them, else that
    many evenly spaced; an ``int`` m >= 2: m evenly spaced values; a sequence: those
    values (values beyond the horizon mean the full length).  ``-1`` (the direct
    method) and ``horizon - 1`` (full-length WDR) are always included.
    """
    last = horizon - 1
    if spec is None or isinstance(spec, (int, np.integer)):
        count = MAX_DEFAULT_J_STEPS if spec is None else int(spec)
        if count < 2:
            raise ValueError(f"magic_j_steps: need at least 2 j-step returns, got {count}")
        if horizon + 1 <= count:
            values = np.arange(-1, horizon)
        else:
            values = np.round(np.linspace(-1, last, count)).astype(np.int64)
    else:
        values = np.asarray(list(spec), dtype=np.float64)
        if values.ndim != 1 or values.size == 0 or np.any(values < -1) or np.any(values % 1 != 0):
            raise ValueError(f"magic_j_steps: expected integers >= -1, got {list(spec)!r}")
        values = np.minimum(values, last).astype(np.int64)
    return np.unique(np.concatenate([values, [-1, last]]))


def j_step_contributions(
    p_terms: np.ndarray,
    v_terms: np.ndarray,
    discounts: np.ndarray,
    step_sums: np.ndarray,
    n: float,
    j_steps: np.ndarray,
) -> np.ndarray:
    """Per-episode contributions ``(n_episodes, |J|)`` to each j-step return.

    Args:
        p_terms: ``(n, T)`` ``W[i,t] (r[i,t] - Q[i,t])``.
        v_terms: ``(n, T)`` ``W[i,t-1] V[i,t]``.
        discounts: ``(T,)`` ``gamma ** t``.
        step_sums: ``(T,)`` normalisers ``S_t`` of the (resampled) data.
        n: number of episodes in the (resampled) data.
        j_steps: sorted j values in ``[-1, T-1]``.

    Returns contributions scaled by ``n``, so a (count-weighted) mean over episodes
    equals ``G(j)``.
    """
    prev_sums = np.concatenate([[n], step_sums[:-1]])
    coef_p = n * safe_ratio(discounts, step_sums)
    coef_v = n * safe_ratio(discounts, prev_sums)
    horizon = discounts.shape[0]
    out = np.empty((p_terms.shape[0], j_steps.shape[0]), order="F")
    wanted = {int(j): k for k, j in enumerate(j_steps)}
    running = np.zeros(p_terms.shape[0])
    scratch = np.empty_like(running)
    for j in range(-1, int(j_steps[-1]) + 1):
        if j >= 0:  # running = sum_{t<=j} (column-wise, contiguous for F-ordered input)
            np.multiply(p_terms[:, j], coef_p[j], out=scratch)
            running += scratch
            np.multiply(v_terms[:, j], coef_v[j], out=scratch)
            running += scratch
        k = wanted.get(j)
        if k is None:
            continue
        column = out[:, k]
        if j + 1 < horizon:
            np.multiply(v_terms[:, j + 1], coef_v[j + 1], out=column)
            column += running
        else:
            column[:] = running
    return out


def blend(contributions: np.ndarray, counts: np.ndarray, j_steps: np.ndarray,
          ci_level: float) -> MagicResult:
    """MAGIC blend of the j-step returns given per-episode contributions and counts.

    ``counts`` are the episode multiplicities of the (re)sample (all ones for the
    original data); the last column of ``contributions`` must be the full length.
    """
    n = float(counts.sum())
    returns = counts @ contributions / n
    if n > 1:
        scaled = contributions - returns
        scaled *= np.sqrt(counts)[:, None]
        covariance = scaled.T @ scaled / ((n - 1.0) * n)
    else:
        covariance = np.zeros((returns.shape[0], returns.shape[0]))
    z = NormalDist().inv_cdf(0.5 + ci_level / 2.0)
    half_width = z * np.sqrt(max(float(covariance[-1, -1]), 0.0))
    low, high = returns[-1] - half_width, returns[-1] + half_width
    bias = np.maximum(0.0, np.maximum(returns - high, low - returns))
    weights = minimize_on_simplex(covariance + np.outer(bias, bias))
    return MagicResult(
        value=float(weights @ returns),
        j_steps=j_steps,
        weights=weights,
        returns=returns,
        bias=bias,
        covariance=covariance,
    )
