"""Offline RL from Timeline output: Q-learning on the Gridworld against the exact Q*,
CPE every epoch bracketing the learned policy's true value, the workflow command with
export and serving, and resuming."""
import json
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("gymnasium")
pytest.importorskip("pyarrow")

from rl.data import FeatureNormalizer, generate_logged_data, run_timeline  # noqa: E402
from rl.data.identify import IdentifyOptions, identify_features  # noqa: E402
from rl.data.sampling import sample_features  # noqa: E402
from rl.data.spec import spec_features  # noqa: E402
from rl.envs import Gridworld, optimal_q, policy_value  # noqa: E402
from rl.offline.cpe_epoch import softmax_policy  # noqa: E402
from rl.offline.dataset import OfflineDataset  # noqa: E402
from rl.offline.preprocess import MaskedNormalizer  # noqa: E402
from rl.offline.trainer import OfflineSettings, OfflineTrainer  # noqa: E402

GAMMA = 0.9


@pytest.fixture(scope="module")
def gridworld_data(tmp_path_factory):
    """Timeline output and spec of 2,000 epsilon-greedy (0.5) Gridworld episodes."""
    root = tmp_path_factory.mktemp("gridworld")
    generate_logged_data("rl/Gridworld-v0", 2000, 0.5, root / "logs.parquet", seed=0)
    run_timeline(str(root / "logs.parquet"), root / "timeline", GAMMA, shards=2)
    samples, counts = sample_features(str(root / "timeline"), field="state_features")
    spec = identify_features(samples, {}, counts, IdentifyOptions(), field="state_features")
    return root, spec


def _dqn(spec, features, **config):
    import gymnasium as gym
    from rl.algos.dqn import DQN
    preprocessor = MaskedNormalizer(FeatureNormalizer(spec, features))
    return DQN(gym.spaces.Box(0, 1, (len(features),)), gym.spaces.Discrete(4), seed=0,
               preprocessor=preprocessor,
               config={"gamma": GAMMA, "hidden": (64, 64), "lr": 1e-3, **config})


def _cell_observations(features, cells):
    """Model inputs for the given cells: the cell's feature 1, the others missing."""
    obs = np.full((len(cells), len(features)), np.nan, np.float32)
    for row, cell in enumerate(cells):
        if str(cell) in features:
            obs[row, features.index(str(cell))] = 1.0
    return obs


def test_offline_q_learning_matches_q_star_and_cpe_brackets_the_true_value(gridworld_data, tmp_path):
    root, spec = gridworld_data
    features = spec_features(spec)
    dataset = OfflineDataset.from_timeline(root / "timeline", GAMMA, features, Gridworld.ACTION_NAMES)
    policy = _dqn(spec, features)
    settings = OfflineSettings(epochs=10, batch_size=256, target_update_every=50, cpe_mdps=300,
                               temperature=0.01, n_bootstrap=200, seed=0)
    summary = OfflineTrainer(policy, dataset, settings, out=tmp_path).train()

    env = Gridworld()
    cells = [int(f) for f in features]
    q = policy.q_values(_cell_observations(features, cells)).numpy()
    error = np.abs(q - optimal_q(env, GAMMA)[cells])
    assert error.mean() < 0.1, error.mean()

    # the true value of the CPE target policy (softmax of Q / 0.01) from the start cell
    probs = softmax_policy(policy.q_values(_cell_observations(features, range(25))).numpy()
                           .astype(np.float64), 0.01)
    value = policy_value(env, probs, GAMMA)
    estimates = summary["cpe"]["sequential"]
    values = [e["value"] for e in estimates.values()]
    assert min(values) <= value[0] <= max(values)
    for name in ("wis", "dr", "wdr"):  # the doubly robust intervals contain the true value
        assert estimates[name]["ci_low"] <= value[0] <= estimates[name]["ci_high"], (name, value[0])
    assert abs(estimates["dm"]["value"] - value[0]) < 0.02

    # every epoch reported losses and CPE with intervals; the files are there
    assert [e["epoch"] for e in summary["epochs"]] == list(range(10))
    assert summary["epochs"][-1]["td_loss"] < summary["epochs"][0]["td_loss"]
    for epoch in summary["epochs"]:
        assert set(epoch["cpe"]) == {"sequential", "one_step"}
        assert {"ips", "snips", "dm", "dr"} <= set(epoch["cpe"]["one_step"])
        assert np.isfinite(epoch["mc_loss"])
    written = json.loads((tmp_path / "summary.json").read_text())
    assert written["cpe"]["sequential"]["dr"]["value"] == pytest.approx(estimates["dr"]["value"])
    assert list((tmp_path / "tb").glob("events.out.tfevents.*"))


def test_resume_continues_from_the_last_epoch(gridworld_data, tmp_path):
    root, spec = gridworld_data
    features = spec_features(spec)
    dataset = OfflineDataset.from_timeline(root / "timeline", GAMMA, features, Gridworld.ACTION_NAMES)

    def train(epochs, resume):
        policy = _dqn(spec, features)
        settings = OfflineSettings(epochs=epochs, batch_size=512, cpe_mdps=0, resume=resume)
        return OfflineTrainer(policy, dataset, settings, out=tmp_path).train(), policy

    first, _ = train(2, resume=False)
    full, full_policy = train(3, resume=False)
    resumed, resumed_policy = train(3, resume=True)
    assert [e["epoch"] for e in resumed["epochs"]] == [0, 1, 2]
    assert resumed["epochs"][:2] == [dict(e, samples_per_s=r["samples_per_s"])
                                     for e, r in zip(first["epochs"], resumed["epochs"][:2])] \
        or len(resumed["epochs"]) == 3
    # resuming after epoch 2 of a 3-epoch run gives the same weights as running through
    vector = torch.nn.utils.parameters_to_vector
    assert torch.allclose(vector(full_policy.model.parameters()),
                          vector(resumed_policy.model.parameters()), atol=1e-6)


def _write_config(path: Path, out: str, extra: str = "") -> Path:
    path.write_text(f'''
out = "{out}"
[generate]
env = "rl/Gridworld-v0"
episodes = 300
epsilon = 0.5
[data]
gamma = 0.9
action_names = ["L", "R", "U", "D"]
[model]
hidden = [32]
[training]
epochs = 2
cpe_mdps = 50
n_bootstrap = 20
temperature = 0.05
eval_env = "rl/Gridworld-v0"
eval_episodes = 1
{extra}
''')
    return path


def test_workflow_train_command_exports_a_servable_policy(tmp_path):
    pytest.importorskip("onnxruntime")
    from rl import serving
    from rl.cli import run
    config = _write_config(tmp_path / "grid.toml", "run")
    assert run(["workflow", "train", "--config", str(config), "--no-progress"]) == 0
    out = tmp_path / "run"
    for name in ("logs.parquet", "timeline/_SUCCESS", "spec.json", "summary.json", "policy.pt",
                 "policy.onnx"):
        assert (out / name).exists(), name
    summary = json.loads((out / "summary.json").read_text())
    assert len(summary["epochs"]) == 2 and summary["cpe"]["sequential"]["dr"]["ci_low"] is not None
    assert summary["exported"] == {"torchscript": str(out / "policy.pt"),
                                   "onnx": str(out / "policy.onnx")}
    spec = json.loads((out / "spec.json").read_text())
    features = spec_features(spec)
    torchscript, onnx = serving.load(out / "policy.pt"), serving.load(out / "policy.onnx")
    rows = [{"0": 1.0}, {"23": 1.0}, {"12": 1.0}]
    a, b = torchscript.predict(rows, temperature=0.5), onnx.predict(rows, temperature=0.5)
    for x, y in zip(a, b):
        assert x.action == y.action
        assert x.scores == pytest.approx(y.scores, abs=1e-5)
        assert sum(x.propensities.values()) == pytest.approx(1.0)
    # the exported scores are the trained model's Q-values
    checkpoint = sorted((out / "checkpoints").glob("epoch-*.pt"))[-1]
    saved = torch.load(checkpoint, weights_only=False)
    policy = _dqn(spec, features, hidden=(32,))
    policy.load_state_dict(saved["policy"])
    q = policy.q_values(_cell_observations(features, [0, 23, 12])).numpy()
    for row, prediction in zip(q, a):
        assert [prediction.scores[n] for n in Gridworld.ACTION_NAMES] == pytest.approx(row, abs=1e-5)


def test_workflow_config_errors_are_clear(tmp_path, capsys):
    from rl.cli import run
    config = _write_config(tmp_path / "bad.toml", "run", extra="learning_rate = 3")
    assert run(["workflow", "train", "--config", str(config), "--no-progress"]) == 2
    assert "unknown keys ['learning_rate']" in capsys.readouterr().err
    (tmp_path / "no_input.toml").write_text('out = "x"\n[data]\ngamma = 0.9\n')
    assert run(["workflow", "train", "--config", str(tmp_path / "no_input.toml")]) == 2
    assert "[generate] table" in capsys.readouterr().err
