"""Environments: ids, old-gym-style envs, the Gridworld and its exact Q*, and the
vector-env contract (same-step autoreset, final observations, episode tallies,
order kept) for members in this process and in fiberrl processes."""
import numpy as np
import pytest

gym = pytest.importorskip("gymnasium")

from rl.envs import (Gridworld, InProcessVectorEnv, OldGymAdapter, ProcessVectorEnv,  # noqa: E402
                     make_env, make_vector_env, optimal_q, reward_threshold)


def test_make_env_by_id_is_reproducible_with_a_seed():
    first = make_env("CartPole-v1", seed=7)
    second = make_env("CartPole-v1", seed=7)
    assert np.array_equal(first.reset()[0], second.reset()[0])
    assert first.action_space.sample() == second.action_space.sample()


def test_unknown_id_and_bad_spec_are_clear_errors():
    with pytest.raises(ValueError, match="unknown environment 'NoSuchEnv-v0'"):
        make_env("NoSuchEnv-v0")
    with pytest.raises(TypeError, match="environment spec"):
        make_env(42)


class OldStyleCounter:
    """An old-gym-style env: reset returns obs, step returns a 4-tuple, seed()."""

    def __init__(self):
        import gymnasium as gym
        self.observation_space = gym.spaces.Box(0, 10, (1,), np.float32)
        self.action_space = gym.spaces.Discrete(2)
        self.count, self.seeded = 0, None

    def seed(self, value):
        self.seeded = value

    def reset(self):
        self.count = 0
        return np.array([0.0], np.float32)

    def step(self, action):
        self.count += 1
        done = self.count >= 3
        info = {"TimeLimit.truncated": True} if done and action == 1 else {}
        return np.array([self.count], np.float32), 1.0, done, info


def test_old_gym_style_env_is_adapted():
    env = make_env(OldStyleCounter(), seed=5)
    assert isinstance(env.unwrapped, OldGymAdapter)
    obs, info = env.reset()
    assert obs.tolist() == [0.0] and info == {}
    assert env.unwrapped.env.seeded == 5
    assert env.step(0)[2:4] == (False, False)
    env.step(0)
    assert env.step(0)[2:4] == (True, False)          # done -> terminated
    env.reset()
    env.step(1), env.step(1)
    assert env.step(1)[2:4] == (False, True)          # TimeLimit.truncated -> truncated


def test_gridworld_moves_walls_goal_and_truncation():
    env = Gridworld()
    obs, _ = env.reset(seed=0)
    assert obs.argmax() == 0 and obs.sum() == 1
    assert env.move(0, 0) == 0                 # left edge blocks
    assert env.move(1, 3) == 1                 # cell 6 below is a wall
    assert env.move(0, 3) == 5
    env.state = 23
    _, reward, terminated, truncated, _ = env.step(1)
    assert (reward, terminated, truncated) == (1.0, True, False)
    env.reset()
    for _ in range(env.max_steps - 1):
        assert env.step(0)[3] is False
    assert env.step(0)[3] is True
    with pytest.raises(ValueError):
        Gridworld(walls=(0,))


def test_optimal_q_matches_shortest_paths():
    env = Gridworld()
    gamma = 0.9
    q = optimal_q(env, gamma)
    # the goal is 8 moves from the start around the walls: V*(start) = gamma ** 7
    assert q[0].max() == pytest.approx(gamma ** 7)
    assert q[23, 1] == pytest.approx(1.0)     # a step right from 23 reaches the goal
    assert q[23, 0] == pytest.approx(gamma * q[22].max())
    assert np.all(q[env.goal] == 0)


def test_registered_gridworld_and_thresholds():
    env = make_env("rl/Gridworld-v0")
    assert isinstance(env.unwrapped, Gridworld)
    assert reward_threshold("CartPole-v1") == 475
    assert reward_threshold("rl/Gridworld-v0") is None


def _run_vector(env, steps, seed):
    rng = np.random.default_rng(seed)
    trace = [env.reset(seed=seed)]
    episodes, finals = [], 0
    for _ in range(steps):
        obs, rewards, terminated, truncated, info = env.step(rng.integers(0, 2, env.num_envs))
        assert all(a.flags.writeable for a in (obs, rewards, terminated, truncated))  # the caller's
        done = terminated | truncated
        if done.any():
            assert "final_obs" in info
            for i in np.flatnonzero(done):
                assert info["final_obs"][i] is not None
                assert not np.array_equal(info["final_obs"][i], obs[i])  # obs[i] is the reset one
                finals += 1
        episodes.extend(info["episodes"])
        trace.append(obs)
    return np.stack(trace), episodes, finals


def test_in_process_vector_env_autoresets_in_the_same_step_and_tallies_episodes():
    with InProcessVectorEnv("CartPole-v1", 3) as env:
        trace, episodes, finals = _run_vector(env, 200, seed=1)
    assert trace.shape == (201, 3, 4)
    assert len(episodes) == finals > 0
    assert all(ret == length for _, ret, length in episodes)  # CartPole pays 1 per step
    for member in range(3):
        member_steps = sum(length for m, _, length in episodes if m == member)
        assert member_steps <= 200


@pytest.mark.parametrize("per_process, processes", [(2, 2), (3, 1)])
def test_process_vector_env_equals_in_process_env_member_for_member(per_process, processes):
    with InProcessVectorEnv("CartPole-v1", 3) as local:
        expected = _run_vector(local, 60, seed=3)
    with ProcessVectorEnv("CartPole-v1", 3, envs_per_process=per_process) as remote:
        assert len(remote.procs) == processes
        got = _run_vector(remote, 60, seed=3)
    assert np.array_equal(expected[0], got[0])
    assert expected[1] == got[1]


def _crashing_env():
    raise RuntimeError("this simulator does not start")


def test_process_vector_env_reports_a_member_that_dies():
    with pytest.raises(RuntimeError, match=r"env members 0\.\.0 .*died"):
        ProcessVectorEnv(_crashing_env, 1, timeout=60)


def test_make_vector_env_rejects_bad_sizes_and_action_counts():
    with pytest.raises(ValueError):
        make_vector_env("CartPole-v1", 0)
    with make_vector_env("CartPole-v1", 2) as env:
        env.reset(seed=0)
        with pytest.raises(ValueError, match="expected 2 actions"):
            env.step([0])


def test_step_codec_round_trips_numbers_and_declines_the_rest():
    from rl.envs import step_codec
    obs = [np.arange(4, dtype=np.float64), np.ones(4)]   # the env's dtype is kept
    raw = step_codec.encode_answer(obs, [1.0, -2.5], bytearray([0, step_codec.TRUNCATED]),
                                   [np.full(4, 7.0)])
    got, rewards, flags, final = step_codec.decode_answer(b"s" + raw, 1)
    assert got.dtype == np.float64 and np.array_equal(got, np.stack(obs))
    assert not got.flags.writeable   # views of the message: the caller copies
    assert rewards.tolist() == [1.0, -2.5]
    assert flags.tolist() == [0, step_codec.TRUNCATED]
    assert final[0] is None and np.array_equal(final[1], np.full(4, 7.0))
    final[1][0] = 9.0   # a final observation is the caller's own
    raw = step_codec.encode_answer(obs, [0.0, 0.0], bytearray(2), [])
    assert step_codec.decode_answer(b"s" + raw, 1)[3] is None   # no episode ended
    actions = np.array([[0.5, -1.0]], np.float32)
    back = step_codec.decode_actions(step_codec.encode_requests(actions, ((0, 1),), b"s")[0], 1)
    assert back.dtype == np.float32 and np.array_equal(back, actions)
    # dict observations, ragged ones, finals of another shape and object actions: pickles
    assert step_codec.encode_answer([{"a": 1}], [0.0], bytearray(1), []) is None
    assert step_codec.encode_answer([np.ones(2), np.ones(3)], [0.0, 0.0], bytearray(2), []) is None
    assert step_codec.encode_answer([np.ones(2)], [0.0], bytearray([1]), [np.ones(3)]) is None


def test_step_codec_splits_requests_and_joins_answers_of_several_processes():
    from rl.envs import step_codec
    actions = np.array([[1, 2], [3, 4], [5, 6]], np.int64)
    first, second = step_codec.encode_requests(actions, ((0, 2), (2, 3)), b"s")
    assert np.array_equal(step_codec.decode_actions(first, 1), actions[:2])
    assert np.array_equal(step_codec.decode_actions(second, 1), actions[2:])
    assert step_codec.encode_requests(np.array([object()] * 3), ((0, 3),), b"s") is None
    two = b"s" + step_codec.encode_answer([np.zeros(3, np.float32), np.ones(3, np.float32)],
                                          [0.5, 1.5], bytearray(2), [])
    ended = b"s" + step_codec.encode_answer([np.full(3, 2, np.float32)], [2.5],
                                            bytearray([step_codec.TERMINATED]),
                                            [np.full(3, 9, np.float32)])
    obs, rewards, flags, finals = step_codec.decode_answers([two, ended], ord("s"))
    assert obs.shape == (3, 3) and obs.dtype == np.float32
    assert obs.flags.writeable and rewards.flags.writeable and flags.flags.writeable
    assert obs[:, 0].tolist() == [0.0, 1.0, 2.0] and rewards.tolist() == [0.5, 1.5, 2.5]
    assert flags.tolist() == [0, 0, step_codec.TERMINATED]
    assert finals[:2] == [None, None] and finals[2].tolist() == [9.0] * 3
    assert step_codec.decode_answers([two, two], ord("s"))[3] is None   # no episode ended
    # another dtype or a pickled answer: declined, the caller decodes one by one
    doubles = b"s" + step_codec.encode_answer([np.zeros(3)], [0.0], bytearray(1), [])
    assert step_codec.decode_answers([two, doubles], ord("s")) is None
    assert step_codec.decode_answers([two, b"S" + doubles[1:]], ord("s")) is None


class _MixedDtypeEnv(gym.Env):
    """Member 0 observes float32, the others float64: answers the joint decode declines."""
    observation_space = gym.spaces.Box(-1, 1, (2,))
    action_space = gym.spaces.Discrete(2)

    def reset(self, seed=None, options=None):
        super().reset(seed=seed)
        self.dtype = np.float32 if seed == 0 else np.float64
        return np.zeros(2, self.dtype), {}

    def step(self, action):
        return np.full(2, action, self.dtype), 1.0, False, False, {}


def test_process_vector_env_steps_members_of_different_dtypes():
    with ProcessVectorEnv(_MixedDtypeEnv, 2) as env:
        env.reset(seed=0)
        obs, rewards, terminated, truncated, info = env.step([0, 1])
    assert obs.dtype == np.float64 and obs.tolist() == [[0.0, 0.0], [1.0, 1.0]]
    assert rewards.tolist() == [1.0, 1.0] and not terminated.any() and not truncated.any()


class _DictObsEnv(gym.Env):
    """A dict observation space: the pickled path of ProcessVectorEnv."""
    observation_space = gym.spaces.Dict({"x": gym.spaces.Box(-1, 1, (2,))})
    action_space = gym.spaces.Discrete(2)

    def reset(self, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return {"x": np.zeros(2, np.float32)}, {}

    def step(self, action):
        self.t += 1
        return {"x": np.full(2, self.t, np.float32)}, 1.0, self.t >= 3, False, {}


def test_process_vector_env_steps_dict_observations_by_pickle():
    with ProcessVectorEnv(_DictObsEnv, 2) as env:
        env.reset(seed=0)
        for t in range(1, 4):
            obs, rewards, terminated, truncated, info = env.step([0, 1])
        assert terminated.tolist() == [True, True]
        assert [f["x"].tolist() for f in info["final_obs"]] == [[3.0, 3.0], [3.0, 3.0]]
        assert info["episodes"] == [(0, 3.0, 3), (1, 3.0, 3)]
