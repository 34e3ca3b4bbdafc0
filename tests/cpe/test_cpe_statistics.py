"""Statistical behaviour on problems whose true value is known exactly.

Bias is checked against Monte Carlo error over many independent logs; estimators
that theory calls unbiased (IPS, DR, per-decision IS, sequential DR) must land
within 4 standard errors of the truth, and every estimator's error must shrink
as the log grows.
"""

import dataclasses

import numpy as np
import pytest

import cpe
from cpe_problems import ContextualBandit, SmallMDP

N_SEEDS = 300


def _values(make_log, seeds, names):
    """``(seeds, len(names))`` point estimates over independent logs."""
    out = np.empty((seeds, len(names)))
    for i in range(seeds):
        report = cpe.evaluate(make_log(np.random.default_rng(1000 + i)), names, n_bootstrap=0)
        out[i] = [report[name].value for name in names]
    return out


def _assert_unbiased(values, truth, names):
    mean = values.mean(axis=0)
    mc_error = values.std(axis=0, ddof=1) / np.sqrt(values.shape[0])
    for name, m, e in zip(names, mean, mc_error):
        assert abs(m - truth) < 4 * e + 1e-12, f"{name}: mean {m} vs truth {truth} (mc error {e})"


def _rmse(values, truth):
    return np.sqrt(((values - truth) ** 2).mean(axis=0))


@pytest.fixture(scope="module")
def bandit():
    return ContextualBandit.make(seed=2)


@pytest.fixture(scope="module")
def mdp():
    return SmallMDP.make(seed=3)


# ------------------------------------------------------------------------ bandit
def test_bandit_ips_and_dr_unbiased(bandit):
    biased_model = bandit.means + 0.3
    names = ["ips", "dr"]
    exact = _values(lambda rng: bandit.sample(100, rng), N_SEEDS, names + ["dm"])
    _assert_unbiased(exact, bandit.true_value, names + ["dm"])  # dm exact with the true model
    off = _values(lambda rng: bandit.sample(100, rng, biased_model), N_SEEDS, names)
    _assert_unbiased(off, bandit.true_value, names)  # DR unbiased even with a wrong model


def test_bandit_error_shrinks_with_log_size(bandit):
    names = ["ips", "snips", "dm", "dr"]
    small = _values(lambda rng: bandit.sample(100, rng), 100, names)
    large = _values(lambda rng: bandit.sample(1600, rng), 100, names)
    ratio = _rmse(large, bandit.true_value) / _rmse(small, bandit.true_value)
    assert np.all(ratio < 0.5), dict(zip(names, ratio))  # theory: 1/4


def test_bandit_dr_has_lower_variance_than_ips_with_good_model(bandit):
    quiet = dataclasses.replace(bandit, noise=0.1)  # the model cannot remove reward noise
    values = _values(lambda rng: quiet.sample(200, rng), 200, ["ips", "dr"])
    var_ips, var_dr = values.var(axis=0)
    assert var_dr < 0.5 * var_ips


def test_bandit_dm_converges_to_what_its_model_implies(bandit):
    model = bandit.means * 0.8 + 0.1
    implied = bandit.model_value(model)
    assert abs(implied - bandit.true_value) > 0.05
    report = cpe.evaluate(bandit.sample(100_000, np.random.default_rng(5), model), ["dm", "dr"],
                          n_bootstrap=100, seed=0)
    assert abs(report["dm"].value - implied) < 5 * report["dm"].stderr
    assert abs(report["dr"].value - bandit.true_value) < 5 * report["dr"].stderr


# ------------------------------------------------------------------ trajectories
def test_mdp_per_decision_is_and_dr_unbiased(mdp):
    names = ["is", "dr", "dm"]
    exact = _values(lambda rng: mdp.sample(100, rng), N_SEEDS, names)
    _assert_unbiased(exact, mdp.true_value, names)
    wrong_q = mdp.q_tables() * 0.5 + 0.2
    off = _values(lambda rng: mdp.sample(100, rng, wrong_q), N_SEEDS, ["is", "dr"])
    _assert_unbiased(off, mdp.true_value, ["is", "dr"])


def test_mdp_error_shrinks_with_log_size(mdp):
    wrong_q = mdp.q_tables() * 0.7
    names = ["is", "wis", "dr", "wdr", "magic"]
    small = _values(lambda rng: mdp.sample(50, rng, wrong_q), 100, names)
    large = _values(lambda rng: mdp.sample(800, rng, wrong_q), 100, names)
    ratio = _rmse(large, mdp.true_value) / _rmse(small, mdp.true_value)
    assert np.all(ratio < 0.5), dict(zip(names, ratio))  # theory: 1/4 for consistent ones


def test_mdp_dr_has_lower_variance_than_is_with_good_model(mdp):
    quiet = dataclasses.replace(mdp, noise=0.1)  # the model cannot remove reward noise
    values = _values(lambda rng: quiet.sample(100, rng), 200, ["is", "dr", "wis", "wdr"])
    var_is, var_dr, var_wis, var_wdr = values.var(axis=0)
    assert var_dr < 0.4 * var_is
    assert var_wdr < 0.85 * var_wis


def test_mdp_dm_converges_to_what_its_model_implies(mdp):
    wrong_q = mdp.q_tables() * 0.6
    implied = mdp.model_value(wrong_q)
    assert abs(implied - mdp.true_value) > 0.1
    log = mdp.sample(20_000, np.random.default_rng(9), wrong_q)
    report = cpe.evaluate(log, ["dm", "dr", "wdr"], n_bootstrap=100, seed=0)
    assert abs(report["dm"].value - implied) < 5 * report["dm"].stderr
    for name in ("dr", "wdr"):
        assert abs(report[name].value - mdp.true_value) < 5 * report[name].stderr


def test_magic_tracks_the_model_when_it_is_exact_and_ignores_it_when_biased(mdp):
    exact = _values(lambda rng: mdp.sample(100, rng), 150, ["magic", "wdr", "dm"])
    rmse_magic, rmse_wdr, rmse_dm = _rmse(exact, mdp.true_value)
    assert rmse_magic < rmse_wdr  # exact model: leaning on it pays
    wrong_q = mdp.q_tables() * 0.4
    log = mdp.sample(20_000, np.random.default_rng(11), wrong_q)
    report = cpe.evaluate(log, ["magic", "dm", "wdr"], n_bootstrap=50, seed=0)
    details = report.diagnostics["magic"]
    assert details["weights"][0] < 0.01  # the biased direct method gets (almost) no weight
    assert abs(report["magic"].value - mdp.true_value) < 5 * report["magic"].stderr
    assert abs(report["dm"].value - mdp.true_value) > 10 * report["magic"].stderr


@pytest.mark.slow
def test_bootstrap_interval_coverage(bandit):
    hits = []
    for i in range(200):
        log = bandit.sample(300, np.random.default_rng(50_000 + i))
        report = cpe.evaluate(log, ["ips", "dr"], n_bootstrap=200, seed=i)
        hits.append([report[n].ci_low <= bandit.true_value <= report[n].ci_high for n in ("ips", "dr")])
    coverage = np.mean(hits, axis=0)
    assert np.all((coverage > 0.88) & (coverage < 0.995)), coverage
