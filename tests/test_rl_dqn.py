"""DQN family: n-step replay by hand, targets by hand on fixed networks (double-Q, SARSA,
action masks), the dueling identity, the parametric-action wrapper, learnability on tiny
envs, the ``update`` API, checkpoints, bad configs and the ``train`` builders."""
import numpy as np
import pytest

torch = pytest.importorskip("torch")
gym = pytest.importorskip("gymnasium")

import rl  # noqa: E402
from rl.algos.dqn import DQN, linear_epsilon  # noqa: E402
from rl.algos.parametric_dqn import ParametricDQN  # noqa: E402
from rl.algos.replay import ReplayBuffer  # noqa: E402
from rl.envs.parametric import ParametricActions, ParametricLayout  # noqa: E402
from rl.hooks import Evaluate  # noqa: E402

BOX2 = gym.spaces.Box(-10, 10, (2,), np.float32)


@pytest.fixture(autouse=True)
def one_torch_thread():
    """Small networks: intra-op threads only add contention (10x slower on a busy machine)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


# -- replay -------------------------------------------------------------------------
def _feed(buffer, final_actions=None):
    """Six vector steps of two members; obs values name the steps (see the test)."""
    obs = [[0, 100], [1, 101], [2, 200], [3, 201], [300, 202], [301, 203]]
    rewards = [[1, 10], [2, 20], [3, 30], [4, 40], [5, 50], [6, 60]]
    terminated = [[0, 0], [0, 0], [0, 0], [1, 0], [0, 0], [0, 0]]
    truncated = [[0, 0], [0, 1], [0, 0], [0, 0], [0, 0], [0, 0]]
    for t in range(6):
        o = np.array(obs[t], np.float32).reshape(2, 1)
        nxt = o + 1
        if t == 1:
            nxt[1] = 102          # member 1's true final observation (truncation)
        if t == 3:
            nxt[0] = 4            # member 0's true final observation (termination)
        fa = None if final_actions is None or not (terminated[t][1] or truncated[t][1]) else final_actions
        buffer.add(o, o[:, 0].astype(np.int64), np.array(rewards[t], float),
                   np.array(terminated[t], bool), np.array(truncated[t], bool), nxt, final_actions=fa)


def _rows(buffer):
    a = buffer.arrays
    return {int(a["obs"][i, 0]): (pytest.approx(float(a["rewards"][i])), int(a["next_obs"][i, 0]),
                                  bool(a["terminated"][i]), pytest.approx(float(a["discounts"][i])),
                                  int(a["next_actions"][i]))
            for i in range(len(buffer))}


def test_replay_n_step_returns_across_an_episode_end_and_a_truncation():
    buffer = ReplayBuffer(100, (1,), num_envs=2, n_step=3, gamma=0.5, seed=0)
    _feed(buffer)
    assert _rows(buffer) == {
        # member 0: rewards 1..4, terminated after obs 3 (final obs 4)
        0: (1 + 0.5 * 2 + 0.25 * 3, 3, False, 0.125, -1),
        1: (2 + 0.5 * 3 + 0.25 * 4, 4, True, 0.125, -1),
        2: (3 + 0.5 * 4, 4, True, 0.25, -1),
        3: (4, 4, True, 0.5, -1),
        # member 1: rewards 10, 20, truncated (final obs 102): bootstraps, shorter discounts
        100: (10 + 0.5 * 20, 102, False, 0.25, -1),
        101: (20, 102, False, 0.5, -1),
        # member 1's next episode: full windows only
        200: (30 + 0.5 * 40 + 0.25 * 50, 203, False, 0.125, -1),
        201: (40 + 0.5 * 50 + 0.25 * 60, 204, False, 0.125, -1),
    }
    assert buffer.pending() == 4  # 300, 301 (member 0) and 202, 203 (member 1)
    batch = buffer.sample(5)
    assert batch["obs"].shape == (5, 1) and batch["actions"].dtype == np.int64


def test_replay_sarsa_keeps_the_next_action_and_the_ring_overwrites():
    buffer = ReplayBuffer(100, (1,), num_envs=2, n_step=3, gamma=0.5, track_next_action=True)
    _feed(buffer, final_actions=np.array([-7, 77]))
    rows = _rows(buffer)
    assert rows[0][4] == 3                       # a_{t+3}: the action at obs 3
    assert rows[1][4] == -1 and rows[3][4] == -1  # termination: no next action
    assert rows[100][4] == 77 and rows[101][4] == 77  # truncation: the given final action
    assert rows[200][4] == 203                    # a_{t+3} became known in the last step
    assert 201 not in rows                        # held back until a_{t+3} is known
    small = ReplayBuffer(3, (1,), n_step=1, gamma=0.9)
    for t in range(5):
        small.add(np.full((1, 1), t), [t], [1.0], [False], [False], np.full((1, 1), t + 1))
    assert len(small) == 3 and sorted(small.arrays["obs"][:, 0]) == [2, 3, 4]


# -- targets by hand on fixed networks ----------------------------------------------
def _linear_dqn(**config):
    policy = DQN(BOX2, gym.spaces.Discrete(3), seed=0,
                 config={"hidden": (), "dueling": False, "gamma": 0.5, **config})
    with torch.no_grad():
        policy.model.head.weight.copy_(torch.tensor([[1.0, 0.0], [0.0, 1.0], [0.5, 0.5]]))
        policy.model.head.bias.zero_()
        policy.target_model.head.weight.copy_(torch.tensor([[2.0, 0.0], [0.0, 1.0], [0.0, 0.0]]))
        policy.target_model.head.bias.copy_(torch.tensor([0.0, 0.0, 3.0]))
    return policy


BATCH = {"obs": np.zeros((3, 2), np.float32), "actions": np.array([0, 1, 2]),
         "rewards": np.array([1.0, 1.0, 1.0]), "terminated": np.array([False, False, True]),
         "next_obs": np.array([[1.0, 0.0], [0.0, 4.0], [9.0, 9.0]], np.float32)}


def test_double_q_target_by_hand():
    # next obs [1, 0]: online Q = [1, 0, .5] -> a* = 0; target Q = [2, 0, 3] -> 2 (plain max: 3)
    # next obs [0, 4]: online Q = [0, 4, 2] -> a* = 1; target Q = [0, 4, 3] -> 4 (plain max: 4)
    # third row terminated: reward only
    double = _linear_dqn(double_q=True)
    targets = double.td_targets(double.batch_tensors(BATCH))
    assert targets.tolist() == pytest.approx([1 + 0.5 * 2, 1 + 0.5 * 4, 1.0])
    plain = _linear_dqn(double_q=False)
    assert plain.td_targets(plain.batch_tensors(BATCH)).tolist() == pytest.approx([2.5, 3.0, 1.0])
    # explicit discounts (multi-step, time gaps) replace gamma
    batch = {**BATCH, "discounts": np.array([0.25, 1.0, 1.0])}
    assert double.td_targets(double.batch_tensors(batch)).tolist() == pytest.approx([1.5, 5.0, 1.0])


def test_sarsa_target_uses_the_next_actions():
    policy = _linear_dqn(target="sarsa")
    batch = {**BATCH, "next_actions": np.array([2, 0, -1])}
    # target Q(next, a'): row 0 -> [2, 0, 3][2] = 3, row 1 -> [0, 4, 3][0] = 0
    assert policy.td_targets(policy.batch_tensors(batch)).tolist() == pytest.approx([2.5, 1.0, 1.0])
    with pytest.raises(KeyError, match="next_actions"):
        policy.batch_tensors(BATCH)
    with pytest.raises(ValueError, match="no next action"):
        policy.td_targets(policy.batch_tensors({**batch, "next_actions": np.array([-1, 0, 0])}))


def test_possible_next_actions_restrict_the_max():
    mask = np.array([[False, True, False], [True, False, True], [False, False, False]])
    for double, expected in ((False, [1.0, 2.5, 1.0]), (True, [1.0, 2.5, 1.0])):
        # row 0: only action 1 -> target Q 0; row 1: actions 0, 2 -> online picks 2 (2 > 0),
        # target Q[2] = 3; plain max over {0: 0, 2: 3} = 3
        policy = _linear_dqn(double_q=double)
        batch = {**BATCH, "possible_next_actions": mask}
        assert policy.td_targets(policy.batch_tensors(batch)).tolist() == pytest.approx(expected)
    # a non-terminal row with no possible action bootstraps 0
    policy = _linear_dqn()
    batch = {**BATCH, "terminated": np.zeros(3, bool), "possible_next_actions": mask}
    assert policy.td_targets(policy.batch_tensors(batch))[2].item() == pytest.approx(1.0)


def test_dueling_head_is_value_plus_centred_advantage():
    policy = DQN(BOX2, gym.spaces.Discrete(4), seed=1, config={"hidden": (8,)})
    obs = torch.randn(5, 2)
    value, advantage = policy.model.streams(obs)
    q = policy.q_values(obs)
    assert torch.allclose(q, value + advantage - advantage.mean(1, keepdim=True), atol=1e-6)
    assert torch.allclose(q.mean(1), value.squeeze(1), atol=1e-5)
    # the parametric dueling head centres over the listed actions only
    layout = ParametricLayout(2, 3, 2)
    pdqn = ParametricDQN(gym.spaces.Box(-1, 1, (layout.size,), np.float32), gym.spaces.Discrete(3),
                         seed=0, config={**layout.policy_config(), "hidden": (8,)})
    obs = torch.rand(4, layout.size)
    obs[:, -3:] = torch.tensor([1.0, 1.0, 0.0])
    state, features, mask = layout.split(obs)
    value, advantage = pdqn.model.streams(state, features)
    q = pdqn.q_values(obs)
    expected = value + advantage - advantage[:, :2].mean(1, keepdim=True)
    assert torch.allclose(q[:, :2], expected[:, :2], atol=1e-6) and torch.isinf(q[:, 2]).all()


def test_update_lowers_the_td_loss_and_leaves_the_target_alone():
    policy = DQN(BOX2, gym.spaces.Discrete(3), seed=0, config={"hidden": (16,), "lr": 1e-2})
    rng = np.random.default_rng(0)
    batch = {"obs": rng.normal(size=(32, 2)).astype(np.float32), "actions": rng.integers(0, 3, 32),
             "rewards": rng.normal(size=32), "next_obs": rng.normal(size=(32, 2)).astype(np.float32),
             "terminated": rng.random(32) < 0.3, "discounts": np.full(32, 0.9)}
    target_before = [p.clone() for p in policy.target_model.parameters()]
    first = policy.update(batch)
    assert {"td_loss", "q_mean", "target_mean", "grad_norm"} <= set(first)
    for _ in range(100):
        last = policy.update(batch)
    assert last["td_loss"] < 0.5 * first["td_loss"]
    assert all(torch.equal(a, b) for a, b in zip(target_before, policy.target_model.parameters()))
    policy.update_target(tau=0.5)
    online = list(policy.model.parameters())
    assert torch.allclose(next(policy.target_model.parameters()), (target_before[0] + online[0]) / 2)
    policy.update_target()
    assert all(torch.equal(a, b) for a, b in zip(policy.model.parameters(), policy.target_model.parameters()))


def test_preprocessor_runs_before_the_torso():
    class Scale(torch.nn.Module):
        def forward(self, x):
            return torch.cat([x, 2 * x], dim=1)

    policy = DQN(BOX2, gym.spaces.Discrete(2), seed=0, preprocessor=Scale(), config={"hidden": (8,)})
    assert policy.model.torso[0].in_features == 4            # inferred by a dummy forward
    assert policy.q_values(np.ones((3, 2), np.float32)).shape == (3, 2)
    with pytest.raises(TypeError, match="nn.Module"):
        DQN(BOX2, gym.spaces.Discrete(2), preprocessor=lambda x: x)


# -- parametric-action env ------------------------------------------------------------
class Items(gym.Env):
    """Five-step episodes; action i pays VALUES[i]; the observation counts the steps."""

    VALUES = np.array([0.0, 0.25, 0.5, 0.75, 1.0])
    observation_space = gym.spaces.Box(0, 1, (1,), np.float32)
    action_space = gym.spaces.Discrete(5)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return np.zeros(1, np.float32), {}

    def step(self, action):
        self.t += 1
        return np.full(1, self.t / 5, np.float32), float(self.VALUES[action]), self.t == 5, False, {}


def make_items():
    return ParametricActions(Items(), hide_probability=0.5, shuffle=True, max_actions=6)


def test_parametric_wrapper_layout_and_changing_action_sets():
    env = make_items()
    layout = env.layout
    assert layout == ParametricLayout(1, 6, 5) and env.observation_space.shape == (layout.size,)
    obs, _ = env.reset(seed=3)
    seen = set()
    for _ in range(20):
        state, features, mask = layout.split(obs[None])
        listed = int(mask.sum())
        assert 1 <= listed <= 5 and mask[0, :listed].all() and not mask[0, listed:].any()
        assert np.array_equal(features[0, :listed], np.eye(5)[env.listed])
        seen.add(tuple(env.listed))
        slot = int(np.argmax(features[0, :listed] @ Items.VALUES))
        best = Items.VALUES[env.listed].max()
        obs, reward, terminated, _, _ = env.step(slot)
        assert reward == best            # the slot chosen by features is the listed best
        if terminated:
            obs, _ = env.reset()
    assert len(seen) > 5                                        # the sets and orders change
    with pytest.raises(ValueError, match="lists no action"):
        env.reset(seed=0)
        env.step(5)
    vector = rl.make_vector_env(make_items, 3, seed=0)
    assert vector.reset().shape == (3, layout.size)
    vector.close()


def _oracle_return(episodes=10, seed=10_000):
    total = 0.0
    for i in range(episodes):
        env = make_items()
        obs, _ = env.reset(seed=seed + i)
        done = False
        while not done:
            obs, reward, done, _, _ = env.step(int(np.argmax(Items.VALUES[env.listed])))
            total += reward
    return total / episodes


def test_parametric_dqn_learns_to_pick_the_best_listed_item():
    torch.manual_seed(0)
    env = rl.make_vector_env(make_items, 2, seed=0)
    config = {**env.envs[0].get_wrapper_attr("layout").policy_config(), "hidden": (32,),
              "learning_starts": 200, "train_every": 1, "target_update_every": 100,
              "epsilon_decay_steps": 1000, "gamma": 0.5, "n_step": 1, "lr": 3e-3,
              "minibatch_size": 32}
    policy = ParametricDQN(env.observation_space, env.action_space, seed=0, config=config)
    explored, _ = policy.compute_actions(env.reset(), explore=True)
    assert all(env.envs[i].get_wrapper_attr("listed").size > a for i, a in enumerate(explored))
    evaluate = Evaluate(make_items, every_steps=500, threshold=0.97 * _oracle_return())
    state = rl.run(policy, env, rl.AfterSteps(4000) | rl.RewardReached(evaluate.threshold),
                   [evaluate], seed=0)
    env.close()
    assert evaluate.solved_at_steps is not None, (evaluate.threshold, state.evaluations)


# -- learnability, checkpoints, configs, builders -------------------------------------
def test_dqn_solves_the_gridworld():
    torch.manual_seed(0)
    env = rl.make_vector_env(rl.envs.GRIDWORLD_ID, 2, seed=0)
    config = {"hidden": (32,), "learning_starts": 500, "train_every": 1, "target_update_every": 200,
              "epsilon_decay_steps": 3000, "gamma": 0.9, "lr": 2e-3, "minibatch_size": 32}
    policy = DQN(env.observation_space, env.action_space, seed=0, config=config)
    evaluate = Evaluate(rl.envs.GRIDWORLD_ID, every_steps=500, episodes=1, threshold=1.0)
    state = rl.run(policy, env, rl.AfterSteps(8000) | rl.RewardReached(1.0), [evaluate], seed=0)
    env.close()
    assert state.evaluations[-1][1] == 1.0, state.evaluations
    assert policy.updates > 0 and policy.env_steps == state.env_steps


def test_sarsa_learns_online_through_truncations():
    # the Gridworld truncates after 50 steps: the behaviour action at the final obs is kept
    env = rl.make_vector_env(rl.envs.GRIDWORLD_ID, 2, seed=0)
    config = {"target": "sarsa", "n_step": 2, "learning_starts": 100, "minibatch_size": 32,
              "hidden": (16,), "epsilon_decay_steps": 0, "epsilon_end": 0.5}
    policy = DQN(env.observation_space, env.action_space, seed=0, config=config)
    state = rl.run(policy, env, rl.AfterSteps(400), seed=0)
    env.close()
    assert state.episodes >= 2 and policy.updates > 0 and np.isfinite(state.last_stats["td_loss"])
    stored = {k: v[:len(policy.replay)] for k, v in policy.replay.arrays.items()}
    assert (stored["next_actions"][~stored["terminated"]] >= 0).all()


def test_state_dict_round_trip():
    env = rl.make_vector_env("CartPole-v1", 2, seed=0)
    config = {"learning_starts": 64, "minibatch_size": 16, "target_update_every": 50, "hidden": (16,)}
    policy = DQN(env.observation_space, env.action_space, seed=0, config=config)
    rl.run(policy, env, rl.AfterSteps(200), seed=0)
    env.close()
    state = policy.state_dict()
    other = DQN(env.observation_space, env.action_space, seed=5, config=config)
    other.load_state_dict(state)
    obs = np.random.default_rng(0).normal(size=(4, 4)).astype(np.float32)
    assert torch.equal(policy.q_values(obs), other.q_values(obs))
    assert all(torch.equal(a, b) for a, b in zip(policy.target_model.parameters(),
                                                  other.target_model.parameters()))
    assert (other.env_steps, other.updates) == (200, policy.updates) and other.epsilon == policy.epsilon
    assert other.replay is None and other.refill == 64  # the buffer refills before learning resumes
    assert policy.updates > 0


@pytest.mark.parametrize("config, error, match", [
    ({"target": "expected_sarsa"}, ValueError, "target must be"),
    ({"n_step": 0}, ValueError, "n_step"),
    ({"loss": "l1"}, ValueError, "loss must be"),
    ({"tau": 0.0}, ValueError, "tau"),
    ({"batch_mode": "episodes"}, ValueError, "fragments"),
    ({"buffer": 10}, TypeError, "unknown config keys.*buffer_size"),
])
def test_bad_config_is_a_clear_error(config, error, match):
    with pytest.raises(error, match=match):
        DQN(BOX2, gym.spaces.Discrete(2), config=config)


def test_bad_parametric_setup_is_a_clear_error():
    with pytest.raises(ValueError, match="layout"):
        ParametricDQN(BOX2, gym.spaces.Discrete(2))
    with pytest.raises(ValueError, match="observation space"):
        ParametricDQN(BOX2, gym.spaces.Discrete(2),
                      config={"state_size": 4, "max_actions": 2, "action_feature_size": 2})
    with pytest.raises(TypeError, match="Discrete"):
        DQN(BOX2, gym.spaces.Box(-1, 1, (1,)))
    layout = ParametricLayout(4, 2, 2)
    policy = ParametricDQN(gym.spaces.Box(-1, 1, (layout.size,)), gym.spaces.Discrete(2),
                           config=layout.policy_config())
    with pytest.raises(ValueError, match="wrap the env"):
        policy.compute_actions(np.zeros((1, 4), np.float32), explore=False)
    assert linear_epsilon(50, 1.0, 0.0, 100) == 0.5 and linear_epsilon(500, 1.0, 0.1, 100) == 0.1


def test_train_builders(tmp_path):
    from rl.algos import dqn_builders
    from rl.train import ALGORITHMS, TrainSpec, train
    assert ALGORITHMS["dqn"] is dqn_builders.build_dqn
    spec = TrainSpec(algo="dqn", env="CartPole-v1", out=tmp_path / "dqn", total_steps=600,
                     eval_episodes=2, progress=False,
                     overrides={"learning_starts": 200, "minibatch_size": 16, "hidden": [16]})
    summary = train(spec)
    assert summary["env_steps"] == 600 and (tmp_path / "dqn" / "summary.json").exists()
    trainee = dqn_builders.build_parametric_dqn(
        TrainSpec(algo="parametric_dqn", env="CartPole-v1", out=tmp_path / "p", num_envs=2,
                  overrides={"learning_starts": 50, "minibatch_size": 16}))
    try:
        assert isinstance(trainee.agent, ParametricDQN)
        state = rl.run(trainee.agent, trainee.env, rl.AfterSteps(200),
                       [Evaluate(trainee.eval_env, every_steps=100, episodes=2)], seed=0)
        assert trainee.agent.updates > 0 and len(state.evaluations) >= 2
    finally:
        for close in trainee.closers:
            close()


@pytest.mark.parametrize("field", ["num_envs", "eval_every", "checkpoint_every"])
@pytest.mark.parametrize("value", [0, -3])
def test_a_count_or_period_below_one_is_refused_not_taken_for_the_default(tmp_path, field, value):
    from rl.train import TrainSpec, train
    spec = TrainSpec(algo="dqn", env="CartPole-v1", out=tmp_path / "out", total_steps=50,
                     **{field: value})
    with pytest.raises(ValueError, match=f"{field} must be at least 1"):
        train(spec)
    assert not (tmp_path / "out").exists()
