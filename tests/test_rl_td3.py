"""TD3 and DDPG: the clipped double-Q target by hand, delayed actor updates, Polyak
averaging, action scaling, learnability on a tiny env, checkpoints, bad input and
``fiberrl train td3``."""
import io
import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")
gym = pytest.importorskip("gymnasium")

import rl  # noqa: E402
from rl.algos.continuous_replay import ContinuousReplay  # noqa: E402
from rl.algos.td3 import DDPG, TD3, polyak_update  # noqa: E402
from rl.hooks import Evaluate  # noqa: E402

OBS = gym.spaces.Box(-1.0, 1.0, (3,), np.float32)
ACT = gym.spaces.Box(-2.0, 2.0, (1,), np.float32)
TINY = {"hidden": (4,), "batch_size": 8, "learning_starts": 0}


@pytest.fixture(autouse=True)
def one_thread():
    torch.set_num_threads(1)


def random_batch(size=8, obs_size=3, action_low=-2.0, action_high=2.0, seed=0):
    rng = np.random.default_rng(seed)
    return {"obs": rng.normal(size=(size, obs_size)).astype(np.float32),
            "actions": rng.uniform(action_low, action_high, (size, 1)).astype(np.float32),
            "rewards": rng.normal(size=size).astype(np.float32),
            "next_obs": rng.normal(size=(size, obs_size)).astype(np.float32),
            "terminated": np.array([False, True] * (size // 2))}


def params(module):
    return [p.detach().clone() for p in module.parameters()]


def same(a, b):
    return all(torch.equal(x, y) for x, y in zip(a, b))


# -- the TD target -------------------------------------------------------------------
def test_clipped_double_q_target_by_hand():
    policy = TD3(OBS, ACT, seed=0, config={**TINY, "policy_noise": 10.0, "noise_clip": 0.05})
    nets = policy.model
    with torch.no_grad():  # push the target actor near +1 so the smoothed action gets clipped
        nets.actor_target[-1].bias.fill_(2.5)
    batch = random_batch()
    next_obs = torch.as_tensor(batch["next_obs"])
    rewards = torch.as_tensor(batch["rewards"])
    terminated = torch.as_tensor(batch["terminated"])
    discounts = torch.linspace(0.5, 0.9, 8)

    torch.manual_seed(123)
    eps = torch.randn(8, 1)
    with torch.no_grad():
        action = torch.tanh(nets.actor_target(next_obs))
        action = (action + (10.0 * eps).clamp(-0.05, 0.05)).clamp(-1.0, 1.0)
        inputs = torch.cat([next_obs, action], dim=1)
        q1 = nets.critics_target[0](inputs).squeeze(-1)
        q2 = nets.critics_target[1](inputs).squeeze(-1)
    expected = rewards + discounts * (1.0 - terminated.float()) * torch.minimum(q1, q2)
    assert (action == 1.0).any() and (action < 1.0).any()  # both clips were exercised
    assert (q1 < q2).any() and (q2 < q1).any()            # the minimum picks from both

    torch.manual_seed(123)
    target = policy.td_target(next_obs, rewards, terminated, discounts)
    assert torch.allclose(target, expected, atol=1e-6)
    # terminated rows are the bare reward
    assert torch.equal(target[terminated], rewards[terminated])


def test_update_uses_gamma_unless_the_batch_brings_discounts():
    policy = TD3(OBS, ACT, seed=0, config={**TINY, "gamma": 0.7, "policy_noise": 0.0})
    batch = random_batch()
    tensors = policy._batch_tensors(batch)
    assert torch.allclose(tensors["discounts"], torch.full((8,), 0.7))
    tensors = policy._batch_tensors({**batch, "discounts": np.full(8, 0.25)})
    assert torch.allclose(tensors["discounts"], torch.full((8,), 0.25))
    # the critic loss is the summed mean squared error of both critics against that target
    loss, _ = policy.loss(tensors)
    with torch.no_grad():
        target = policy.td_target(tensors["next_obs"], tensors["rewards"], tensors["terminated"],
                                  tensors["discounts"])
        unit = tensors["actions"] / 2.0
        q = policy.model.q(tensors["obs"], unit)
    assert float(loss.detach()) == pytest.approx(float(((q - target) ** 2).mean(1).sum()), rel=1e-5)


def test_ddpg_defaults_differ_from_td3():
    td3, ddpg = TD3(OBS, ACT, seed=0), DDPG(OBS, ACT, seed=0)
    assert (td3.config["twin_q"], td3.config["policy_delay"], td3.config["policy_noise"]) == (True, 2, 0.2)
    assert (ddpg.config["twin_q"], ddpg.config["policy_delay"], ddpg.config["policy_noise"]) == (False, 1, 0.0)
    assert len(td3.model.critics) == 2 and len(ddpg.model.critics) == 1
    # no smoothing: the DDPG target is deterministic and uses its single target critic
    batch = ddpg._batch_tensors(random_batch())
    args = (batch["next_obs"], batch["rewards"], batch["terminated"], batch["discounts"])
    first, second = ddpg.td_target(*args), ddpg.td_target(*args)
    assert torch.equal(first, second)
    with torch.no_grad():
        action = torch.tanh(ddpg.model.actor_target(batch["next_obs"]))
        q = ddpg.model.critics_target[0](torch.cat([batch["next_obs"], action], 1)).squeeze(-1)
    assert torch.allclose(first, batch["rewards"] + 0.99 * (~batch["terminated"]).float() * q)


# -- update schedule and target networks ----------------------------------------------------
def test_actor_and_targets_change_every_policy_delay_updates():
    policy = TD3(OBS, ACT, seed=0, config={**TINY, "policy_delay": 3})
    batch = random_batch()
    for update in range(1, 8):
        actor, target, critic = params(policy.model.actor), params(policy.model.critics_target), params(policy.model.critics)
        stats = policy.update(batch)
        due = update % 3 == 0
        assert same(actor, params(policy.model.actor)) is not due, update
        assert same(target, params(policy.model.critics_target)) is not due, update
        assert ("actor_loss" in stats) is due
        assert not same(critic, params(policy.model.critics))  # critics step every time
    assert policy.updates == 7


def test_polyak_update_math():
    online, target = torch.nn.Linear(2, 2), torch.nn.Linear(2, 2)
    with torch.no_grad():
        for p in online.parameters():
            p.fill_(1.0)
        for p in target.parameters():
            p.fill_(0.0)
    polyak_update(online, target, 0.1)
    polyak_update(online, target, 0.1)
    assert all(torch.allclose(p, torch.full_like(p, 0.19)) for p in target.parameters())

    policy = TD3(OBS, ACT, seed=0, config={**TINY, "policy_delay": 1, "tau": 0.25})
    before = params(policy.model.actor_target) + params(policy.model.critics_target)
    policy.update(random_batch())
    after_online = params(policy.model.actor) + params(policy.model.critics)
    after_target = params(policy.model.actor_target) + params(policy.model.critics_target)
    for old, new, online_p in zip(before, after_target, after_online):
        assert torch.allclose(new, 0.75 * old + 0.25 * online_p, atol=1e-6)


# -- actions -----------------------------------------------------------------------------------
def test_actions_are_scaled_to_an_asymmetric_box_and_stay_inside():
    space = gym.spaces.Box(np.array([-1.0, 0.0], np.float32), np.array([3.0, 10.0], np.float32))
    policy = TD3(OBS, space, seed=0, config={"hidden": (4,), "learning_starts": 100,
                                             "exploration_noise": 5.0})
    obs = np.random.default_rng(0).normal(size=(500, 3)).astype(np.float32)
    random_actions, extras = policy.compute_actions(obs, explore=True)  # before learning_starts
    assert extras == {} and random_actions.shape == (500, 2) and random_actions.dtype == np.float32
    assert np.all(random_actions >= space.low) and np.all(random_actions <= space.high)
    assert np.allclose(random_actions.mean(0), [1.0, 5.0], atol=0.4)  # uniform over the box

    with torch.no_grad():  # the actor's unit output becomes (0, 0.5) whatever the input
        policy.model.actor[-1].weight.zero_()
        policy.model.actor[-1].bias.copy_(torch.tensor([0.0, float(np.arctanh(0.5))]))
    greedy, _ = policy.compute_actions(obs[:3], explore=False)
    assert np.allclose(greedy, [[1.0, 7.5]] * 3, atol=1e-5)
    exported = torch.jit.script(policy.greedy_actor())
    assert np.allclose(exported(torch.as_tensor(obs[:3])).detach().numpy(), greedy, atol=1e-5)

    policy.env_steps = 100  # learning started: actor + noise (huge here), clipped to the box
    noisy, _ = policy.compute_actions(obs, explore=True)
    assert np.all(noisy >= space.low) and np.all(noisy <= space.high)
    assert np.any(noisy == space.low) and np.any(noisy == space.high)
    # env units back to unit coordinates for the critics: the bounds map to -1 and 1
    unit = policy._to_unit(torch.tensor([[-1.0, 0.0], [3.0, 10.0], [1.0, 7.5], [9.0, -4.0]]))
    assert torch.allclose(unit, torch.tensor([[-1.0, -1.0], [1.0, 1.0], [0.0, 0.5], [1.0, -1.0]]))


def test_a_preprocessor_runs_before_actor_and_critics_and_is_not_trained():
    preprocessor = torch.nn.Linear(3, 5)
    frozen = params(preprocessor)
    policy = TD3(OBS, ACT, seed=0, config=TINY, preprocessor=preprocessor)
    assert policy.model.actor[0].in_features == 5 and policy.model.critics[0][0].in_features == 6
    for _ in range(4):
        policy.update(random_batch())
    assert same(frozen, params(preprocessor))
    batch = random_batch()
    q = policy.q_values(batch["obs"], batch["actions"])
    assert q.shape == (8,) and not q.requires_grad
    with torch.no_grad():
        features = preprocessor(torch.as_tensor(batch["obs"]))
        by_hand = policy.model.critics[0](torch.cat([features, torch.as_tensor(batch["actions"]) / 2], 1))
    assert torch.allclose(q, by_hand.squeeze(-1), atol=1e-6)


# -- online learning ---------------------------------------------------------------------------
class MoveToTarget(gym.Env):
    """1-D: move a point toward a target, ``position += 0.25 * action``; the reward is
    minus the distance after the move; 10 steps an episode."""

    observation_space = gym.spaces.Box(-2.0, 2.0, (2,), np.float32)
    action_space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.position, self.target = self.np_random.uniform(-1.0, 1.0, 2)
        self.steps = 0
        return self._obs(), {}

    def step(self, action):
        self.position = float(np.clip(self.position + 0.25 * float(np.asarray(action).reshape(-1)[0]), -2, 2))
        self.steps += 1
        return self._obs(), -abs(self.position - self.target), False, self.steps >= 10, {}

    def _obs(self):
        return np.array([self.position, self.target], np.float32)


@pytest.mark.parametrize("policy_class", [TD3, DDPG])
def test_learns_to_move_to_the_target(policy_class):
    # random actions: about -6.5 per episode; the optimal policy: about -1.3
    env = rl.make_vector_env(MoveToTarget, 1, seed=0)
    try:
        policy = policy_class(env.observation_space, env.action_space, seed=0,
                              config={"hidden": (64, 64), "batch_size": 64, "learning_starts": 500,
                                      "gamma": 0.9})
        evaluate = Evaluate(MoveToTarget, every_steps=500, episodes=10, threshold=-2.0)
        state = rl.run(policy, env, rl.AfterSteps(6_000) | rl.RewardReached(-2.0), [evaluate], seed=0)
    finally:
        env.close()
    assert state.evaluations[0][1] < -3.0
    assert state.evaluations[-1][1] >= -2.0, state.evaluations


def test_learning_starts_and_updates_per_step():
    env = rl.make_vector_env("Pendulum-v1", 2, seed=0)
    try:
        policy = TD3(env.observation_space, env.action_space, seed=0,
                     config={"hidden": (8,), "batch_size": 16, "learning_starts": 20,
                             "updates_per_step": 0.5})
        seen = []

        class Record(rl.Hook):
            def learn_post(self, run, stats):
                seen.append((run.env_steps, policy.updates, dict(stats)))

        rl.run(policy, env, rl.AfterSteps(40), [Record()], seed=0)
    finally:
        env.close()
    assert all(stats == {} and updates == 0 for steps, updates, stats in seen if steps < 20)
    # from 20 env steps on: 2 transitions per vector step, half an update each
    assert [updates for steps, updates, _ in seen if steps >= 20] == list(range(1, 12))
    assert len(policy.replay) == 40 and "critic_loss" in seen[-1][2]


def test_replay_ring_keeps_the_newest_rows():
    replay = ContinuousReplay(5, (2,), 1)

    def rows(start, count):
        ids = np.arange(start, start + count, dtype=np.float32)
        return (np.stack([ids, ids], 1), ids[:, None], ids, np.stack([ids, ids], 1) + 0.5, ids % 2 == 0)

    replay.add(*rows(0, 3))
    replay.add(*rows(3, 4))  # wraps around: rows 2..6 remain
    assert len(replay) == 5 and sorted(replay.rewards) == [2, 3, 4, 5, 6]
    replay.add(*rows(10, 7))  # more than the capacity at once: the newest five
    assert sorted(replay.rewards) == [12, 13, 14, 15, 16]
    sample = replay.sample(64, np.random.default_rng(0))
    assert sample["obs"].shape == (64, 2) and sample["actions"].shape == (64, 1)
    assert np.array_equal(sample["obs"][:, 0], sample["rewards"])            # rows stay aligned
    assert np.array_equal(sample["next_obs"][:, 0], sample["rewards"] + 0.5)
    assert np.array_equal(sample["terminated"], sample["rewards"] % 2 == 0)


# -- checkpoints and errors -----------------------------------------------------------------
def test_state_dict_round_trip_continues_identically():
    policy = TD3(OBS, ACT, seed=0, config=TINY)
    for seed in range(3):
        policy.update(random_batch(seed=seed))
    policy.env_steps = 42
    buffer = io.BytesIO()
    torch.save(policy.state_dict(), buffer)
    buffer.seek(0)
    state = torch.load(buffer, weights_only=False)

    restored = TD3(OBS, ACT, seed=7, config=TINY)
    restored.load_state_dict(state)
    assert (restored.env_steps, restored.updates) == (42, 3)
    obs = random_batch()["obs"]
    assert np.array_equal(restored.compute_actions(obs, explore=False)[0],
                          policy.compute_actions(obs, explore=False)[0])
    # same RNG state, same optimizer moments: the next updates agree exactly
    batch = random_batch(seed=9)
    for _ in range(2):
        restored.update(batch)
    torch.set_rng_state(state["torch_rng"])
    for _ in range(2):
        policy.update(batch)
    assert same(params(policy.model), params(restored.model))


def test_bad_input_gives_clear_errors():
    with pytest.raises(TypeError, match="Discrete"):
        TD3(OBS, gym.spaces.Discrete(3))
    with pytest.raises(TypeError, match="DDPG needs a continuous action space"):
        DDPG(OBS, gym.spaces.Discrete(3))
    with pytest.raises(ValueError, match="finite"):
        TD3(OBS, gym.spaces.Box(-np.inf, np.inf, (1,)))
    with pytest.raises(TypeError, match="valid keys"):
        TD3(OBS, ACT, config={"polyak": 0.1})
    with pytest.raises(ValueError, match="tau"):
        TD3(OBS, ACT, config={"tau": 0.0})
    with pytest.raises(ValueError, match="policy_delay"):
        TD3(OBS, ACT, config={"policy_delay": 0})
    with pytest.raises(ValueError, match="lr_schedule"):
        TD3(OBS, ACT, config={"lr_schedule": "linear", "total_steps": 10})
    with pytest.raises(KeyError, match="terminated"):
        TD3(OBS, ACT, config=TINY).update({k: v for k, v in random_batch().items() if k != "terminated"})


# -- fiberrl train -------------------------------------------------------------------------------
@pytest.mark.parametrize("algo", ["td3", "ddpg"])
def test_fiberrl_train_builds_and_resumes(algo, tmp_path):
    from rl.algos import td3_builders  # registers td3 and ddpg (until rl.builders imports it)
    from rl.train import ALGORITHMS, TrainSpec, train
    assert ALGORITHMS[algo] is getattr(td3_builders, f"build_{algo}")
    settings = {"hidden": [16], "batch_size": 16, "learning_starts": 50}
    spec = TrainSpec(algo=algo, env="Pendulum-v1", out=tmp_path, total_steps=200, eval_every=100,
                     eval_episodes=2, progress=False, overrides=settings)
    summary = train(spec)
    assert summary["env_steps"] == 200 and summary["settings"]["twin_q"] is (algo == "td3")
    resumed = train(TrainSpec(**{**spec.__dict__, "total_steps": 300, "resume": True}))
    steps = [point[0] for point in resumed["curve"]]
    assert resumed["env_steps"] == 300 and steps[:3] == [0, 100, 200] and steps[-1] == 300
    assert json.loads((tmp_path / "summary.json").read_text())["env_steps"] == 300
