"""Small hand-computed cases that pin every estimator's formula exactly."""

import numpy as np
import pytest

import cpe

# --------------------------------------------------------------------------- bandit
# Three rows, two actions.
#   row  a  r   mu    pi          r_hat
#   0    0  1   0.5   [0.6, 0.4]  [0.5, 0.2]
#   1    1  0   0.25  [0.3, 0.7]  [0.1, 0.3]
#   2    0  2   0.8   [1.0, 0.0]  [1.5, 0.0]
# w = pi(a)/mu = [1.2, 2.8, 1.25];  w*r = [1.2, 0, 2.5]  (sum 3.7);  sum w = 5.25
# DM terms sum_a pi r_hat = [0.38, 0.24, 1.5]  (sum 2.12)
# DR terms DM + w (r - r_hat[a]) = [0.38 + 0.6, 0.24 - 0.84, 1.5 + 0.625] = [0.98, -0.6, 2.125]


def _bandit():
    return cpe.BanditLog(
        actions=[0, 1, 0],
        rewards=[1.0, 0.0, 2.0],
        logged_propensities=[0.5, 0.25, 0.8],
        target_probs=[[0.6, 0.4], [0.3, 0.7], [1.0, 0.0]],
        reward_estimates=[[0.5, 0.2], [0.1, 0.3], [1.5, 0.0]],
    )


def test_bandit_formulas_by_hand():
    report = cpe.evaluate(_bandit(), n_bootstrap=0)
    assert report["ips"].value == pytest.approx(3.7 / 3)
    assert report["snips"].value == pytest.approx(3.7 / 5.25)
    assert report["dm"].value == pytest.approx(2.12 / 3)
    assert report["dr"].value == pytest.approx((0.98 - 0.6 + 2.125) / 3)
    # normalised by the logged policy's mean reward (1 + 0 + 2) / 3 = 1
    assert report.logged_value == pytest.approx(1.0)
    assert report["dr"].normalized == pytest.approx(report["dr"].value)


def test_bandit_normalized_divides_by_logged_mean():
    log = cpe.BanditLog([0, 1], [2.0, 4.0], [0.5, 0.5], [[0.5, 0.5], [0.5, 0.5]])
    report = cpe.evaluate(log, n_bootstrap=0)
    assert report.logged_value == pytest.approx(3.0)
    assert report["ips"].value == pytest.approx(3.0)
    assert report["ips"].normalized == pytest.approx(1.0)


# --------------------------------------------------------------------- trajectories
# Episode "a" (two steps) and episode "b" (one step), gamma = 0.9.
#   ep t  a  r  mu   pi          Q(s_t, .)    rho    W     V(s_t) = sum pi Q
#   a  0  0  1  0.5  [0.8, 0.2]  [1.0, 0.5]   1.6    1.6   0.9
#   a  1  1  2  0.4  [0.5, 0.5]  [0.0, 1.5]   1.25   2.0   0.75
#   b  0  1  3  0.5  [0.4, 0.6]  [1.0, 2.0]   1.2    1.2   1.6   (W stays 1.2 at t=1)
G = 0.9
ROWS = [  # mdp_id, sequence_number, action, reward, mu, pi, q
    ("a", 10, 0, 1.0, 0.5, [0.8, 0.2], [1.0, 0.5]),
    ("a", 20, 1, 2.0, 0.4, [0.5, 0.5], [0.0, 1.5]),
    ("b", 7, 1, 3.0, 0.5, [0.4, 0.6], [1.0, 2.0]),
]


def _trajectories(rows=ROWS, with_model=True):
    ids, seq, a, r, mu, pi, q = (list(col) for col in zip(*rows))
    return cpe.Trajectories(ids, seq, a, r, mu, pi, q if with_model else None, gamma=G)


def test_per_decision_is_by_hand():
    # 1/n sum_i sum_t g^t W r = ((1.6*1 + 0.9*2.0*2) + 1.2*3) / 2
    report = cpe.evaluate(_trajectories(), ["is"], n_bootstrap=0)
    assert report["is"].value == pytest.approx((1.6 + G * 2.0 * 2 + 1.2 * 3) / 2)


def test_weighted_is_keeps_final_weight_of_ended_episode():
    # t=0: (1.6*1 + 1.2*3) / (1.6 + 1.2); t=1: (2.0*2 + 1.2*0) / (2.0 + 1.2)
    # (episode b has ended but keeps W = 1.2 in the normaliser)
    report = cpe.evaluate(_trajectories(), ["wis"], n_bootstrap=0)
    expected = (1.6 + 3.6) / 2.8 + G * 4.0 / 3.2
    assert report["wis"].value == pytest.approx(expected)
    dropped = (1.6 + 3.6) / 2.8 + G * 4.0 / 2.0  # what dropping ended episodes would give
    assert report["wis"].value != pytest.approx(dropped)


def test_direct_method_uses_first_state_value():
    report = cpe.evaluate(_trajectories(), ["dm"], n_bootstrap=0)
    assert report["dm"].value == pytest.approx((0.9 + 1.6) / 2)


def test_sequential_doubly_robust_by_hand():
    # Jiang & Li recursion, episode a: V_DR(s1) = 0.75 + 1.25 (2 - 1.5) = 1.375
    #   V_DR(s0) = 0.9 + 1.6 (1 + 0.9 * 1.375 - 1.0) = 2.88;  episode b: 1.6 + 1.2 (3 - 2) = 2.8
    report = cpe.evaluate(_trajectories(), ["dr"], n_bootstrap=0)
    v1 = 0.75 + 1.25 * (2.0 - 1.5)
    episode_a = 0.9 + 1.6 * (1.0 + G * v1 - 1.0)
    assert episode_a == pytest.approx(2.88)
    assert report["dr"].value == pytest.approx((episode_a + 2.8) / 2)


def test_weighted_doubly_robust_by_hand():
    # t=0: sum W (r - Q) / S_0 + sum V / n = (1.6*0 + 1.2*1) / 2.8 + (0.9 + 1.6) / 2
    # t=1: sum W (r - Q) / S_1 + sum W_0 V_1 / S_0 = (2.0*0.5 + 0) / 3.2 + (1.6*0.75 + 0) / 2.8
    report = cpe.evaluate(_trajectories(), ["wdr"], n_bootstrap=0)
    expected = 1.2 / 2.8 + 2.5 / 2 + G * (1.0 / 3.2 + 1.2 / 2.8)
    assert report["wdr"].value == pytest.approx(expected)


def test_magic_j_step_returns_by_hand():
    report = cpe.evaluate(_trajectories(), ["magic", "wdr", "dm"], n_bootstrap=0)
    details = report.diagnostics["magic"]
    assert details["j_steps"] == [-1, 0, 1]
    g_minus1 = (0.9 + 1.6) / 2  # direct method
    g_0 = 1.2 / 2.8 + 2.5 / 2 + G * (1.6 * 0.75) / 2.8  # one step of WDR, then the model
    g_1 = report["wdr"].value  # full length
    assert details["returns"] == pytest.approx([g_minus1, g_0, g_1])
    weights = np.array(details["weights"])
    assert weights.min() >= 0 and weights.sum() == pytest.approx(1.0)
    assert report["magic"].value == pytest.approx(weights @ np.array(details["returns"]))


def test_shuffled_rows_give_the_same_answer():
    ordered = cpe.evaluate(_trajectories(), n_bootstrap=50, seed=3)
    shuffled_rows = [ROWS[2], ROWS[1], ROWS[0]]
    shuffled = cpe.evaluate(_trajectories(shuffled_rows), n_bootstrap=50, seed=3)
    for name in ordered:
        assert shuffled[name] == ordered[name]


def test_shuffled_large_log_matches_sorted(mdp_log_pair):
    sorted_log, shuffled_log = mdp_log_pair
    a = cpe.evaluate(sorted_log, n_bootstrap=30, seed=1)
    b = cpe.evaluate(shuffled_log, n_bootstrap=30, seed=1)
    for name in a:
        assert b[name].value == pytest.approx(a[name].value, rel=1e-12, abs=1e-12)
        assert b[name].stderr == pytest.approx(a[name].stderr, rel=1e-9, abs=1e-12)


@pytest.fixture
def mdp_log_pair():
    import cpe_problems

    mdp = cpe_problems.SmallMDP.make(seed=4)
    sorted_log = mdp.sample(300, np.random.default_rng(0), shuffle=False)
    perm = np.random.default_rng(1).permutation(sorted_log.n)
    shuffled_log = cpe.Trajectories(
        sorted_log.mdp_ids[perm], sorted_log.sequence_numbers[perm], sorted_log.actions[perm],
        sorted_log.rewards[perm], sorted_log.logged_propensities[perm],
        sorted_log.target_probs[perm], sorted_log.q_estimates[perm], gamma=sorted_log.gamma,
    )
    return sorted_log, shuffled_log


def test_string_and_integer_ids_agree():
    as_strings = cpe.evaluate(_trajectories(), n_bootstrap=0)
    numeric = [(1 if r[0] == "a" else 2,) + r[1:] for r in ROWS]
    as_ints = cpe.evaluate(_trajectories(numeric), n_bootstrap=0)
    for name in as_strings:
        assert as_ints[name].value == pytest.approx(as_strings[name].value)


def test_non_integer_sequence_numbers_only_order_steps():
    fractional = [r[:1] + (r[1] / 7.0,) + r[2:] for r in ROWS]
    a = cpe.evaluate(_trajectories(), n_bootstrap=0)
    b = cpe.evaluate(_trajectories(fractional), n_bootstrap=0)
    for name in a:
        assert b[name].value == pytest.approx(a[name].value)


def test_logged_value_is_mean_discounted_return():
    report = cpe.evaluate(_trajectories(), ["is"], n_bootstrap=0)
    assert report.logged_value == pytest.approx(((1.0 + G * 2.0) + 3.0) / 2)
    assert report["is"].normalized == pytest.approx(report["is"].value / report.logged_value)


def test_episode_matrices_are_padded_as_documented():
    episodes = _trajectories().episodes()
    np.testing.assert_allclose(episodes.weights, [[1.6, 2.0], [1.2, 1.2]])
    np.testing.assert_allclose(episodes.rewards, [[1.0, 2.0], [3.0, 0.0]])
    np.testing.assert_allclose(episodes.v_target, [[0.9, 0.75], [1.6, 0.0]])
    np.testing.assert_allclose(episodes.q_logged, [[1.0, 1.5], [2.0, 0.0]])
    np.testing.assert_array_equal(episodes.lengths, [2, 1])
    assert list(episodes.episode_ids) == ["a", "b"]
