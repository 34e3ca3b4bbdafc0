"""The logged-data generator, reading transitions back as arrays, and the
``workflow generate|timeline|normalize`` command line end to end."""
import argparse
import json

import numpy as np
import pytest

pytest.importorskip("gymnasium")
pa = pytest.importorskip("pyarrow")

from rl.cli import run as main  # noqa: E402  (python -m rl)
from rl.data.cli import register_workflow  # noqa: E402
from rl.data.generate import logged_rows  # noqa: E402
from rl.data.sharding import run_timeline  # noqa: E402
from rl.data.transitions import read_transitions  # noqa: E402
from rl.data.writers import write_logged_rows  # noqa: E402
from rl.envs import Gridworld, optimal_q  # noqa: E402

pytestmark = pytest.mark.timeout(120)

GRID = "rl/Gridworld-v0"
CELLS = [str(i) for i in range(25)]


def test_register_workflow_adds_three_steps():
    parser = argparse.ArgumentParser(prog="fiberrl")
    workflow = register_workflow(parser.add_subparsers(dest="command"))
    assert isinstance(workflow, argparse.ArgumentParser)
    cases = {
        "generate": ["--env", GRID, "--episodes", "2", "--out", "x.jsonl"],
        "timeline": ["--input", "a", "b", "--out", "o", "--gamma", "0.9", "--workers", "2",
                     "--backend", "local"],
        "normalize": ["--input", "o", "--out", "s.json", "--override", "3=enum"],
    }
    for step, rest in cases.items():
        args = parser.parse_args(["workflow", step, *rest])
        assert callable(args.func) and args.func.__name__.startswith("run_")
    args = parser.parse_args(["workflow", "timeline", *cases["timeline"]])
    assert (args.input, args.gamma, args.workers, args.backend) == (["a", "b"], 0.9, 2, "local")
    with pytest.raises(SystemExit):
        parser.parse_args(["workflow", "timeline", "--input", "a", "--out", "o", "--gamma", "0.9",
                           "--workers", "0"])


def test_uniform_gridworld_rows_follow_the_dynamics():
    rows = list(logged_rows(GRID, 10, 1.0, seed=0))
    grid = Gridworld()
    assert {r["action_probability"] for r in rows} == {0.25}
    assert {r["action"] for r in rows} <= set(Gridworld.ACTION_NAMES)
    assert all(r["possible_actions"] == list(Gridworld.ACTION_NAMES) for r in rows)
    episodes = {}
    for r in rows:
        episodes.setdefault(r["mdp_id"], []).append(r)
    assert sorted(episodes) == sorted(f"s0-e{k}" for k in range(10))
    for episode in episodes.values():
        assert [r["sequence_number"] for r in episode] == list(range(len(episode)))
        assert episode[0]["state_features"] == {"0": 1.0}
        for now, after in zip(episode, episode[1:]):
            (cell,) = now["state_features"]
            action = Gridworld.ACTION_NAMES.index(now["action"])
            assert after["state_features"] == {str(grid.move(int(cell), action)): 1.0}
            assert now["reward"] == 0.0
    assert rows == list(logged_rows(GRID, 10, 1.0, seed=0))  # seeded


def test_greedy_gridworld_episode_values_equal_optimal_values(tmp_path):
    write_logged_rows(logged_rows(GRID, 3, 0.0, seed=1), tmp_path / "greedy.parquet")
    run_timeline(tmp_path / "greedy.parquet", tmp_path / "out", 0.9)
    data = read_transitions(tmp_path / "out", CELLS, Gridworld.ACTION_NAMES)
    q = optimal_q(Gridworld(), 0.9)
    cells = data["state"].argmax(axis=1)
    assert len(cells) == 3 * 8  # the shortest path has 8 steps
    np.testing.assert_allclose(data["episode_value"], q[cells].max(axis=1), rtol=1e-9)
    np.testing.assert_array_equal(data["action"], q[cells].argmax(axis=1))
    assert set(data["action_probability"]) == {1.0}


def test_read_transitions_dense_arrays(tmp_path):
    write_logged_rows(logged_rows(GRID, 20, 0.5, seed=2), tmp_path / "rows.jsonl")
    run_timeline(tmp_path / "rows.jsonl", tmp_path / "out", 0.9, workers=2)
    data = read_transitions(tmp_path / "out", CELLS, Gridworld.ACTION_NAMES)
    n = len(data["reward"])
    assert data["state"].shape == (n, 25) and data["state"].dtype == np.float32
    np.testing.assert_array_equal(data["state"].sum(axis=1), np.ones(n))
    np.testing.assert_array_equal(data["state_present"], data["state"] == 1.0)
    terminal = data["terminal"]
    assert terminal.sum() == 20
    assert not data["next_state_present"][terminal].any()
    assert (data["next_action"][terminal] == -1).all()
    assert (data["next_action"][~terminal] >= 0).all()
    assert data["possible_actions"].all() and not data["possible_next_actions"][terminal].any()
    grid = Gridworld()
    live = ~terminal
    moved = [grid.move(s, a) for s, a in zip(data["state"][live].argmax(1), data["action"][live])]
    np.testing.assert_array_equal(data["next_state"][live].argmax(1), moved)
    expected = 0.5 / 4 + 0.5 * (data["action"] == optimal_q(grid, 0.9)[
        data["state"].argmax(1)].argmax(1))
    np.testing.assert_allclose(data["action_probability"], expected)
    assert list(data["action_names"]) == list(Gridworld.ACTION_NAMES)
    with pytest.raises(ValueError, match="not in action_names"):
        read_transitions(tmp_path / "out", CELLS, ["L", "R"])


def test_cli_generate_timeline_normalize_end_to_end(tmp_path, capsys):
    torch = pytest.importorskip("torch")
    pytest.importorskip("scipy")
    logged = tmp_path / "cartpole.csv"
    assert main(["workflow", "generate", "--env", "CartPole-v1", "--episodes", "12",
                 "--epsilon", "1.0", "--seed", "4", "--out", str(logged)]) == 0
    assert main(["workflow", "timeline", "--input", str(logged), "--out", str(tmp_path / "tl"),
                 "--gamma", "0.99", "--workers", "2", "--backend", "local"]) == 0
    spec_path = tmp_path / "spec.json"
    assert main(["workflow", "normalize", "--input", str(tmp_path / "tl"), "--out",
                 str(spec_path), "--workers", "2", "--override", "0=quantile"]) == 0
    output = capsys.readouterr().out
    assert "wrote" in output and "12 MDPs" in output and "4 features" in output
    data = read_transitions(tmp_path / "tl")
    n = len(data["reward"])
    assert data["state"].shape == (n, 4) and data["state_present"].all()
    assert set(np.unique(data["action"])) <= {0, 1}
    np.testing.assert_allclose(data["action_probability"], 0.5)
    spec = json.loads(spec_path.read_text())
    assert spec["features"]["0"]["type"] == "quantile" and spec["features"]["0"]["overridden"]
    assert all(spec["features"][f]["count"] == n for f in "0123")
    from rl.data.normalization import FeatureNormalizer
    from rl.data.spec import load_spec
    module = FeatureNormalizer(load_spec(spec_path), list(data["state_features"]))
    out = module(torch.from_numpy(data["state"]), torch.from_numpy(data["state_present"]))
    assert out.shape == (n, 4) and torch.isfinite(out).all()


def test_cli_reports_bad_input_with_status_two(tmp_path, capsys):
    path = tmp_path / "rows.jsonl"
    path.write_text(json.dumps({"mdp_id": "a", "sequence_number": 1, "state_features": {},
                                "action": "L", "action_probability": 0.5, "reward": 1}) + "\n"
                    + json.dumps({"mdp_id": "a", "sequence_number": 2, "state_features": {},
                                  "action": "L", "action_probability": 0.5}) + "\n")
    status = main(["workflow", "timeline", "--input", str(path), "--out", str(tmp_path / "out"),
                   "--gamma", "0.9"])
    assert status == 2
    assert capsys.readouterr().err.endswith(
        f"workflow timeline: error: {path}, line 2, field 'reward': missing\n")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rows.jsonl"]
    assert main(["workflow", "normalize", "--input", str(tmp_path / "nothing"), "--out",
                 str(tmp_path / "s.json")]) == 2
    assert "no such file" in capsys.readouterr().err
    assert main(["workflow", "generate", "--env", "Pendulum-v1", "--episodes", "1", "--out",
                 str(tmp_path / "p.jsonl")]) == 2
    assert "only discrete action spaces" in capsys.readouterr().err
    assert not (tmp_path / "p.jsonl").exists()
