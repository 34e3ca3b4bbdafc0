"""Export and serving: TorchScript and ONNX files that take raw features, normalize
them and score them in one pass; rl.serving predicts from feature maps with either
file, and matches the eager module (and ONNX Runtime matches PyTorch)."""
import logging
import math
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from torch import nn  # noqa: E402

from rl import serving  # noqa: E402
from rl.data.normalization import FeatureNormalizer  # noqa: E402
from rl.export import (ExportedActor, ExportedParametricPolicy, ExportedPolicy,  # noqa: E402
                       export_onnx, export_torchscript)

pytestmark = pytest.mark.timeout(180)

FORMATS = ["torchscript", "onnx"]
SPEC = {"version": 1, "clamp": 5.0, "features": {
    "1": {"type": "continuous", "mean": 1.0, "stddev": 2.0},
    "2": {"type": "binary"},
    "3": {"type": "enum", "values": [2, 5, 7]},
    "4": {"type": "probability"},
    "5": {"type": "boxcox", "lambda": 0.5, "shift": 1.0, "min": 0.0, "mean": 0.3, "stddev": 1.2},
    "6": {"type": "quantile", "quantiles": [0.0, 1.0, 4.0, 10.0]},
    "7": {"type": "quantile", "quantiles": [-1.0, 1.0]},
    "speed": {"type": "continuous", "mean": 0.0, "stddev": 10.0},
}}
ACTIONS = ["up", "down", "left", "right"]
ROWS = [
    {"1": 0.5, "2": 1.0, "3": 5, "4": 0.2, "5": 3.0, "6": 2.5, "7": 0.0, "speed": 12.0},
    {"1": -40.0, "3": 4, "6": 1.0, "7": -3.0},           # clamped; enum value not in the spec
    {"2": 0.0, "4": 1.0, "5": 0.0, "6": 11.0, "7": 1.0},  # quantile ends and bounds
    {},                                                   # every feature absent
    {"1": None, "speed": -3.0, "6": -0.5, "5": 1e3, 3: 7},  # None is absent; int keys work
]


def mlp(inputs, outputs, seed):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(inputs, 16), nn.ReLU(), nn.Linear(16, outputs))


class PairScorer(nn.Module):
    """Parametric scorer: an MLP on [state, action features] for every action."""

    def __init__(self, state_dim: int, action_dim: int) -> None:
        super().__init__()
        self.net = mlp(state_dim + action_dim, 1, seed=2)

    def forward(self, state: torch.Tensor, action_features: torch.Tensor) -> torch.Tensor:
        tiled = state.unsqueeze(1).expand(-1, action_features.shape[1], -1)
        return self.net(torch.cat([tiled, action_features], dim=2)).squeeze(2)


def arrays(rows, features):
    values, presence = serving.encode_features(rows, features)
    return torch.from_numpy(values), torch.from_numpy(presence)


def eager(module, *inputs):
    with torch.no_grad():
        return module(*inputs)


def save(module, directory, fmt, metadata=None):
    if fmt == "onnx":
        pytest.importorskip("onnxruntime")
        pytest.importorskip("onnxscript")
        path = directory / "model.onnx"
        return path, export_onnx(module, path, metadata)
    path = directory / "model.pt"
    return path, export_torchscript(module, path, metadata)


@pytest.fixture(scope="module")
def policy():
    normalizer = FeatureNormalizer(SPEC)
    return ExportedPolicy(normalizer, mlp(normalizer.output_dim, len(ACTIONS), seed=1), ACTIONS)


@pytest.fixture(scope="module", params=FORMATS)
def exported(request, policy, tmp_path_factory):
    path, meta = save(policy, tmp_path_factory.mktemp(request.param), request.param,
                      metadata={"run": "abc", "epoch": 3})
    return path, meta, serving.load(path)


def test_predictions_equal_the_eager_module(policy, exported):
    _, _, predictor = exported
    values, presence = arrays(ROWS, policy.features)
    for temperature in (1.0, 0.25, 4.0):
        scores, greedy, propensities = eager(policy, values, presence, torch.tensor([temperature]))
        predictions = predictor.predict(ROWS, temperature=temperature)
        assert len(predictions) == len(ROWS)
        for row, prediction in enumerate(predictions):
            got = np.array([prediction.scores[a] for a in ACTIONS])
            np.testing.assert_allclose(got, scores[row].numpy(), rtol=1e-5, atol=1e-5)
            assert prediction.action == ACTIONS[int(greedy[row])]
            probabilities = np.array([prediction.propensities[a] for a in ACTIONS])
            assert probabilities.sum() == pytest.approx(1.0, abs=1e-6)
            expected = torch.softmax(torch.from_numpy(got) / temperature, dim=0).numpy()
            np.testing.assert_allclose(probabilities, expected, rtol=1e-5, atol=1e-6)
            np.testing.assert_allclose(probabilities, propensities[row].numpy(), atol=1e-6)
    single = predictor.predict(ROWS[0])
    assert isinstance(single, serving.Prediction) and single == predictor.predict(ROWS[:1])[0]
    assert predictor.predict([]) == []


def test_missing_features_are_absent(policy, exported):
    _, _, predictor = exported
    nothing = predictor.predict({})
    none_values = predictor.predict({f: None for f in policy.features})
    values = torch.full((1, len(policy.features)), float("nan"))
    scores = eager(policy, values, torch.zeros_like(values, dtype=torch.bool), torch.ones(1))[0]
    assert nothing == none_values
    np.testing.assert_allclose([nothing.scores[a] for a in ACTIONS], scores[0], atol=1e-5)


def test_onnx_runtime_equals_pytorch(policy, exported):
    path, _, predictor = exported
    if predictor.format != "onnx":
        pytest.skip("ONNX only")
    import onnxruntime

    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    values, presence = arrays(ROWS, policy.features)
    values[~presence] = float("nan")  # whatever an absent value holds is ignored
    for batch in (len(ROWS), 1):
        for temperature in (1.0, 1e-30):  # a tiny temperature is greedy, not NaN
            inputs = (values[:batch], presence[:batch], torch.tensor([temperature]))
            expected = eager(policy, *inputs)
            got = session.run(None, {n: t.numpy() for n, t in zip(policy.input_names, inputs)})
            np.testing.assert_allclose(got[0], expected[0].numpy(), rtol=1e-5, atol=1e-5)
            np.testing.assert_array_equal(got[1], expected[1].numpy())
            np.testing.assert_allclose(got[2], expected[2].numpy(), atol=1e-6)
            assert not np.isnan(got[2]).any()


def test_metadata_round_trip(policy, exported):
    _, meta, predictor = exported
    assert predictor.metadata == meta
    assert meta["kind"] == "discrete" and predictor.kind == "discrete"
    assert predictor.features == policy.features == ["1", "2", "3", "4", "5", "6", "7", "speed"]
    assert predictor.action_names == ACTIONS
    assert meta["normalized_features"][2:5] == ["3=2", "3=5", "3=7"]
    assert meta["outputs"] == ["scores", "action", "propensities"]
    assert meta["run"] == "abc" and meta["epoch"] == 3
    assert meta["fiberrl_version"]
    assert meta["exporter"] == ("torch.onnx" if predictor.format == "onnx" else "torch.jit.script")


def test_bad_inputs_give_clear_errors(exported):
    _, _, predictor = exported
    with pytest.raises(ValueError, match=r"unknown feature ids \['nope'\]"):
        predictor.predict({"1": 1.0, "nope": 2.0})
    assert predictor.predict({"1": 1.0, "nope": 2.0}, ignore_unknown=True) == \
        predictor.predict({"1": 1.0})
    for temperature in (0.0, -1.0, math.nan, math.inf):
        with pytest.raises(ValueError, match="temperature must be a positive"):
            predictor.predict({"1": 1.0}, temperature=temperature)
    with pytest.raises(ValueError, match="must be finite"):
        predictor.predict({"1": math.nan})
    with pytest.raises(ValueError, match="not a number"):
        predictor.predict({"1": "fast"})
    with pytest.raises(ValueError, match="only for parametric"):
        predictor.predict({"1": 1.0}, possible_actions={"up": [1.0]})
    with pytest.raises(TypeError, match="mapping"):
        predictor.predict("1=1.0")


def test_export_errors(policy, tmp_path):
    with pytest.raises(ValueError, match="reserved"):
        export_torchscript(policy, tmp_path / "m.pt", {"kind": "other"})
    with pytest.raises(ValueError, match="JSON"):
        export_torchscript(policy, tmp_path / "m.pt", {"when": object()})
    narrow = ExportedPolicy(policy.preprocessor, mlp(policy.preprocessor.output_dim, 3, 0), ACTIONS)
    with pytest.raises(ValueError, match="expected"):
        export_torchscript(narrow, tmp_path / "m.pt")
    with pytest.raises(ValueError, match="unique"):
        ExportedPolicy(None, nn.Identity(), ["a", "a"], features=["x", "y"])
    with pytest.raises(ValueError, match="features"):
        ExportedPolicy(None, nn.Identity(), ["a", "b"])
    with pytest.raises(FileNotFoundError):
        serving.load(tmp_path / "missing.onnx")


def test_load_errors(tmp_path, monkeypatch):
    garbage = tmp_path / "model.onnx"
    garbage.write_bytes(b"not a model")
    pytest.importorskip("onnxruntime")
    with pytest.raises(ValueError, match="not a loadable onnx model"):
        serving.load(garbage)
    monkeypatch.setitem(sys.modules, "onnxruntime", None)  # as if it were not installed
    with pytest.raises(ImportError, match=r"fiberrl\[export\]"):
        serving.load(garbage)


class Unscriptable(nn.Module):
    """A scorer torch.jit.script rejects (``*args``), so export falls back to tracing."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.linear = nn.Linear(width, 2)

    def forward(self, *inputs):
        return self.linear(inputs[0])


def test_trace_fallback(tmp_path, caplog):
    module = ExportedPolicy(None, Unscriptable(3), ["a", "b"], features=["x", "y", "z"])
    with caplog.at_level(logging.WARNING, logger="rl.export"):
        meta = export_torchscript(module, tmp_path / "m.pt")
    assert meta["exporter"] == "torch.jit.trace" and "falling back" in caplog.text
    rows = [{"x": 1.0, "z": -2.0}, {"y": 3.0}, {}]
    values, presence = arrays(rows, module.features)
    scores = eager(module, values, presence, torch.ones(1))[0]
    got = serving.load(tmp_path / "m.pt").predict(rows)
    np.testing.assert_allclose([[p.scores["a"], p.scores["b"]] for p in got], scores, atol=1e-6)


@pytest.mark.parametrize("fmt", FORMATS)
def test_parametric_policy_masks_actions(fmt, tmp_path):
    normalizer = FeatureNormalizer(SPEC, features=["1", "3", "6"])
    module = ExportedParametricPolicy(normalizer, PairScorer(normalizer.output_dim, 2),
                                      ["price", "size"])
    path, meta = save(module, tmp_path, fmt)
    predictor = serving.load(path)
    assert predictor.kind == "parametric" and meta["action_feature_names"] == ["price", "size"]
    rows = [{"1": 2.0, "3": 7}, {"6": 3.0}, {"1": -1.0}]
    possible = [{"a": {"price": 1.0, "size": 2.0}, "b": [0.5, -1.0], "c": {"size": 0, "price": 3}},
                {"only": [2.0, 2.0]},
                {}]  # no possible action
    predictions = predictor.predict(rows, temperature=0.5, possible_actions=possible)

    values, presence = arrays(rows, module.features)
    features = torch.zeros(3, 3, 2)
    features[0] = torch.tensor([[1.0, 2.0], [0.5, -1.0], [3.0, 0.0]])
    features[1, 0] = torch.tensor([2.0, 2.0])
    mask = torch.tensor([[True, True, True], [True, False, False], [False, False, False]])
    scores, greedy, propensities = eager(module, values, presence, features, mask,
                                         torch.tensor([0.5]))
    assert torch.isinf(scores[~mask]).all() and (propensities[~mask] == 0).all()
    assert not torch.isnan(propensities).any() and greedy.tolist()[1:] == [0, -1]
    for row, prediction in enumerate(predictions[:2]):
        names = list(possible[row])
        np.testing.assert_allclose([prediction.scores[n] for n in names],
                                   scores[row, :len(names)], rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose([prediction.propensities[n] for n in names],
                                   propensities[row, :len(names)], atol=1e-6)
        assert prediction.action == names[int(greedy[row])]
    assert predictions[1].propensities == {"only": 1.0}
    assert predictions[2] == serving.Prediction(scores={}, action=None, propensities={})

    # one row, one action (the action axis is dynamic); the single-row form
    one = predictor.predict(rows[0], possible_actions={"b": [0.5, -1.0]})
    assert one.action == "b" and one.propensities == {"b": 1.0}
    assert one.scores["b"] == pytest.approx(predictions[0].scores["b"], abs=1e-5)
    with pytest.raises(ValueError, match="needs possible_actions"):
        predictor.predict(rows)
    with pytest.raises(ValueError, match=r"action features \['size'\] missing"):
        predictor.predict(rows[0], possible_actions={"a": {"price": 1.0}})
    with pytest.raises(ValueError, match="one mapping per row"):
        predictor.predict(rows, possible_actions=possible[:2])


@pytest.mark.parametrize("fmt", FORMATS)
def test_actor_export(fmt, tmp_path):
    module = ExportedActor(None, nn.Sequential(mlp(3, 2, seed=3), nn.Tanh()), action_dim=2,
                           action_low=[0.0, -2.0], action_high=[1.0, 2.0],
                           features=["x", "y", "z"])
    path, meta = save(module, tmp_path, fmt)
    assert meta["kind"] == "continuous" and meta["action_low"] == [0.0, -2.0]
    predictor = serving.load(path)
    rows = [{"x": 1.0, "y": -0.5, "z": 3.0}, {"y": 2.0}, {}]
    values, presence = arrays(rows, module.features)
    expected = eager(module, values, presence)
    got = predictor.predict(rows, temperature=123.0)  # temperature means nothing here
    np.testing.assert_allclose([p.action for p in got], expected, rtol=1e-5, atol=1e-6)
    assert all(0.0 <= a.action[0] <= 1.0 and -2.0 <= a.action[1] <= 2.0 for a in got)
    # absent features are zeros for a model without normalization
    zero = eager(module, torch.zeros(1, 3), torch.ones(1, 3, dtype=torch.bool))
    np.testing.assert_allclose(predictor.predict({}).action, zero[0], atol=1e-6)
