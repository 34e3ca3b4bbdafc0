"""OpenAI-ES (rl.algos.es): noise table, rank shaping, antithetic pairs, learnability,
reproducibility across worker counts, checkpoint resume and argument checks.

Longer runs (CartPole to 475, scaling, Slurm) are in bench/bench_es.py.
"""
import copy
import pickle

import gymnasium as gym
import numpy as np
import pytest

import fiberrl
from rl.algos.es import ES, Adam, centered_ranks
from rl.algos.es_worker import ESTask, evaluate_task, perturbed_params
from rl.algos.noise_table import NoiseTable, shared_table
from rl.algos.numpy_policy import NumpyMLP
from rl.evaluation import evaluate

SMALL_TABLE = 200_000


class LineEnv(gym.Env):
    """One step; the observation is [1]; the reward is the (unbounded) action itself."""

    observation_space = gym.spaces.Box(-np.inf, np.inf, (1,), np.float32)
    action_space = gym.spaces.Box(-np.inf, np.inf, (1,), np.float32)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return np.ones(1, np.float32), {}

    def step(self, action):
        return np.ones(1, np.float32), float(np.asarray(action).reshape(-1)[0]), True, False, {}


def make_line_env():
    """LineEnv's constructor (rl.envs.make_env takes an env *class* for an old-gym object)."""
    return LineEnv()


class SerialPool:
    """A stand-in pool that runs tasks in this process (for tests about the learner)."""

    def map(self, fn, iterable, chunksize=None):
        return [fn(x) for x in iterable]


def _es(env="CartPole-v1", **kwargs):
    options = dict(population=16, episodes_per_task=4, noise_table_size=SMALL_TABLE, seed=3)
    options.update(kwargs)
    return ES(env, **options)


# -- noise table ---------------------------------------------------------------------------
def test_noise_table_same_slice_for_same_index_and_seed():
    a, b = NoiseTable(7, 50_000), NoiseTable(7, 50_000)
    assert np.array_equal(a.get(123, 40), b.get(123, 40))
    assert not np.array_equal(a.get(123, 40), NoiseTable(8, 50_000).get(123, 40))
    assert np.array_equal(a.stack(np.array([5, 123]), 40), np.stack([a.get(5, 40), a.get(123, 40)]))
    assert a.noise.dtype == np.float32
    assert abs(float(a.noise.mean())) < 0.02 and abs(float(a.noise.std()) - 1.0) < 0.02
    with pytest.raises(IndexError):
        a.get(50_000 - 39, 40)


def test_noise_table_cached_per_process_and_weighted_sum():
    assert shared_table(11, 30_000) is shared_table(11, 30_000)
    table = shared_table(11, 30_000)
    rng = np.random.default_rng(0)
    indices = table.sample_index(rng, 25, 300)
    assert indices.min() >= 0 and indices.max() <= 30_000 - 25
    weights = rng.standard_normal(300)
    expected = sum(w * table.get(i, 25).astype(np.float64) for w, i in zip(weights, indices))
    np.testing.assert_allclose(table.weighted_sum(weights, indices, 25, batch=64), expected, atol=1e-9)


# -- rank shaping and the optimizer ----------------------------------------------------------
def test_centered_ranks_values_zero_mean_and_ties():
    np.testing.assert_allclose(centered_ranks(np.array([3.0, -1.0, 10.0])), [0.0, -0.5, 0.5])
    values = np.random.default_rng(1).standard_normal((50, 2))
    ranks = centered_ranks(values)
    assert ranks.shape == (50, 2)
    assert abs(ranks.sum()) < 1e-12 and ranks.min() == -0.5 and ranks.max() == 0.5
    assert np.array_equal(np.argsort(ranks.ravel()), np.argsort(values.ravel()))
    tied = centered_ranks(np.array([[500.0, 500.0], [20.0, 30.0], [500.0, 40.0]]))
    assert tied[0, 0] == tied[0, 1] == tied[2, 0]  # tied returns share a rank: no signal
    assert abs(tied.sum()) < 1e-12
    with pytest.raises(ValueError):
        centered_ranks(np.array([1.0, np.nan]))


def test_adam_first_step_is_learning_rate_times_sign():
    adam = Adam(3, 0.1)
    np.testing.assert_allclose(adam.step(np.array([2.0, -0.5, 0.0])), [-0.1, 0.1, 0.0], atol=1e-6)


# -- antithetic pairs ----------------------------------------------------------------------
def test_perturbations_are_antithetic_pairs():
    table = NoiseTable(2, 10_000)
    theta = np.random.default_rng(0).standard_normal(30).astype(np.float32)
    eps = table.stack(np.array([0, 77, 5_000]), 30)
    params = perturbed_params(theta, 0.1, eps)
    assert params.shape == (6, 30)
    np.testing.assert_allclose((params[0::2] + params[1::2]) / 2, np.broadcast_to(theta, (3, 30)), atol=1e-6)
    np.testing.assert_allclose(params[0::2] - params[1::2], 0.2 * eps, atol=1e-6)


def test_task_evaluates_both_members_of_each_pair():
    policy = NumpyMLP.for_spaces(LineEnv.observation_space, LineEnv.action_space, hidden=())
    theta = np.array([0.3, -0.1], np.float32)  # reward = w * 1 + b
    task = ESTask(make_line_env, policy, theta, 0.5, noise_seed=4, noise_size=1_000,
                  noise_indices=np.array([10, 500, 10]), episode_seeds=np.array([1, 2, 3]))
    result = evaluate_task(task)
    eps_sum = NoiseTable(4, 1_000).stack(task.noise_indices, 2).sum(axis=1)
    assert result.returns.shape == result.lengths.shape == (3, 2)
    assert (result.lengths == 1).all()
    np.testing.assert_allclose(result.returns.sum(axis=1), 2 * 0.2, atol=1e-5)
    np.testing.assert_allclose(result.returns[:, 0] - result.returns[:, 1], 2 * 0.5 * eps_sum, atol=1e-5)
    assert result.returns[0, 0] == result.returns[2, 0]  # same offset, same perturbation


# -- learning ------------------------------------------------------------------------------
def test_es_climbs_a_linear_reward_in_process():
    with _es(make_line_env, hidden=(), pool=SerialPool(), sigma=0.1, learning_rate=0.1) as es:
        before = float(es.compute_actions(np.ones((1, 1)))[0][0, 0])
        for _ in range(10):
            generation = es.generation()
        after = float(es.compute_actions(np.ones((1, 1)))[0][0, 0])
    assert after > before + 0.5
    assert generation.env_steps == 16 and len(generation.episodes) == 16


def test_es_learns_cartpole_on_a_pool():
    """Learnability bar: deterministic evaluation >= 195 within 60,000 training steps."""
    with ES("CartPole-v1", seed=0, workers=2, noise_table_size=1_000_000) as es:
        best = 0.0
        while es.env_steps < 60_000 and best < 195:
            generation = es.generation()
            assert generation.env_steps == sum(n for _, n in generation.episodes)
            best = max(best, evaluate(es, "CartPole-v1", episodes=5).mean)
        assert best >= 195, f"eval {best} after {es.env_steps} steps"
        for key in ("return_mean", "return_max", "update_norm", "generation_s", "pool_eval_s"):
            assert key in generation.stats
    with pytest.raises(ValueError, match="closed"):
        es.generation()


def test_same_parameters_whatever_the_number_of_workers():
    thetas = []
    for workers in (1, 2):
        pool = fiberrl.Pool(workers)
        try:
            es = _es(pool=pool)
            steps = [es.generation().env_steps for _ in range(2)]
            thetas.append((es.theta.copy(), steps))
        finally:
            pool.close()
            pool.join()
    assert np.array_equal(thetas[0][0], thetas[1][0])
    assert thetas[0][1] == thetas[1][1]
    serial = _es(pool=SerialPool())
    serial.generation()
    serial.generation()
    assert np.array_equal(serial.theta, thetas[0][0])


def test_a_large_theta_crosses_the_wire_once_per_worker_per_generation(make_pool):
    """ES hands every task the same theta object: the pool's argument cache sends it to
    each worker once per generation (theta here: 68k float32, 270 KB)."""
    pool = make_pool(2)
    es = _es(pool=pool, hidden=(256, 256), population=32, episodes_per_task=2,
             max_episode_steps=20)
    assert es.policy.num_params * 4 >= 64 * 1024
    for _ in range(2):
        before = pool.stats()
        es.generation()
        after = pool.stats()
        sends = after.cached_arg_sends - before.cached_arg_sends
        hits = after.cached_arg_hits - before.cached_arg_hits
        assert 1 <= sends <= 2, after
        assert sends + hits == 16  # every task's theta came from a worker's cache
        assert after.payload_bytes_sent - before.payload_bytes_sent < 3 * es.policy.num_params * 4


def test_state_dict_resume_continues_identically():
    es = _es(pool=SerialPool())
    es.generation()
    state = pickle.loads(pickle.dumps(es.state_dict()))
    expected = [es.generation().episodes for _ in range(2)]
    resumed = _es(pool=SerialPool(), seed=3)
    resumed.load_state_dict(copy.deepcopy(state))
    assert [resumed.generation().episodes for _ in range(2)] == expected
    assert np.array_equal(resumed.theta, es.theta)
    assert resumed.generations == es.generations == 3 and resumed.env_steps == es.env_steps
    with pytest.raises(ValueError):
        _es(pool=SerialPool(), seed=4).load_state_dict(state)


def test_compute_actions_discrete_and_box():
    cartpole = _es(pool=SerialPool())
    actions, extras = cartpole.compute_actions(np.zeros((5, 4), np.float32), explore=False)
    assert actions.shape == (5,) and set(actions.tolist()) <= {0, 1}
    assert extras["outputs"].shape == (5, 2)
    pendulum = _es("Pendulum-v1", pool=SerialPool(), hidden=(8,))
    actions, _ = pendulum.compute_actions(np.random.default_rng(0).normal(0, 5, (7, 3)), explore=False)
    assert actions.shape == (7, 1) and actions.dtype == np.float32
    assert (np.abs(actions) <= 2.0).all()
    generation = pendulum.generation()
    assert generation.env_steps == 16 * 200


# -- bad arguments -------------------------------------------------------------------------
@pytest.mark.parametrize("kwargs", [
    dict(population=15), dict(population=0), dict(population=1), dict(sigma=0.0),
    dict(sigma=-0.1), dict(learning_rate=0.0), dict(weight_decay=-1.0), dict(episodes_per_task=3),
    dict(max_episode_steps=0), dict(seed=-1), dict(workers=0), dict(noise_table_size=10),
])
def test_bad_arguments_raise_value_error(kwargs):
    with pytest.raises(ValueError):
        _es(pool=SerialPool(), **kwargs)


def test_env_object_is_refused():
    env = gym.make("CartPole-v1")
    with pytest.raises(TypeError, match="constructor"):
        ES(env, pool=SerialPool())
    env.close()
