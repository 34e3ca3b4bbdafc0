"""Population-based training (issue 31): search spaces and explore, exploit (the whole
state moves), asynchrony, members that die, a controller that dies, the command line,
and short populations on the local backend and on the real Slurm cluster."""
import json
import os
import subprocess
import sys
import threading
import time
from multiprocessing import Pipe
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("gymnasium")

import rl  # noqa: E402
from rl.cli import run as cli  # noqa: E402
from rl.pbt import PopulationSpec, train_population  # noqa: E402
from rl.pbt import space as spaces  # noqa: E402
from rl.pbt.records import DROPPED, FINISHED, MemberRecord, truncation_selection  # noqa: E402
from rl.registry import TrainSpec  # noqa: E402

pytestmark = pytest.mark.timeout(240)
HERE = Path(__file__).resolve().parent
# small CartPole members: PPO batches of 64 x 4 envs = 256 env steps
CARTPOLE = {"rollout_length": 64, "minibatch_size": 64}


def _population(tmp_path, builder=None, population=4, total=2048, interval=1024, **more):
    train = TrainSpec("ppo", "CartPole-v1", tmp_path / "run", seed=0, total_steps=total,
                      eval_episodes=2, progress=False, overrides=dict(CARTPOLE))
    return PopulationSpec(train, population=population, interval=interval, builder=builder,
                          member_resources={"mem": "600M"}, **more)


# -- search spaces and explore -----------------------------------------------------------
def test_specs_parse_into_their_distributions():
    space = spaces.parse_search(["lr=loguniform:1e-5:3e-3", "clip=uniform:0.1:0.3",
                                 "num_epochs=int:3:12", "gamma=choice:0.9,0.99",
                                 "batch_mode=choice:episodes,fragments"])
    assert space == {"lr": spaces.LogUniform(1e-5, 3e-3), "clip": spaces.Uniform(0.1, 0.3),
                     "num_epochs": spaces.IntRange(3, 12), "gamma": spaces.Choice((0.9, 0.99)),
                     "batch_mode": spaces.Choice(("episodes", "fragments"))}
    assert {k: spaces.parse_param(p.spec()) for k, p in space.items()} == space


@pytest.mark.parametrize("item, message", [
    ("lr", "takes KEY=SPEC"),
    ("lr=loguniform:1e-5", "loguniform takes LOW:HIGH"),
    ("lr=loguniform:0:1", "0 < LOW < HIGH"),
    ("lr=uniform:3:1", "LOW < HIGH"),
    ("lr=uniform:a:1", "LOW must be a number"),
    ("num_epochs=int:1.5:3", "LOW must be an integer"),
    ("gamma=choice:0.9", "at least two values"),
    ("lr=normal:0:1", "unknown distribution 'normal'"),
])
def test_bad_specs_say_what_is_wrong(item, message):
    with pytest.raises(ValueError, match=message):
        spaces.parse_search([item])


def test_explore_stays_inside_the_space():
    space = {**spaces.default_space("ppo", discrete=False), "minibatch_size": spaces.IntRange(1, 3),
             "max_grad_norm": spaces.Uniform(0.1, 0.2)}
    rng = np.random.default_rng(0)
    moved = {key: 0 for key in space}
    for probability in (0.0, 0.25, 1.0):
        values = spaces.sample(space, rng)
        for _ in range(400):
            # start from the space's ends too, where x1.2 / x0.8 would leave it
            if rng.random() < 0.3:
                values = {k: (p.bounds()[-1] if rng.random() < 0.5 else p.bounds()[0])
                          for k, p in space.items()}
            new = spaces.explore(values, space, rng, probability)
            for key, param in space.items():
                assert param.contains(new[key]), (key, values[key], new[key])
                moved[key] += new[key] != values[key]
            values = new
    assert all(count > 100 for count in moved.values()), moved
    # perturbing without resampling moves a number by x0.8 or x1.2 (clipped), an int by >= 1
    lr = spaces.LogUniform(1e-4, 1e-2)
    assert {round(lr.perturb(1e-3, rng), 9) for _ in range(50)} == {8e-4, 1.2e-3}
    assert {spaces.IntRange(1, 9).perturb(2, rng) for _ in range(50)} == {1, 3}
    assert {spaces.Choice((1, 2, 3)).perturb(1, rng) for _ in range(50)} == {1, 2}


def test_spaces_an_algorithm_cannot_run_are_refused():
    from rl.preflight import algorithm_defaults
    defaults = algorithm_defaults("ppo")
    with pytest.raises(ValueError, match="cannot change 'hidden' while it trains"):
        spaces.check_space("ppo", {"hidden": spaces.Choice((32, 64))}, defaults)
    with pytest.raises(ValueError, match="num_epochs is an integer"):
        spaces.check_space("ppo", {"num_epochs": spaces.Uniform(1, 5)}, defaults)
    with pytest.raises(ValueError, match=r"gamma must be in \[0, 1\], got 1.5"):
        spaces.check_space("ppo", {"gamma": spaces.Uniform(0.5, 1.5)}, defaults)
    with pytest.raises(ValueError, match="es cannot train as a population"):
        spaces.check_space("es", {}, {})
    for algo in spaces.SEARCHABLE:  # every default space passes its own check
        spaces.check_space(algo, spaces.default_space(algo, discrete=algo != "td3"),
                           algorithm_defaults(algo))


# -- exploit ----------------------------------------------------------------------------------
def _member(index, score, status=FINISHED):
    record = MemberRecord(index, index, {}, {}, status=status)
    if score is not None:
        record.evaluations.append([100, score, 0.0, 1.0])
    return record


def test_truncation_selection_copies_the_top_quantile_into_the_bottom():
    members = [_member(i, s) for i, s in enumerate([10, 50, 20, 90, 70, 30, 60, 80])]
    rng = np.random.default_rng(0)
    donors = {truncation_selection(0, members, 0.25, rng) for _ in range(50)}
    assert donors == {3, 7}  # bottom two: members 0 and 2; top two: 3 and 7
    assert truncation_selection(2, members, 0.25, rng) in (3, 7)
    for middle in (1, 4, 5, 6, 3, 7):
        assert truncation_selection(middle, members, 0.25, rng) is None
    # members without an evaluation or dropped take no part; ties exploit nobody
    members = [_member(0, 5), _member(1, None), _member(2, 9, DROPPED), _member(3, 7)]
    assert truncation_selection(0, members, 0.5, rng) == 3
    tied = [_member(i, 500) for i in range(4)]
    assert all(truncation_selection(i, tied, 0.5, rng) is None for i in range(4))


def _ppo(seed, env_id="Pendulum-v1"):
    env = rl.make_vector_env(env_id, 2, seed=seed)
    from rl.algos.ppo import CONTINUOUS_DEFAULTS, PPO
    policy = PPO(env.observation_space, env.action_space, seed=seed,
                 config={**CONTINUOUS_DEFAULTS, "rollout_length": 64, "minibatch_size": 64})
    return policy, env


def _states_equal(a, b):
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_states_equal(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_states_equal(x, y) for x, y in zip(a, b))
    if isinstance(a, torch.Tensor):
        return torch.equal(a, b)
    return a == b


def test_exploit_copies_the_whole_state_through_a_member(tmp_path):
    """A member adopts a donor's state from a Directive: its next action on the same
    observation is the donor's, and so are its weights and optimizer moments."""
    from rl.loop import RunState
    from rl.pbt.member import Directive, MemberHook, MemberStart, Report
    donor, donor_env = _ppo(1)
    rl.run(donor, donor_env, rl.AfterSteps(256))
    receiver, receiver_env = _ppo(2)
    obs = donor_env.reset(seed=5)
    assert not np.allclose(donor.compute_actions(obs, False)[0],
                           receiver.compute_actions(obs, False)[0])
    member_end, controller_end = Pipe()
    start = MemberStart(0, None, TrainSpec("ppo", "Pendulum-v1", tmp_path, total_steps=10_000),
                        {"lr": 0.002}, report_every=128, eval_episodes=1)
    hook = MemberHook(member_end, start, "Pendulum-v1")
    state = RunState(policy=receiver, env=receiver_env, env_steps=128)
    hook.experiment_pre(RunState(policy=receiver, env=receiver_env))

    def controller():
        report = controller_end.recv()
        assert isinstance(report, Report) and report.env_steps == 128
        controller_end.send(Directive(adopt=donor.state_dict(), hyperparameters={"lr": 0.0005,
                                                                                 "clip": 0.15},
                                      seed=77))
    thread = threading.Thread(target=controller)
    thread.start()
    hook.report(state, final=False)
    thread.join(10)
    np.testing.assert_array_equal(receiver.compute_actions(obs, False)[0],
                                  donor.compute_actions(obs, False)[0])
    assert _states_equal(receiver.model.state_dict(), donor.model.state_dict())
    assert _states_equal(receiver.optimizer.state_dict()["state"],
                         donor.optimizer.state_dict()["state"])
    assert receiver.samples_learned == donor.samples_learned == 256
    assert receiver.config["clip"] == 0.15 and receiver.config["lr"] == 0.0005
    assert receiver.optimizer.param_groups[0]["lr"] == 0.0005  # explore reached the optimizer
    # its own random stream: the next exploring actions differ from the donor's
    torch.manual_seed(0)
    assert not np.allclose(receiver.compute_actions(obs, True)[0],
                           donor.compute_actions(obs, True)[0])
    donor_env.close()
    receiver_env.close()


class _Scaler(torch.nn.Module):
    """A fixed input normalization with its statistics in buffers."""

    def __init__(self, size, shift):
        super().__init__()
        self.register_buffer("mean", torch.full((size,), float(shift)))

    def forward(self, x):
        return x - self.mean


@pytest.mark.parametrize("algo", ["dqn", "td3"])
def test_exploit_copies_normalization_state_and_keeps_the_receivers_replay(algo):
    from rl.algos.dqn import DQN
    from rl.algos.td3 import TD3
    env_id = "CartPole-v1" if algo == "dqn" else "Pendulum-v1"
    cls, config = ((DQN, {"learning_starts": 64, "minibatch_size": 32}) if algo == "dqn"
                   else (TD3, {"learning_starts": 64, "batch_size": 32}))
    agents = []
    for seed, shift in ((1, 0.5), (2, -3.0)):
        env = rl.make_vector_env(env_id, 1, seed=seed)
        agent = cls(env.observation_space, env.action_space, seed=seed, config=config,
                    preprocessor=_Scaler(env.observation_space.shape[0], shift))
        rl.run(agent, env, rl.AfterSteps(200))
        agents.append((agent, env))
    (donor, env), (receiver, _) = agents
    replay, stored = receiver.replay, len(receiver.replay)
    obs = env.reset(seed=3)
    receiver.adopt(donor.state_dict(), seed=9)
    np.testing.assert_array_equal(receiver.compute_actions(obs, False)[0],
                                  donor.compute_actions(obs, False)[0])
    assert torch.equal(receiver.model.preprocessor.mean, donor.model.preprocessor.mean)
    assert receiver.replay is replay and len(replay) == stored > 150
    receiver.set_hyperparameters({"lr": 0.0042})
    groups = ([receiver.optimizer] if algo == "dqn"
              else [receiver.actor_optimizer, receiver.critic_optimizer])
    assert all(g.param_groups[0]["lr"] == 0.0042 for g in groups)
    for _, e in agents:
        e.close()


# -- whole populations (local backend) ----------------------------------------------------
def _summary(tmp_path):
    return json.loads((tmp_path / "run" / "summary.json").read_text())


def test_cli_population_on_cartpole_writes_every_output(tmp_path, capsys):
    out = tmp_path / "run"
    assert cli(["train", "ppo", "--env", "CartPole-v1", "--population", "4", "--total-steps",
                "2048", "--pbt-interval", "512", "--eval-episodes", "2", "--out", str(out),
                "--no-progress", "--set", "rollout_length=64", "--set", "minibatch_size=64",
                "--search", "lr=loguniform:1e-4:3e-3", "--search", "num_epochs=int:2:6",
                "--pbt-quantile", "0.5"]) == 0
    line = capsys.readouterr().out
    assert "PBT of 4 members x 2048 env steps: best member" in line
    summary = _summary(tmp_path)
    population = summary["population"]
    assert [m["member"] for m in population] == [0, 1, 2, 3]
    assert all(m["status"] == "finished" and m["env_steps"] == 2048 for m in population)
    best = population[summary["best_member"]]
    assert summary["eval_mean"] == best["final_eval"] == max(m["final_eval"] for m in population)
    assert summary["search"] == {"lr": "loguniform:0.0001:0.003", "num_epochs": "int:2:6"}
    assert summary["exploits"] == sum(len(m["lineage"]) for m in population) >= 1
    for member in population:
        assert [point[0] for point in member["curve"]] == [512, 1024, 1536, 2048]
        for copy in member["lineage"]:
            assert set(copy) == {"env_steps", "donor", "donor_env_steps", "score", "donor_score",
                                 "hyperparameters"}
            assert copy["donor_score"] > copy["score"]
            assert 1e-4 <= copy["hyperparameters"]["lr"] <= 3e-3
        if member["lineage"]:
            assert member["hyperparameters"] == member["lineage"][-1]["hyperparameters"]
        assert list((out / "members" / f"m{member['member']:02d}" / "tb").glob("events.*"))
    assert (out / "population.png").read_bytes()[:4] == b"\x89PNG"
    # the exported best member acts as its checkpoint does
    from rl.serving import load
    predictor = load(out / "policy.pt")
    policy, env = _cartpole_member(out, summary["best_member"], best["hyperparameters"])
    obs = env.reset(seed=4)
    rows = [{str(i): float(v) for i, v in enumerate(o)} for o in obs]
    assert [int(p.action) for p in predictor.predict(rows)] == \
        policy.compute_actions(obs, False)[0].tolist()
    env.close()
    # a run in --out needs --resume; a finished population resumed is left as it is
    assert cli(["train", "ppo", "--env", "CartPole-v1", "--population", "4", "--out", str(out),
                "--no-progress"]) == 2
    assert "already holds an earlier run (members, population.json" in capsys.readouterr().err


def _cartpole_member(out, index, hyperparameters):
    from rl.algos.ppo import PPO
    newest = sorted((out / "members" / f"m{index:02d}" / "checkpoints").glob("step-*.pt"),
                    key=lambda p: int(p.stem[5:]))[-1]
    env = rl.make_vector_env("CartPole-v1", 2, seed=0)
    policy = PPO(env.observation_space, env.action_space,
                 config={**CARTPOLE, "total_steps": 2048, **hyperparameters})
    policy.load_state_dict(torch.load(newest, weights_only=False)["policy"])
    return policy, env


@pytest.mark.slow  # a population each of DQN and TD3 (TD3 updates every step)
@pytest.mark.parametrize("algo, env_id, settings", [
    ("dqn", "CartPole-v1", {"learning_starts": 100, "minibatch_size": 32, "hidden": [32]}),
    ("td3", "Pendulum-v1", {"learning_starts": 100, "batch_size": 32, "hidden": [32, 32]}),
])
def test_dqn_and_td3_populations_run_through_the_same_code(tmp_path, algo, env_id, settings):
    train = TrainSpec(algo, env_id, tmp_path / "run", seed=0, total_steps=600, eval_episodes=1,
                      progress=False, overrides=settings)
    summary = train_population(PopulationSpec(train, population=3, interval=200, quantile=0.5,
                                              member_resources={"mem": "600M"}))
    assert [m["status"] for m in summary["population"]] == ["finished"] * 3
    assert [p[0] for p in summary["population"][0]["curve"]] == [200, 400, 600]
    assert set(summary["search"]) == set(spaces.default_space(algo, algo == "dqn"))
    assert summary["exploits"] == sum(len(m["lineage"]) for m in summary["population"])
    assert (tmp_path / "run" / "policy.pt").exists()


@pytest.mark.slow  # two populations
def test_random_search_trains_the_same_members_without_exploits(tmp_path):
    summary = train_population(_population(tmp_path, population=3, total=1024, interval=0))
    assert summary["mode"] == "random_search" and summary["exploits"] == 0
    pbt = train_population(_population(tmp_path / "pbt", population=3, total=512, interval=256))
    for member, same in zip(summary["population"], pbt["population"]):
        assert member["lineage"] == []
        assert member["hyperparameters"] == member["initial_hyperparameters"]
        assert member["initial_hyperparameters"] == same["initial_hyperparameters"]
        # reports every total/10 env steps, after the learning step that crosses it
        assert [p[0] for p in member["curve"]] == [256, 512, 768, 1024]


def test_a_stalled_member_does_not_hold_up_the_others(tmp_path):
    """No barrier: while member 0 is stuck in its first interval, the other three run
    all of theirs (exploiting among themselves) to the end; released, member 0 ends too."""
    import pbt_helpers
    result = {}
    spec = _population(tmp_path, pbt_helpers.stalled_member_zero, total=1536, interval=512,
                       quantile=0.5)
    thread = threading.Thread(target=lambda: result.update(train_population(spec)))
    thread.start()
    state_path, deadline = tmp_path / "run" / "population.json", time.monotonic() + 180
    try:
        while time.monotonic() < deadline:
            try:
                state = json.loads(state_path.read_text())
            except (OSError, ValueError):
                state = None
            if state and all(m["status"] == FINISHED for m in state["members"][1:]):
                break
            time.sleep(0.2)
        assert state and [m["status"] for m in state["members"]] == ["running"] + ["finished"] * 3
        assert state["members"][0]["evaluations"] == []  # still in its first interval
        assert all([e[0] for e in m["evaluations"]] == [512, 1024, 1536]
                   for m in state["members"][1:])
    finally:
        (tmp_path / "run" / "release").write_text("go")
        thread.join(120)
    assert [m["status"] for m in result["population"]] == ["finished"] * 4


def test_a_sigkilled_member_resumes_from_its_checkpoint(tmp_path):
    import pbt_helpers
    summary = train_population(_population(tmp_path, pbt_helpers.kill_member_one_once,
                                           total=3072, interval=1024))
    assert (tmp_path / "run" / "members" / "m01" / "killed-once").exists()
    population = summary["population"]
    assert [m["status"] for m in population] == ["finished"] * 4
    assert [m["restarts"] for m in population] == [0, 1, 0, 0]
    killed = population[1]
    # its first report survived; it went on from step 1024, not from 0
    assert [point[0] for point in killed["curve"]] == [1024, 2048, 3072]
    assert killed["env_steps"] == 3072 and summary["dropped"] == []


def test_a_member_that_keeps_dying_is_dropped_and_the_run_goes_on(tmp_path):
    import pbt_helpers
    summary = train_population(_population(tmp_path, pbt_helpers.member_two_always_dies,
                                           total=1024, interval=512, max_restarts=1))
    statuses = [m["status"] for m in summary["population"]]
    assert statuses == ["finished", "finished", "dropped", "finished"]
    (dropped,) = summary["dropped"]
    assert dropped["member"] == 2
    assert "died 2 times in a row" in dropped["reason"] and "SIGKILL" in dropped["reason"]
    assert summary["best_member"] != 2 and (tmp_path / "run" / "policy.pt").exists()


@pytest.mark.slow  # the command twice, in subprocesses
def test_resume_after_the_controller_is_killed(tmp_path):
    out = tmp_path / "run"
    argv = [sys.executable, "-m", "rl", "train", "ppo", "--env", "CartPole-v1", "--population",
            "3", "--total-steps", "3072", "--pbt-interval", "1024", "--eval-episodes", "2",
            "--out", str(out), "--no-progress", "--set", "rollout_length=64",
            "--set", "minibatch_size=64"]
    master = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              env={**os.environ, "PYTHONPATH": str(HERE.parent)})
    state_path = out / "population.json"
    deadline = time.monotonic() + 180
    before = None
    while time.monotonic() < deadline:
        try:
            before = json.loads(state_path.read_text())
        except (OSError, ValueError):
            before = None
        if before and all(m["evaluations"] for m in before["members"]):
            break
        time.sleep(0.2)
    assert before and all(m["evaluations"] for m in before["members"])
    master.kill()
    master.communicate(timeout=30)
    pids = [m["pid"] for m in before["members"]]
    deadline = time.monotonic() + 30  # members notice their controller is gone
    while time.monotonic() < deadline and any(_alive(p) for p in pids):
        time.sleep(0.2)
    assert not any(_alive(p) for p in pids)
    done = subprocess.run(argv + ["--resume"], capture_output=True, text=True, timeout=200,
                          env={**os.environ, "PYTHONPATH": str(HERE.parent)})
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert [m["status"] for m in summary["population"]] == ["finished"] * 3
    for member, earlier in zip(summary["population"], before["members"]):
        assert member["curve"][0] == earlier["evaluations"][0][:2]  # kept, not redone from 0
        assert [p[0] for p in member["curve"]] == [1024, 2048, 3072]
    assert summary["wall_s"] > before["wall_s"]


def _alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split()[2] != "Z"
    except OSError:
        return False


def test_population_flags_are_checked_before_any_work(tmp_path, capsys):
    base = ["train", "ppo", "--env", "CartPole-v1", "--out", str(tmp_path / "x"), "--no-progress"]
    cases = [
        (["--search", "lr=uniform:0.1:0.2"], "--search needs --population N"),
        (["--population", "1"], "--population must be at least 2"),
        (["--population", "4", "--search", "lr=loguniform:1e-5"], "loguniform takes LOW:HIGH"),
        (["--population", "4", "--search", "hidden=choice:32,64"], "cannot change 'hidden'"),
        (["--population", "4", "--set", "lr=0.001", "--search", "lr=loguniform:1e-4:1e-3"],
         "given to both --set and --search"),
        (["--population", "4", "--ranks", "2"], "--ranks > 1 cannot be used with --population"),
        (["--population", "4", "--pbt-quantile", "0.7"], "--pbt-quantile must be in (0, 0.5]"),
    ]
    for extra, message in cases:
        assert cli(base + extra) == 2
        err = capsys.readouterr().err
        assert message in err and len(err.strip().splitlines()) == 1, err
    assert cli(["train", "es", "--env", "CartPole-v1", "--population", "4", "--out",
                str(tmp_path / "x")]) == 2
    assert "es cannot train as a population" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()


# -- other backends -------------------------------------------------------------------------
TWO_NODE_MASTER = """
import json, sys
sys.path.insert(0, {tests!r})
import fiberrl, pbt_helpers
from rl.pbt import PopulationSpec, train_population
from rl.registry import TrainSpec

if __name__ == "__main__":
    fiberrl.init(backend="slurm")
    train = TrainSpec("ppo", "CartPole-v1", {out!r}, seed=0, total_steps=2048, eval_episodes=2,
                      progress=False, overrides={{"rollout_length": 64, "minibatch_size": 64}})
    summary = train_population(PopulationSpec(
        train, population=4, interval=512, quantile=0.5, builder=pbt_helpers.kill_member_one_once,
        member_resources={{"cpu": 4, "mem": "1G"}}))  # 8-CPU nodes: two members on each
    print("RESULT", json.dumps(summary), flush=True)
"""


def test_population_on_two_slurm_nodes(tmp_path):
    """N=4 on the real two-node Slurm cluster, each member a job; member 1 SIGKILLs its
    own job once and is restarted as a new job from its checkpoint."""
    import slurm_cluster
    conf = slurm_cluster.up("two-node")
    master = tmp_path / "master.py"
    master.write_text(TWO_NODE_MASTER.format(tests=str(HERE), out=str(tmp_path / "run")))
    env = {**os.environ, "SLURM_CONF": conf, "PYTHONPATH": str(HERE.parent),
           "FIBERRL_EXTRA": json.dumps({"slurm_log_dir": str(tmp_path)})}
    env.pop("FIBERRL_BACKEND", None)
    try:
        done = slurm_cluster.run_master([sys.executable, str(master)], env)
    finally:
        slurm_cluster.assert_no_live_jobs(conf, grace=30)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    summary = json.loads(done.stdout.split("RESULT ", 1)[1])
    population = summary["population"]
    assert [m["status"] for m in population] == ["finished"] * 4
    assert all(m["env_steps"] == 2048 for m in population)
    assert {m["host"] for m in population} == {"fbrl-n1", "fbrl-n2"}
    assert [m["restarts"] for m in population] == [0, 1, 0, 0]
    assert [p[0] for p in population[1]["curve"]] == [512, 1024, 1536, 2048]
    assert (tmp_path / "run" / "policy.pt").exists()


@pytest.mark.parametrize("fiberrl_backend", ["docker"], indirect=True)
def test_population_in_docker_containers(tmp_path, fiberrl_backend):
    """N=4, each member a container of the real dockerd; the worker image has no torch,
    so the containers run this venv's interpreter, mounted read-only. Each container has
    its own PID namespace: the run-wide namespace holder would be started with that
    interpreter but without the mounts, and fail."""
    import fiberrl
    import backend_bindings
    volumes = backend_bindings.docker_volumes(tmp_path)
    for path in {os.path.realpath(sys.prefix), os.path.realpath(sys.base_prefix)}:
        volumes[path] = {"bind": path, "mode": "ro"}
    fiberrl.init(backend="docker", extra={"docker_volumes": volumes,
                                          "docker_python": sys.executable,
                                          "docker_pid_namespace": "private"})
    summary = train_population(_population(tmp_path, population=4, total=1024, interval=512,
                                           quantile=0.5))
    assert [m["status"] for m in summary["population"]] == ["finished"] * 4
    assert all(m["env_steps"] == 1024 for m in summary["population"])
    assert len({m["host"] for m in summary["population"]}) == 4  # one container each
    assert (tmp_path / "run" / "policy.pt").exists()
