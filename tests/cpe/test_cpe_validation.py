"""Bad inputs raise ValueError naming the field instead of producing NaN."""

import numpy as np
import pytest

import cpe


def _bandit_kwargs(**override):
    kwargs = dict(
        actions=np.array([0, 1, 1]),
        rewards=np.array([1.0, 0.0, 0.5]),
        logged_propensities=np.array([0.5, 0.5, 0.25]),
        target_probs=np.array([[0.2, 0.8], [0.5, 0.5], [0.1, 0.9]]),
        reward_estimates=np.array([[0.1, 0.2], [0.3, 0.4], [0.5, 0.6]]),
    )
    kwargs.update(override)
    return kwargs


def _traj_kwargs(**override):
    kwargs = dict(
        mdp_ids=np.array([1, 1, 2]),
        sequence_numbers=np.array([0, 1, 0]),
        q_estimates=np.array([[0.1, 0.2], [0.3, 0.4], [0.5, 0.6]]),
        gamma=0.9,
    )
    kwargs.update({k: v for k, v in _bandit_kwargs().items() if k != "reward_estimates"})
    kwargs.update(override)
    return kwargs


BAD_CASES = [
    ("logged_propensities", dict(logged_propensities=np.array([0.5, 0.0, 0.25])), "zero"),
    ("logged_propensities", dict(logged_propensities=np.array([0.5, np.nan, 0.25])), "NaN"),
    ("logged_propensities", dict(logged_propensities=np.array([0.5, 1.5, 0.25])), r"\[0, 1\]"),
    ("logged_propensities", dict(logged_propensities=np.array([0.5, -0.2, 0.25])), r"\[0, 1\]"),
    ("logged_propensities", dict(logged_propensities=np.array([0.5, 0.5])), "rows"),
    ("target_probs", dict(target_probs=np.array([[0.2, 0.8], [0.5, 0.6], [0.1, 0.9]])), "sum to 1"),
    ("target_probs", dict(target_probs=np.array([[1.2, -0.2], [0.5, 0.5], [0.1, 0.9]])), r"\[0, 1\]"),
    ("target_probs", dict(target_probs=np.array([[np.nan, 1.0], [0.5, 0.5], [0.1, 0.9]])), "NaN"),
    ("target_probs", dict(target_probs=np.array([0.5, 0.5, 0.5])), "shape"),
    ("target_probs", dict(target_probs=np.array([[0.2, 0.8], [0.5, 0.5]])), "rows"),
    ("actions", dict(actions=np.array([0, 2, 1])), "range"),
    ("actions", dict(actions=np.array([0, -1, 1])), "range"),
    ("actions", dict(actions=np.array([0.0, 0.5, 1.0])), "integer"),
    ("actions", dict(actions=np.array([], dtype=int)), "empty"),
    ("rewards", dict(rewards=np.array([1.0, np.nan, 0.5])), "NaN"),
    ("rewards", dict(rewards=np.array([1.0, np.inf, 0.5])), "infinite"),
    ("rewards", dict(rewards=np.array([1.0, 0.5])), "rows"),
    ("rewards", dict(rewards=["a", "b", "c"]), "numbers"),
]


@pytest.mark.parametrize("field, override, message", BAD_CASES)
def test_bandit_rejects_bad_input(field, override, message):
    with pytest.raises(ValueError, match=message) as info:
        cpe.BanditLog(**_bandit_kwargs(**override))
    assert str(info.value).startswith(field)


@pytest.mark.parametrize("field, override, message", BAD_CASES)
def test_trajectories_reject_bad_input(field, override, message):
    with pytest.raises(ValueError, match=message) as info:
        cpe.Trajectories(**_traj_kwargs(**override))
    assert str(info.value).startswith(field)


def test_target_row_sum_tolerance():
    probs = np.array([[0.2, 0.8 + 5e-5], [0.5, 0.5], [0.1, 0.9]])
    cpe.BanditLog(**_bandit_kwargs(target_probs=probs))  # within 1e-4: accepted
    probs[0, 1] = 0.8 + 5e-4
    with pytest.raises(ValueError, match="target_probs"):
        cpe.BanditLog(**_bandit_kwargs(target_probs=probs))


def test_model_shape_errors_name_the_field():
    with pytest.raises(ValueError, match="^reward_estimates: has 3 action columns"):
        cpe.BanditLog(**_bandit_kwargs(reward_estimates=np.ones((3, 3))))
    with pytest.raises(ValueError, match="^reward_estimates: contains NaN"):
        cpe.BanditLog(**_bandit_kwargs(reward_estimates=np.array([[np.nan, 0]] * 3)))
    with pytest.raises(ValueError, match="^q_estimates: has 2 rows"):
        cpe.Trajectories(**_traj_kwargs(q_estimates=np.ones((2, 2))))


def test_trajectory_specific_errors():
    with pytest.raises(ValueError, match="^mdp_ids: has 2 rows"):
        cpe.Trajectories(**_traj_kwargs(mdp_ids=np.array([1, 1])))
    with pytest.raises(ValueError, match="^mdp_ids: missing"):
        cpe.Trajectories(**_traj_kwargs(mdp_ids=np.array([1.0, np.nan, 2.0])))
    with pytest.raises(ValueError, match="^sequence_numbers: contains NaN"):
        cpe.Trajectories(**_traj_kwargs(sequence_numbers=np.array([0.0, np.nan, 0.0])))
    with pytest.raises(ValueError, match="^gamma"):
        cpe.Trajectories(**_traj_kwargs(gamma=1.5))
    duplicate = cpe.Trajectories(**_traj_kwargs(sequence_numbers=np.array([4, 4, 0])))
    with pytest.raises(ValueError, match="^sequence_numbers: duplicate"):
        cpe.evaluate(duplicate)


def test_weight_overflow_is_reported():
    n = 400
    traj = cpe.Trajectories(
        np.zeros(n, dtype=int), np.arange(n), np.zeros(n, dtype=int), np.ones(n),
        np.full(n, 0.01), np.tile([1.0, 0.0], (n, 1)),
    )
    with pytest.raises(ValueError, match="overflow"):
        traj.episodes()


def test_arrays_are_read_only_and_caller_arrays_untouched():
    kwargs = _bandit_kwargs()
    log = cpe.BanditLog(**kwargs)
    with pytest.raises(ValueError):
        log.rewards[0] = 5.0
    kwargs["rewards"][0] = np.nan  # the caller's array stays writable ...
    assert log.rewards[0] == 1.0  # ... and changing it cannot bypass validation


def test_large_integer_sequence_numbers_stay_exact():
    base = 1_700_000_000_000_000_000  # nanosecond timestamps: float64 would merge them
    traj = cpe.Trajectories(**_traj_kwargs(sequence_numbers=np.array([base, base + 1, base])))
    np.testing.assert_array_equal(traj.episodes().lengths, [2, 1])
