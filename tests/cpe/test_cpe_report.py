"""The public API surface: estimator selection, Report and Estimate."""

import dataclasses
import json
import math

import numpy as np
import pytest

import cpe
from cpe_problems import ContextualBandit, SmallMDP


@pytest.fixture(scope="module")
def bandit_with_model():
    return ContextualBandit.make(seed=0).sample(500, np.random.default_rng(0))


@pytest.fixture(scope="module")
def bandit_without_model(bandit_with_model):
    log = bandit_with_model
    return cpe.BanditLog(log.actions, log.rewards, log.logged_propensities, log.target_probs)


@pytest.fixture(scope="module")
def traj_without_model():
    traj = SmallMDP.make(seed=0).sample(100, np.random.default_rng(0))
    return cpe.Trajectories(traj.mdp_ids, traj.sequence_numbers, traj.actions, traj.rewards,
                            traj.logged_propensities, traj.target_probs, gamma=traj.gamma)


def test_default_estimators(bandit_with_model, bandit_without_model, traj_without_model):
    assert list(cpe.evaluate(bandit_with_model, n_bootstrap=0)) == ["ips", "snips", "dm", "dr"]
    assert list(cpe.evaluate(bandit_without_model, n_bootstrap=0)) == ["ips", "snips"]
    assert list(cpe.evaluate(traj_without_model, n_bootstrap=0)) == ["is", "wis"]
    traj = SmallMDP.make(seed=0).sample(50, np.random.default_rng(1))
    assert list(cpe.evaluate(traj, n_bootstrap=0)) == list(cpe.SEQUENTIAL_ESTIMATORS)


def test_subset_and_order(bandit_with_model):
    report = cpe.evaluate(bandit_with_model, ["dr", "ips"], n_bootstrap=0)
    assert list(report) == ["dr", "ips"]
    assert list(cpe.evaluate(bandit_with_model, "dm", n_bootstrap=0)) == ["dm"]


def test_unknown_estimator_lists_valid_names(bandit_with_model, traj_without_model):
    with pytest.raises(ValueError, match="unknown 'magic'.*valid: ips, snips, dm, dr"):
        cpe.evaluate(bandit_with_model, ["ips", "magic"])
    with pytest.raises(ValueError, match="unknown 'ips'.*valid: is, wis, dm, dr, wdr, magic"):
        cpe.evaluate(traj_without_model, ["ips"])
    with pytest.raises(ValueError, match="empty"):
        cpe.evaluate(bandit_with_model, [])


def test_model_estimators_without_model_raise(bandit_without_model, traj_without_model):
    with pytest.raises(ValueError, match="^reward_estimates: required by dm, dr"):
        cpe.evaluate(bandit_without_model, ["ips", "dm", "dr"])
    for name in ("dm", "dr", "wdr", "magic"):
        with pytest.raises(ValueError, match=f"^q_estimates: required by {name}"):
            cpe.evaluate(traj_without_model, [name])


def test_wrong_data_type():
    with pytest.raises(TypeError, match="BanditLog or Trajectories"):
        cpe.evaluate({"actions": [0]})


def test_estimate_is_frozen_dataclass(bandit_with_model):
    est = cpe.evaluate(bandit_with_model, ["ips"], n_bootstrap=20, seed=0)["ips"]
    assert isinstance(est, cpe.Estimate)
    with pytest.raises(dataclasses.FrozenInstanceError):
        est.value = 1.0
    assert set(est.to_dict()) == {"value", "stderr", "ci_low", "ci_high", "normalized"}


def test_report_mapping_table_and_dict(bandit_with_model):
    report = cpe.evaluate(bandit_with_model, n_bootstrap=30, seed=1)
    assert len(report) == 4 and "dr" in report and "wdr" not in report
    with pytest.raises(KeyError, match="available: ips, snips, dm, dr"):
        report["wdr"]
    table = report.table()
    lines = table.splitlines()
    assert lines[0].startswith("bandit: 500 rows")
    assert "95% CI" in lines[1]
    assert [line.split()[0] for line in lines[3:]] == ["ips", "snips", "dm", "dr"]
    data = report.to_dict()
    json.dumps(data)  # plain types only
    assert data["kind"] == "bandit" and data["n"] == 500 and data["n_bootstrap"] == 30
    assert data["estimates"]["dr"]["value"] == report["dr"].value
    assert "Report(kind='bandit'" in repr(report)


def test_trajectory_report_has_magic_diagnostics():
    traj = SmallMDP.make(seed=0).sample(80, np.random.default_rng(1))
    report = cpe.evaluate(traj, n_bootstrap=10, seed=0)
    assert report.kind == "trajectories" and report.n == traj.n_episodes
    details = report.to_dict()["diagnostics"]["magic"]
    assert sum(details["weights"]) == pytest.approx(1.0)
    assert "episodes" in report.table().splitlines()[0]


def test_zero_logged_value_gives_nan_normalized(caplog):
    log = cpe.BanditLog([0, 1], [0.0, 0.0], [0.5, 0.5], [[0.5, 0.5], [0.5, 0.5]])
    report = cpe.evaluate(log, ["ips"], n_bootstrap=0)
    assert math.isnan(report["ips"].normalized)
    assert "normalized" in caplog.text


def test_all_zero_weights_snips_is_zero_not_nan():
    log = cpe.BanditLog([0, 0], [1.0, 2.0], [0.5, 0.5], [[0.0, 1.0], [0.0, 1.0]])
    report = cpe.evaluate(log, ["snips", "ips"], n_bootstrap=20, seed=0)
    assert report["snips"].value == 0.0 and report["ips"].value == 0.0
    assert report["snips"].stderr == 0.0


def test_containers_expose_shapes(bandit_with_model):
    assert bandit_with_model.n == 500 and bandit_with_model.n_actions == 3
    assert "BanditLog(n=500" in repr(bandit_with_model)
    traj = SmallMDP.make(seed=0).sample(20, np.random.default_rng(2))
    assert traj.n_episodes == 20 and traj.has_model
    assert "Trajectories(" in repr(traj)
