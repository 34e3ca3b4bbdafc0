"""MAGIC: the simplex QP solver and the blend against a direct reference implementation."""

import itertools
from statistics import NormalDist

import numpy as np
import pytest
from scipy.optimize import minimize

import cpe
from cpe.magic import select_j_steps
from cpe.simplex_qp import kkt_violation, minimize_on_simplex
from cpe_problems import SmallMDP


def _brute_force(a):
    """True minimiser of x^T A x on the simplex by enumerating every support."""
    m = a.shape[0]
    best, best_x = np.inf, None
    for size in range(1, m + 1):
        for support in itertools.combinations(range(m), size):
            idx = list(support)
            kkt = np.zeros((size + 1, size + 1))
            kkt[:size, :size] = a[np.ix_(idx, idx)]
            kkt[:size, size] = kkt[size, :size] = 1.0
            rhs = np.zeros(size + 1)
            rhs[size] = 1.0
            sol = np.linalg.lstsq(kkt, rhs, rcond=None)[0][:size]
            if sol.min() < -1e-12 or abs(sol.sum() - 1) > 1e-9:
                continue
            x = np.zeros(m)
            x[idx] = sol
            value = x @ a @ x
            if value < best:
                best, best_x = value, x
    return best, best_x


def _random_psd(rng, m, rank=None):
    factor = rng.normal(size=(rank or m, m))
    bias = rng.normal(size=m)
    return factor.T @ factor / m + np.outer(bias, bias)


@pytest.mark.parametrize("seed", range(8))
def test_qp_matches_brute_force_minimum(seed):
    rng = np.random.default_rng(seed)
    a = _random_psd(rng, 5, rank=None if seed % 2 else 2)
    x = minimize_on_simplex(a)
    best, _ = _brute_force(a)
    assert x.min() >= 0 and x.sum() == pytest.approx(1.0)
    assert x @ a @ x == pytest.approx(best, rel=1e-9, abs=1e-14)
    assert kkt_violation(a / np.abs(a).max(), x) < 1e-9


def test_qp_small_case_worked_by_hand():
    # Two estimators with variances 1 and 4, uncorrelated: x = (4/5, 1/5), value 4/5.
    x = minimize_on_simplex(np.diag([1.0, 4.0]))
    np.testing.assert_allclose(x, [0.8, 0.2])
    # Add a bias of 3 to the first: A = [[10, 0], [0, 4]] -> x = (4/14, 10/14).
    x = minimize_on_simplex(np.diag([1.0, 4.0]) + np.outer([3.0, 0.0], [3.0, 0.0]))
    np.testing.assert_allclose(x, [4 / 14, 10 / 14])
    # Negative correlation can make an interior point beat both vertices.
    a = np.array([[1.0, -0.9], [-0.9, 1.0]])
    np.testing.assert_allclose(minimize_on_simplex(a), [0.5, 0.5])


def test_qp_beats_slsqp_and_random_points():
    rng = np.random.default_rng(42)
    a = _random_psd(rng, 12, rank=6)
    x = minimize_on_simplex(a)
    m = a.shape[0]
    res = minimize(lambda v: v @ a @ v, np.full(m, 1 / m), method="SLSQP",
                   bounds=[(0, 1)] * m, constraints=[{"type": "eq", "fun": lambda v: v.sum() - 1}],
                   options={"ftol": 1e-14, "maxiter": 1000})
    assert x @ a @ x <= res.fun + 1e-12
    points = rng.dirichlet(np.ones(m), size=2000)
    assert x @ a @ x <= np.einsum("ij,jk,ik->i", points, a, points).min()


def test_qp_degenerate_inputs():
    np.testing.assert_allclose(minimize_on_simplex(np.zeros((3, 3))).sum(), 1.0)
    np.testing.assert_allclose(minimize_on_simplex(np.array([[2.0]])), [1.0])
    duplicate = np.ones((3, 3)) * 2.0  # three identical estimators
    x = minimize_on_simplex(duplicate)
    assert x @ duplicate @ x == pytest.approx(2.0)
    scaled = _random_psd(np.random.default_rng(1), 4) * 1e-9  # tiny variances
    best, _ = _brute_force(scaled)
    x = minimize_on_simplex(scaled)
    assert x @ scaled @ x == pytest.approx(best, rel=1e-8)
    with pytest.raises(ValueError, match="matrix"):
        minimize_on_simplex(np.ones((2, 3)))
    with pytest.raises(ValueError, match="matrix"):
        minimize_on_simplex(np.array([[np.nan]]))


def test_select_j_steps():
    np.testing.assert_array_equal(select_j_steps(4), [-1, 0, 1, 2, 3])
    np.testing.assert_array_equal(select_j_steps(100, 3), [-1, 49, 99])
    np.testing.assert_array_equal(select_j_steps(10, [2, 50]), [-1, 2, 9])
    assert len(select_j_steps(1000)) == 32
    with pytest.raises(ValueError, match="magic_j_steps"):
        select_j_steps(10, 1)
    with pytest.raises(ValueError, match="magic_j_steps"):
        select_j_steps(10, [-3])


def _reference_magic(traj, level=0.9):
    """MAGIC straight from Thomas & Brunskill's definitions, with Python loops and SLSQP."""
    ep = traj.episodes()
    n, horizon, gamma = ep.n_episodes, ep.horizon, traj.gamma
    w = ep.weights
    norm = w / w.sum(axis=0)  # normalised weights w_t^i (ended episodes keep theirs)
    prev = np.hstack([np.full((n, 1), 1.0 / n), norm[:, :-1]])  # w_{t-1}^i, w_{-1} = 1/n
    r, q, v = ep.rewards, ep.q_logged, ep.v_target
    js = list(range(-1, horizon))
    per_episode = np.zeros((n, len(js)))  # g^(j)_i, summing over i to G(j)
    for i in range(n):
        for k, j in enumerate(js):
            total = 0.0
            for t in range(j + 1):
                total += gamma**t * (norm[i, t] * r[i, t] - norm[i, t] * q[i, t] + prev[i, t] * v[i, t])
            if j + 1 < horizon:
                total += gamma ** (j + 1) * norm[i, j] * v[i, j + 1] if j >= 0 else v[i, 0] / n
            per_episode[i, k] = total
    returns = per_episode.sum(axis=0)
    dev = per_episode - per_episode.mean(axis=0)
    omega = n / (n - 1) * dev.T @ dev
    z = NormalDist().inv_cdf(0.5 + level / 2)
    low, high = returns[-1] - z * np.sqrt(omega[-1, -1]), returns[-1] + z * np.sqrt(omega[-1, -1])
    bias = np.array([max(0.0, g - high, low - g) for g in returns])
    a = omega + np.outer(bias, bias)
    m = len(js)
    res = minimize(lambda x: x @ a @ x / np.abs(a).max(), np.full(m, 1 / m), method="SLSQP",
                   bounds=[(0, 1)] * m, constraints=[{"type": "eq", "fun": lambda x: x.sum() - 1}],
                   options={"ftol": 1e-15, "maxiter": 1000})
    return returns, omega, bias, res.x, a


@pytest.mark.parametrize("seed, scale", [(0, 0.5), (1, 1.0), (2, 0.0)])
def test_magic_matches_reference_implementation(seed, scale):
    mdp = SmallMDP.make(seed=seed, horizon=4)
    q = mdp.q_tables() * scale
    traj = mdp.sample(40, np.random.default_rng(seed), q)
    report = cpe.evaluate(traj, ["magic", "wdr", "dm"], n_bootstrap=0)
    details = report.diagnostics["magic"]
    returns, omega, bias, x_ref, a = _reference_magic(traj)
    np.testing.assert_allclose(details["returns"], returns, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(details["stderr"], np.sqrt(np.diag(omega)), rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(details["bias"], bias, rtol=1e-8, atol=1e-12)
    assert details["returns"][0] == pytest.approx(report["dm"].value)
    assert details["returns"][-1] == pytest.approx(report["wdr"].value)
    x = np.array(details["weights"])
    assert x @ a @ x <= x_ref @ a @ x_ref * (1 + 1e-7) + 1e-15  # at least as good as SLSQP
    assert report["magic"].value == pytest.approx(x @ returns)


def test_magic_options_are_forwarded():
    mdp = SmallMDP.make(seed=5, horizon=6)
    traj = mdp.sample(60, np.random.default_rng(0), mdp.q_tables() * 0.8)
    report = cpe.evaluate(traj, ["magic"], n_bootstrap=0, magic_j_steps=[1, 3], magic_ci_level=0.5)
    assert report.diagnostics["magic"]["j_steps"] == [-1, 1, 3, 5]
    with pytest.raises(ValueError, match="magic_ci_level"):
        cpe.evaluate(traj, ["magic"], magic_ci_level=1.5)
