"""Exact minimisation of a convex quadratic form over the probability simplex.

Solves::

    minimise  x^T A x   subject to  x >= 0,  sum(x) = 1

for a symmetric positive semi-definite ``A``, the problem MAGIC solves for its
blend weights (Thomas & Brunskill 2016, with ``A = Omega + b b^T``).  Writing
``A = L^T L`` this is the minimum-norm point of the convex hull of the columns
of ``L``, which Wolfe's active-set algorithm (Wolfe 1976, "Finding the nearest
point in a polytope") finds exactly in finitely many steps.  The algorithm is
implemented on the Gram matrix ``A`` directly, so ``L`` is never formed.

Optimality (KKT) on the simplex is ``(A x)_k >= x^T A x`` for every ``k``; the
result is checked against it and, should round-off ever break it, refined with
``scipy.optimize.minimize(method="SLSQP")``.
"""

from __future__ import annotations

import logging

import numpy as np

logger = logging.getLogger(__name__)

_REL_TOL = 1e-12


def _affine_minimizer(gram: np.ndarray) -> np.ndarray:
    """Coefficients ``mu`` (summing to 1) minimising ``mu^T G mu`` on the affine hull."""
    k = gram.shape[0]
    kkt = np.zeros((k + 1, k + 1))
    kkt[:k, :k] = gram
    kkt[:k, k] = 1.0
    kkt[k, :k] = 1.0
    rhs = np.zeros(k + 1)
    rhs[k] = 1.0
    try:
        solution = np.linalg.solve(kkt, rhs)
    except np.linalg.LinAlgError:
        solution = np.linalg.lstsq(kkt, rhs, rcond=None)[0]
    mu = solution[:k]
    total = mu.sum()
    return mu / total if abs(total - 1.0) < 1e-6 else mu


def kkt_violation(matrix: np.ndarray, x: np.ndarray) -> float:
    """How far ``x`` is from optimal: ``max(0, x^T A x - min_k (A x)_k)`` plus infeasibility."""
    ax = matrix @ x
    gap = float(x @ ax - ax.min())
    infeasible = float(max(0.0, -x.min()) + abs(x.sum() - 1.0))
    return max(0.0, gap) + infeasible


def _wolfe(matrix: np.ndarray, tol: float, max_iter: int) -> np.ndarray | None:
    """Wolfe's minimum-norm-point iterations; ``None`` if they do not converge."""
    m = matrix.shape[0]
    support = [int(np.argmin(np.diag(matrix)))]
    lam = np.ones(1)
    for _ in range(max_iter):
        x = np.zeros(m)
        x[support] = lam
        ax = matrix @ x
        k = int(np.argmin(ax))
        if ax[k] >= x @ ax - tol or k in support:
            return x
        support.append(k)
        lam = np.append(lam, 0.0)
        for _ in range(m + 1):
            idx = np.asarray(support)
            mu = _affine_minimizer(matrix[np.ix_(idx, idx)])
            if np.all(mu > 0.0):
                lam = mu
                break
            shrinking = mu <= 0.0
            theta = np.min(lam[shrinking] / (lam[shrinking] - mu[shrinking]))
            lam = lam + theta * (mu - lam)
            keep = lam > 1e-15
            keep[np.argmax(lam)] = True
            support = [s for s, kept in zip(support, keep) if kept]
            lam = lam[keep] / lam[keep].sum()
        else:
            return None
    return None


def _slsqp(matrix: np.ndarray, start: np.ndarray) -> np.ndarray:
    """Fallback: SLSQP on the same problem, started at ``start``."""
    from scipy.optimize import minimize

    m = matrix.shape[0]
    scale = max(float(np.abs(matrix).max()), np.finfo(float).tiny)
    scaled = matrix / scale
    result = minimize(
        lambda x: x @ scaled @ x,
        start,
        jac=lambda x: 2.0 * scaled @ x,
        method="SLSQP",
        bounds=[(0.0, 1.0)] * m,
        constraints=[{"type": "eq", "fun": lambda x: x.sum() - 1.0, "jac": lambda x: np.ones(m)}],
        options={"ftol": 1e-15, "maxiter": 500},
    )
    x = np.clip(result.x, 0.0, None)
    return x / x.sum()


def minimize_on_simplex(matrix: np.ndarray) -> np.ndarray:
    """Return ``argmin_{x in simplex} x^T A x`` for a symmetric PSD ``A`` (``(m, m)``).

    Ties (several minimisers) are broken by the algorithm's path, which starts
    at the vertex with the smallest diagonal entry.
    """
    matrix = np.asarray(matrix, dtype=np.float64)
    if matrix.ndim != 2 or matrix.shape[0] != matrix.shape[1] or matrix.shape[0] == 0:
        raise ValueError(f"matrix: expected a non-empty square matrix, got shape {matrix.shape}")
    if not np.all(np.isfinite(matrix)):
        raise ValueError("matrix: contains NaN or infinite values")
    matrix = 0.5 * (matrix + matrix.T)
    m = matrix.shape[0]
    scale = float(np.abs(matrix).max())
    if scale == 0.0 or m == 1:
        x = np.zeros(m)
        x[0] = 1.0
        return x
    matrix = matrix / scale
    x = _wolfe(matrix, _REL_TOL, max_iter=50 * m + 50)
    if x is None or kkt_violation(matrix, x) > 1e-9:
        logger.debug("Wolfe iterations did not certify optimality; refining with SLSQP")
        start = x if x is not None else np.full(m, 1.0 / m)
        candidate = _slsqp(matrix, start)
        if x is None or candidate @ matrix @ candidate < x @ matrix @ x:
            x = candidate
    return x
