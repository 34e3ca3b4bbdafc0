"""PPO: GAE by hand, the clipped loss, learnability on CartPole, continuous actions,
and envs stepped in fiberrl processes."""
import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("gymnasium")

import rl  # noqa: E402
from rl.algos.ppo import PPO, gae, ppo_loss  # noqa: E402
from rl.hooks import Evaluate  # noqa: E402


class ConstantValue(torch.nn.Module):
    def __init__(self, value):
        super().__init__()
        self.v = value

    def value(self, obs):
        return torch.full((len(obs),), self.v)


class FakePolicy:
    def __init__(self, value, gamma=0.5, lam=0.5):
        self.model = ConstantValue(value)
        self.config = {"gamma": gamma, "gae_lambda": lam, "reward_scale": 1.0}


def test_gae_bootstraps_truncation_but_not_termination():
    # one member, three steps: a termination after step 0, a truncation after step 2
    batch = {
        "rewards": np.array([[1.0], [2.0], [3.0]]),
        "values": np.array([[1.0], [1.0], [1.0]], np.float32),
        "terminated": np.array([[True], [False], [False]]),
        "truncated": np.array([[False], [False], [True]]),
        "next_obs": np.zeros((3, 1, 4), np.float32),
    }
    out = gae(FakePolicy(value=1.0), batch)
    # deltas: r + gamma * V(next) * not_terminal - V
    d0, d1, d2 = 1.0 + 0.0 - 1.0, 2.0 + 0.5 - 1.0, 3.0 + 0.5 - 1.0
    expected = [d0, d1 + 0.25 * d2, d2]          # the episode boundary cuts the sum after step 0
    assert out["advantages"][:, 0] == pytest.approx(expected)
    assert out["returns"][:, 0] == pytest.approx(np.array(expected) + 1.0)


def test_the_clipped_objective_ignores_ratio_gains_beyond_the_clip():
    env = rl.make_vector_env("CartPole-v1", 2, seed=0)
    policy = PPO(env.observation_space, env.action_space, seed=0, config={"total_steps": 1000})
    obs = torch.as_tensor(env.reset(), dtype=torch.float32)
    actions, extras = policy.action(obs, explore=True)
    batch = {"obs": obs, "actions": actions, "values": extras["values"],
             "returns": extras["values"], "advantages": torch.tensor([1.0, -1.0])}
    # old log-probabilities far below the current ones: ratios ~ e^5 for both rows
    batch["logp"] = extras["logp"] - 5.0
    loss, stats = ppo_loss(policy.model, batch, {**policy.config, "ent_coef": 0.0})
    # normalized advantages are +-0.707; the positive row is clipped at 1.2, the negative not
    ratio = float(np.exp(5.0))
    expected = (-0.7071 * 1.2 + 0.7071 * ratio) / 2
    assert float(stats["policy_loss"]) == pytest.approx(expected, rel=1e-3)
    assert float(stats["clip_fraction"]) == 1.0


def test_ppo_learns_cartpole_to_195():
    torch.set_num_threads(1)
    env = rl.make_vector_env("CartPole-v1", 4, seed=0)
    policy = PPO(env.observation_space, env.action_space, seed=0, config={"total_steps": 40_000})
    evaluate = Evaluate("CartPole-v1", every_steps=4_096, episodes=5)
    state = rl.run(policy, env, rl.AfterSteps(40_000) | rl.RewardReached(195), [evaluate], seed=0)
    assert state.evaluations[-1][1] >= 195, state.evaluations


def test_ppo_continuous_actions_on_pendulum():
    env = rl.make_vector_env("Pendulum-v1", 2, seed=0)
    policy = PPO(env.observation_space, env.action_space, seed=0,
                 config={"total_steps": 512, "rollout_length": 64, "minibatch_size": 64})
    actions, extras = policy.compute_actions(env.reset(), explore=True)
    assert actions.shape == (2, 1) and np.all(np.isfinite(extras["logp"]))
    state = rl.run(policy, env, rl.AfterSteps(512), seed=0)
    assert state.iterations == 4
    assert np.isfinite(state.last_stats["loss"]) and "approx_kl" in state.last_stats
    greedy, _ = policy.compute_actions(env.reset(), explore=False)
    assert np.array_equal(greedy, policy.compute_actions(env.reset(), explore=False)[0])
    env.close()


def test_ppo_with_envs_in_fiberrl_processes_matches_in_process_envs():
    def train(in_processes):
        torch.manual_seed(0)
        env = rl.make_vector_env("CartPole-v1", 2, seed=4, in_processes=in_processes)
        try:
            policy = PPO(env.observation_space, env.action_space, seed=4,
                         config={"total_steps": 256, "rollout_length": 64, "minibatch_size": 64})
            rl.run(policy, env, rl.AfterSteps(256), seed=4)
        finally:
            env.close()
        return torch.nn.utils.parameters_to_vector(policy.model.parameters())

    assert torch.allclose(train(False), train(True))


def test_the_same_seed_gives_the_same_run_and_another_seed_a_different_one():
    def train(seed):
        env = rl.make_vector_env("CartPole-v1", 2, seed=seed)
        policy = PPO(env.observation_space, env.action_space, seed=seed,
                     config={"total_steps": 256, "rollout_length": 64, "minibatch_size": 64})
        state = rl.run(policy, env, rl.AfterSteps(256), seed=seed)
        return torch.nn.utils.parameters_to_vector(policy.model.parameters()), state.episodes

    first, second, other = train(5), train(5), train(6)
    assert torch.equal(first[0], second[0]) and first[1] == second[1]
    assert not torch.equal(first[0], other[0])
