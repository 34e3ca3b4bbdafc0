"""The run loop, its stages and hooks, stop conditions and the policy builder."""
import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")
gym = pytest.importorskip("gymnasium")

import rl  # noqa: E402
from rl.hooks import Evaluate  # noqa: E402
from rl.loop import Hook, RunState  # noqa: E402
from rl.outputs import Checkpoint, Summary  # noqa: E402
from rl.policy import Policy  # noqa: E402


class TwoArmedBandit(gym.Env):
    """One-step episodes; action 1 pays 1, action 0 pays 0. Observation is constant."""

    observation_space = gym.spaces.Box(-1, 1, (2,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return np.ones(2, np.float32), {}

    def step(self, action):
        return np.ones(2, np.float32), float(action == 1), True, False, {}


def linear_model(obs_space, action_space, config):
    return torch.nn.Linear(obs_space.shape[0], action_space.n)


def reinforce_loss(model, batch, config):
    logp = torch.distributions.Categorical(logits=model(batch["obs"])).log_prob(batch["actions"])
    return -(logp * (batch["rewards"] - 0.5)).mean()


Bandit = rl.build_policy("Bandit", linear_model, reinforce_loss,
                         defaults={"lr": 0.1, "train_batch_size": 16})


class Recorder(Hook):
    def __init__(self):
        self.calls = []

    def experiment_pre(self, run):
        self.calls.append(("experiment_pre",))

    def experiment_post(self, run):
        self.calls.append(("experiment_post",))

    def episode_pre(self, run, member):
        self.calls.append(("episode_pre", member))

    def episode_post(self, run, episode):
        self.calls.append(("episode_post", episode.member, episode.ret, episode.length))

    def act_pre(self, run, obs):
        self.calls.append(("act_pre", obs.shape))

    def act_post(self, run, step):
        self.calls.append(("act_post", sorted(step)))

    def learn_post(self, run, stats):
        self.calls.append(("learn_post", run.env_steps))


def test_stages_run_in_order_and_counters_add_up():
    env = rl.make_vector_env(TwoArmedBandit, 2, seed=0)
    policy = Bandit(env.observation_space, env.action_space, seed=0)
    recorder = Recorder()
    state = rl.run(policy, env, rl.AfterSteps(32), [recorder], seed=0)
    calls = recorder.calls
    assert calls[0] == ("experiment_pre",) and calls[-1] == ("experiment_post",)
    assert calls[1:3] == [("episode_pre", 0), ("episode_pre", 1)]
    assert calls[3] == ("act_pre", (2, 2))
    assert calls[4][0] == "act_post" and {"obs", "actions", "rewards", "terminated", "truncated",
                                         "next_obs"} <= set(calls[4][1])
    assert state.env_steps == 32 and state.episodes == 32
    assert [c for c in calls if c[0] == "learn_post"] == [("learn_post", 16), ("learn_post", 32)]
    assert state.iterations == 2
    assert sum(1 for c in calls if c[0] == "episode_post") == 32
    # every episode of a member ends (one-step episodes) and its next one starts
    assert calls[5][:2] == ("episode_post", 0) and calls[5][3] == 1
    assert calls[6] == ("episode_pre", 0)
    assert calls[7][:2] == ("episode_post", 1) and calls[8] == ("episode_pre", 1)


def test_built_policy_learns_the_better_arm():
    env = rl.make_vector_env(TwoArmedBandit, 4, seed=1)
    policy = Bandit(env.observation_space, env.action_space, seed=1)
    evaluate = Evaluate(TwoArmedBandit, every_steps=64, threshold=1.0)
    state = rl.run(policy, env, rl.AfterSteps(1_000), [evaluate], seed=1)
    assert state.evaluations[-1][1] == 1.0
    assert evaluate.solved_at_steps is not None
    probs = torch.softmax(policy.model(torch.ones(1, 2)), -1)[0, 1]
    assert probs > 0.95


def test_build_policy_calls_the_functions_in_the_documented_order():
    order = []

    def model_fn(obs_space, action_space, config):
        order.append("model")
        return torch.nn.Linear(2, 2)

    def optimizer_fn(model, config):
        order.append("optimizer")
        return torch.optim.SGD(model.parameters(), lr=config["lr"])

    def action_fn(model, obs, explore, config):
        order.append("action")
        return torch.zeros(len(obs), dtype=torch.int64), {"marker": torch.ones(len(obs))}

    def postprocess_fn(policy, batch):
        order.append("postprocess")
        assert batch["marker"].tolist() == [1.0]
        return {**batch, "doubled": batch["rewards"] * 2}

    def loss_fn(model, batch, config):
        order.append("loss")
        assert "doubled" in batch
        return model(batch["obs"]).sum() * 0.0, {"custom": torch.tensor(3.0)}

    def stats_fn(policy, batch, stats):
        order.append("stats")
        return {"batch_rows": float(len(batch["obs"]))}

    Built = rl.build_policy("Built", model_fn, loss_fn, postprocess_fn=postprocess_fn,
                            optimizer_fn=optimizer_fn, action_fn=action_fn, stats_fn=stats_fn,
                            defaults={"train_batch_size": 2, "num_epochs": 2, "minibatch_size": 1})
    assert issubclass(Built, Policy) and Built.__name__ == "Built"
    env = rl.make_vector_env(TwoArmedBandit, 1)
    policy = Built(env.observation_space, env.action_space)
    state = rl.run(policy, env, rl.AfterSteps(2), seed=0)
    assert order == ["model", "optimizer", "action", "postprocess", "action", "postprocess",
                     "loss", "loss", "loss", "loss", "stats"]
    assert state.last_stats["custom"] == 3.0 and state.last_stats["batch_rows"] == 2.0
    assert isinstance(policy.optimizer, torch.optim.SGD)


def test_policy_config_errors_name_the_valid_keys():
    space = TwoArmedBandit.observation_space
    with pytest.raises(TypeError, match="unknown config keys for Bandit: \\['lrr'\\].*'lr'"):
        Bandit(space, TwoArmedBandit.action_space, config={"lrr": 1})
    with pytest.raises(ValueError, match="batch_mode"):
        Bandit(space, TwoArmedBandit.action_space, config={"batch_mode": "steps"})
    with pytest.raises(ValueError, match="total_steps"):
        Bandit(space, TwoArmedBandit.action_space, config={"lr_schedule": "linear"})
    with pytest.raises(TypeError, match="callable"):
        rl.build_policy("X", linear_model, None)
    with pytest.raises(TypeError, match="stop condition"):
        rl.run(Bandit(space, TwoArmedBandit.action_space), TwoArmedBandit, 100)


def _state(**kwargs):
    state = RunState(policy=None, env=None)
    for key, value in kwargs.items():
        setattr(state, key, value)
    return state


def test_stop_conditions_and_their_combinations():
    steps, episodes, reward = rl.AfterSteps(100), rl.AfterEpisodes(5), rl.RewardReached(10)
    assert not steps(_state(env_steps=99)) and steps(_state(env_steps=100))
    assert episodes(_state(episodes=5))
    assert not reward(_state()) and reward(_state(evaluations=[(0, 12.0, 0.0)]))
    assert not reward(_state(evaluations=[(0, 12.0, 0.0), (10, 9.0, 0.0)]))  # the latest counts
    either, both = steps | episodes, steps & episodes
    assert either(_state(env_steps=100)) and not both(_state(env_steps=100))
    assert both(_state(env_steps=100, episodes=5))
    assert "AfterSteps(100) | AfterEpisodes(5)" == repr(either)
    assert rl.AfterIterations(2)(_state(iterations=2))
    with pytest.raises(ValueError):
        rl.AfterSteps(-1)


class StopAfterThreeEpisodes(Hook):
    def episode_post(self, run, episode):
        if run.episodes >= 3:
            run.request_stop()


def test_a_hook_can_stop_the_run():
    env = rl.make_vector_env(TwoArmedBandit, 1)
    state = rl.run(Bandit(env.observation_space, env.action_space), env, rl.AfterSteps(10_000),
                   [StopAfterThreeEpisodes()])
    assert state.episodes == 3


def test_evaluate_runs_at_start_every_n_steps_and_at_the_end():
    env = rl.make_vector_env(TwoArmedBandit, 2)
    policy = Bandit(env.observation_space, env.action_space, seed=0)
    evaluate = Evaluate(TwoArmedBandit, every_steps=10, episodes=3)
    state = rl.run(policy, env, rl.AfterSteps(25), [evaluate])
    assert [e[0] for e in state.evaluations] == [0, 10, 20, 26]
    assert all(e[1] in (0.0, 1 / 3, 2 / 3, 1.0) for e in state.evaluations)


def test_checkpoint_resume_continues_counters_policy_and_curve(tmp_path):
    def one_run(steps, resume):
        env = rl.make_vector_env(TwoArmedBandit, 2, seed=0)
        policy = Bandit(env.observation_space, env.action_space, seed=0)
        evaluate = Evaluate(TwoArmedBandit, every_steps=16, episodes=2)
        checkpoint = Checkpoint(tmp_path / "ckpt", every_steps=16, resume=resume)
        summary = Summary(tmp_path, evaluate, {"algo": "bandit"})
        state = rl.run(policy, env, rl.AfterSteps(steps), [checkpoint, evaluate, summary])
        return state, policy, checkpoint

    first, first_policy, _ = one_run(32, resume=False)
    saved = {k: v.clone() for k, v in first_policy.model.state_dict().items()}
    second, second_policy, checkpoint = one_run(32, resume=True)
    assert checkpoint.resumed_from.name == "step-32.pt"
    assert second.env_steps == 32 and second.iterations == first.iterations  # nothing left to do
    for key, value in second_policy.model.state_dict().items():
        assert torch.equal(value, saved[key])
    third, _, _ = one_run(64, resume=True)
    assert third.env_steps == 64 and third.episodes == 64
    steps = [e[0] for e in third.evaluations]
    assert steps[:3] == [0, 16, 32] and steps[-1] == 64
    assert len(list((tmp_path / "ckpt").glob("step-*.pt"))) == 2  # keeps the newest two
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["env_steps"] == 64 and summary["finished"] is True
    assert summary["curve"] == [[s, m] for s, m, _ in third.evaluations]
    assert (tmp_path / "curve.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_summary_plots_only_at_the_end_of_a_short_run(tmp_path, monkeypatch):
    """summary.json follows every evaluation; the slow curve.png waits plot_every_s from
    the start (or the end), so training does not stall to plot the first point."""
    import rl.outputs
    plotted = []
    real_plot = rl.outputs.plot_curve
    monkeypatch.setattr(rl.outputs, "plot_curve",
                        lambda evaluations, *a, **k: (plotted.append(len(evaluations)),
                                                      real_plot(evaluations, *a, **k)))

    class Watch(Hook):
        def learn_post(self, run, stats):
            if (tmp_path / "summary.json").exists():
                seen.append(json.loads((tmp_path / "summary.json").read_text())["finished"])

    seen = []
    env = rl.make_vector_env(TwoArmedBandit, 2, seed=0)
    policy = Bandit(env.observation_space, env.action_space, seed=0)
    evaluate = Evaluate(TwoArmedBandit, every_steps=16, episodes=2)
    summary = Summary(tmp_path, evaluate, {"algo": "bandit"}, plot_every_s=600)
    state = rl.run(policy, env, rl.AfterSteps(48), [evaluate, summary, Watch()])
    assert seen and seen[0] is False   # written during the run
    assert plotted == [len(state.evaluations)]   # one plot, at the end, of every point
    assert (tmp_path / "curve.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_vanilla_policy_gradient_example_learns_cartpole():
    import importlib.util
    from pathlib import Path
    path = Path(__file__).resolve().parent.parent / "examples" / "vanilla_pg.py"
    assert len(path.read_text().splitlines()) < 40
    spec = importlib.util.spec_from_file_location("vanilla_pg", path)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    torch.set_num_threads(1)
    env = rl.make_vector_env("CartPole-v1", 4, seed=1)
    policy = example.VanillaPG(env.observation_space, env.action_space, seed=1)
    evaluate = Evaluate("CartPole-v1", every_steps=5_000)
    state = rl.run(policy, env, rl.AfterSteps(100_000) | rl.RewardReached(195), [evaluate], seed=1)
    assert state.evaluations[-1][1] >= 195, state.evaluations


class ThreadsSeen(Hook):
    """torch's intra-op thread count at every act stage."""

    def __init__(self):
        self.seen = set()

    def act_pre(self, run, obs):
        self.seen.add(torch.get_num_threads())


def test_torch_threads_leave_env_processes_on_this_machine_their_cores():
    from rl.cores import usable_cores
    cores = usable_cores()
    before = torch.get_num_threads()
    torch.set_num_threads(cores)   # torch's default: one thread per core
    try:
        with rl.make_vector_env("CartPole-v1", 2, seed=0, in_processes=True) as env:
            assert env.processes_here() == 2
            policy = Bandit(env.observation_space, env.action_space, seed=0)
            threads = ThreadsSeen()
            rl.run(policy, env, rl.AfterSteps(20), [threads], seed=0)
        assert threads.seen == {max(1, cores - 2)}
        assert torch.get_num_threads() == cores   # given back after the run
        # members stepped in this process share nothing: the count stays
        env = rl.make_vector_env("CartPole-v1", 2, seed=0)
        assert env.processes_here() == 0
        threads = ThreadsSeen()
        rl.run(Bandit(env.observation_space, env.action_space, seed=0), env,
               rl.AfterSteps(20), [threads], seed=0)
        assert threads.seen == {cores}
    finally:
        torch.set_num_threads(before)


def test_env_processes_of_a_backend_that_computes_elsewhere_leave_torch_its_threads(monkeypatch):
    """Whether env processes share this machine's cores is the backend's to say
    (``uses_local_cores``), not a list of backend names: a remote dockerd's containers,
    like Slurm's jobs, compute elsewhere."""
    from fiberrl.backends.local import LocalBackend
    monkeypatch.setattr(LocalBackend, "uses_local_cores", False)   # as if elsewhere
    with rl.make_vector_env("CartPole-v1", 2, seed=0, in_processes=True) as env:
        assert env.processes_here() == 0
