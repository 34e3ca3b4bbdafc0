"""Feature identification (Horizon's Algorithm 1), the parallel feature sample, the
JSON spec, and the PyTorch normalization module (hand-computed outputs, missing
features, clamping, TorchScript)."""
import io
import json
import math

import numpy as np
import pytest

pytest.importorskip("scipy")
pa = pytest.importorskip("pyarrow")

from rl.data.identify import IdentifyOptions, identify_features, identify_type  # noqa: E402
from rl.data.sampling import sample_features  # noqa: E402
from rl.data.sharding import run_timeline  # noqa: E402
from rl.data.spec import load_spec, save_spec, validate_spec  # noqa: E402
from rl.data.writers import write_logged_rows  # noqa: E402

pytestmark = pytest.mark.timeout(120)

N = 4000


def synthetic(seed=0):
    rng = np.random.default_rng(seed)
    return {
        "binary": rng.integers(0, 2, N).astype(float),
        "probability": rng.beta(2.0, 5.0, N),
        "enum": rng.choice([2.0, 5.0, 7.0, 11.0], N),
        "continuous": rng.normal(10.0, 3.0, N),
        "boxcox": rng.lognormal(1.0, 0.8, N),
        "boxcox_exponential": rng.exponential(2.0, N),
        "quantile": np.concatenate([rng.normal(-5, 1, N // 2), rng.normal(5, 1, N // 2)]),
        "quantile_uniform": rng.uniform(-5.0, 100.0, N),
    }


@pytest.mark.parametrize("name", sorted(synthetic()))
def test_each_kind_is_identified(name):
    values = synthetic()[name]
    assert identify_type(values) == name.split("_")[0]


def test_identify_rules_on_small_value_sets():
    assert identify_type(np.array([1.0])) == "binary"
    assert identify_type(np.array([0.0, 0.5, 1.0])) == "probability"
    assert identify_type(np.array([-1.0, 3.0, 3.0])) == "enum"
    assert identify_type(np.arange(11.0)) == "continuous"  # too few values to test more
    many = np.repeat(np.arange(11.0), 10)
    assert identify_type(many) != "enum"
    assert identify_type(many, IdentifyOptions(max_enum_values=11)) == "enum"


def test_spec_parameters_and_overrides_win():
    samples = synthetic()
    spec = identify_features(samples, overrides={"continuous": "quantile", "boxcox": "continuous",
                                                 "quantile_uniform": "binary"})
    features = spec["features"]
    assert {k: v["type"] for k, v in features.items()} == {
        "binary": "binary", "probability": "probability", "enum": "enum",
        "continuous": "quantile", "boxcox": "continuous", "boxcox_exponential": "boxcox",
        "quantile": "quantile", "quantile_uniform": "binary"}
    assert features["continuous"]["overridden"] and "overridden" not in features["enum"]
    assert features["enum"]["values"] == [2, 5, 7, 11]
    assert features["boxcox"]["mean"] == pytest.approx(np.mean(samples["boxcox"]))
    assert features["boxcox"]["stddev"] == pytest.approx(np.std(samples["boxcox"]))
    quantiles = features["quantile"]["quantiles"]
    assert len(quantiles) == 21 and quantiles[0] == samples["quantile"].min()
    assert quantiles[10] == pytest.approx(np.median(samples["quantile"]))
    assert features["binary"]["samples"] == N
    with pytest.raises(ValueError, match="without data"):
        identify_features(samples, overrides={"nope": "binary"})
    with pytest.raises(ValueError, match="override types"):
        identify_features(samples, overrides={"binary": "gaussian"})


def test_spec_round_trip_and_validation(tmp_path):
    spec = identify_features(synthetic())
    save_spec(spec, tmp_path / "spec.json")
    assert load_spec(tmp_path / "spec.json") == json.loads(json.dumps(spec))
    broken = json.loads(json.dumps(spec))
    del broken["features"]["continuous"]["stddev"]
    with pytest.raises(ValueError, match="'continuous': a continuous feature needs 'stddev'"):
        validate_spec(broken)
    broken["features"]["continuous"] = {"type": "quantile", "quantiles": [3.0, 1.0]}
    with pytest.raises(ValueError, match="sorted"):
        validate_spec(broken)


# -- the module --------------------------------------------------------------------------
torch = pytest.importorskip("torch")
from rl.data.normalization import FeatureNormalizer  # noqa: E402

HAND_SPEC = {
    "version": 1, "clamp": 3.0,
    "features": {
        "b": {"type": "binary"},
        "p": {"type": "probability"},
        "e": {"type": "enum", "values": [2, 5, 7]},
        "c": {"type": "continuous", "mean": 1.0, "stddev": 2.0},
        "x": {"type": "boxcox", "lambda": 0.5, "shift": 1.0, "min": 0.0, "mean": 1.0,
              "stddev": 0.5},
        "l": {"type": "boxcox", "lambda": 0.0, "shift": 0.0, "min": 0.5, "mean": 0.0,
              "stddev": 1.0},
        "q": {"type": "quantile", "quantiles": [0.0, 1.0, 3.0, 7.0]},
    },
}
FEATURES = ["c", "e", "b", "q", "p", "x", "l"]


def test_module_outputs_hand_computed():
    module = FeatureNormalizer(HAND_SPEC, FEATURES)
    assert module.output_names == ["c", "e=2", "e=5", "e=7", "b", "q", "p", "x", "l"]
    assert module.output_dim == 9
    values = torch.tensor([
        [2.0, 5.0, 0.0, 2.0, 0.25, 3.0, math.e],
        [-9.0, 4.0, 3.0, 9.0, 1.0, -5.0, 0.1],
        [1.0, 7.0, 1.0, -1.0, 0.5, 0.0, 1.0],
    ])
    out = module(values)
    # boxcox x: ((x + 1) ** 0.5 - 1) / 0.5, standardized with mean 1, stddev 0.5
    x0 = ((4.0 ** 0.5 - 1.0) / 0.5 - 1.0) / 0.5
    x2 = ((1.0 - 1.0) / 0.5 - 1.0) / 0.5
    expected = torch.tensor([
        [0.5, 0.0, 1.0, 0.0, 0.0, 1.5 / 3.0, math.log(0.25 / 0.75), x0, 1.0],
        # c clamped to -3; e=4 is no enum value; q above the last quantile -> 1;
        # p=1 clipped to 1-1e-5 then its logit clamped to 3; x below min -> min
        [-3.0, 0.0, 0.0, 0.0, 1.0, 1.0, 3.0, x2, math.log(0.5)],
        [0.0, 0.0, 0.0, 1.0, 1.0, 0.0, 0.0, x2, 0.0],
    ])
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-6)


def test_missing_features_output_zero_whatever_their_value():
    module = FeatureNormalizer(HAND_SPEC, FEATURES)
    values = torch.tensor([[2.0, 5.0, 1.0, 2.0, 0.25, 3.0, 2.0]])
    presence = torch.tensor([[False, False, True, True, True, True, False]])
    nan_values = values.clone()
    nan_values[~presence] = float("nan")
    for raw in (values, nan_values):
        out = module(raw, presence)
        assert out[0, :4].tolist() == [0.0, 0.0, 0.0, 0.0]  # c and e's three columns
        assert out[0, 8].item() == 0.0  # l
        assert out[0, 4].item() == 1.0 and out[0, 5].item() == pytest.approx(0.5)


@pytest.mark.filterwarnings("ignore:`torch.jit:DeprecationWarning")
def test_torchscript_output_equals_eager():
    module = FeatureNormalizer(HAND_SPEC, FEATURES)
    scripted = torch.jit.script(module)
    buffer = io.BytesIO()
    torch.jit.save(scripted, buffer)
    buffer.seek(0)
    loaded = torch.jit.load(buffer)
    values = torch.randn(64, 7) * 4
    presence = torch.rand(64, 7) > 0.2
    eager = module(values, presence)
    assert torch.equal(scripted(values, presence), eager)
    assert torch.equal(loaded(values, presence), eager)
    assert torch.equal(loaded(values.abs()), module(values.abs()))


def test_torch_export_output_equals_eager():
    module = FeatureNormalizer(HAND_SPEC, FEATURES)
    values = torch.randn(16, 7) * 4
    presence = torch.rand(16, 7) > 0.2
    exported = torch.export.export(module, (values, presence))
    assert torch.equal(exported.module()(values, presence), module(values, presence))


def test_normalized_continuous_and_boxcox_have_mean_zero_std_one():
    samples = synthetic(1)
    spec = identify_features(samples)
    names = ["continuous", "boxcox", "boxcox_exponential"]
    module = FeatureNormalizer(spec, names)
    out = module(torch.tensor(np.stack([samples[n] for n in names], axis=1)))
    assert [spec["features"][n]["type"] for n in names] == ["continuous", "boxcox", "boxcox"]
    for column in range(3):
        assert out[:, column].mean().item() == pytest.approx(0.0, abs=0.02)
        assert out[:, column].std().item() == pytest.approx(1.0, abs=0.02)
    assert out.abs().max().item() <= spec["clamp"]
    # quantile outputs spread uniformly over [0, 1]
    quantile = FeatureNormalizer(spec, ["quantile"])(torch.tensor(samples["quantile"])[:, None])
    assert quantile.min().item() == 0.0 and quantile.max().item() == 1.0
    assert quantile.mean().item() == pytest.approx(0.5, abs=0.02)


def test_module_rejects_features_outside_the_spec():
    with pytest.raises(ValueError, match=r"\['zz'\]"):
        FeatureNormalizer(HAND_SPEC, ["c", "zz"])


# -- sampling ---------------------------------------------------------------------------
def logged(rows_per_mdp=30, mdps=20, seed=0):
    rng = np.random.default_rng(seed)
    rows = []
    for mdp in range(mdps):
        for step in range(rows_per_mdp):
            features = {"n": float(rng.normal(3.0, 2.0)), "b": float(rng.integers(2))}
            if step % 3 == 0:
                features["rare"] = float(step)
            rows.append({"mdp_id": f"m{mdp}", "sequence_number": step, "state_features": features,
                         "action": "a", "action_probability": 1.0, "reward": 0.0})
    return rows


def test_sample_counts_and_exact_sample_when_small(tmp_path):
    rows = logged()
    write_logged_rows(rows[:300], tmp_path / "a.jsonl")
    write_logged_rows(rows[300:], tmp_path / "b.parquet")
    samples, counts = sample_features([tmp_path / "a.jsonl", tmp_path / "b.parquet"], size=10_000)
    assert counts == {"n": 600, "b": 600, "rare": 200}
    assert sorted(samples["rare"]) == sorted(r["state_features"]["rare"] for r in rows
                                             if "rare" in r["state_features"])
    np.testing.assert_allclose(np.sort(samples["n"]),
                               np.sort([r["state_features"]["n"] for r in rows]))


def test_sample_is_the_same_with_a_pool_and_bounded(tmp_path):
    rows = logged()
    write_logged_rows(rows, tmp_path / "rows.jsonl")
    run_timeline(tmp_path / "rows.jsonl", tmp_path / "out", 0.9, shards=4)
    one, counts_one = sample_features(tmp_path / "out", size=50, seed=3)
    two, counts_two = sample_features(tmp_path / "out", size=50, seed=3, workers=2)
    assert counts_one == counts_two == {"n": 600, "b": 600, "rare": 200}
    assert set(one) == set(two)
    for feature in one:
        assert len(one[feature]) == 50
        np.testing.assert_array_equal(one[feature], two[feature])
    all_n = {r["state_features"]["n"] for r in rows}
    assert set(one["n"].tolist()) <= all_n
    other, _ = sample_features(tmp_path / "out", size=50, seed=4)
    assert not np.array_equal(np.sort(other["n"]), np.sort(one["n"]))
