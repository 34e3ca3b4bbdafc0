"""``fiberrl train`` / ``python -m rl train``: outputs, resume, errors."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("gymnasium")

from rl.cli import run  # noqa: E402

SUMMARY_FIELDS = {"algo", "env", "seed", "env_steps", "wall_s", "eval_mean", "eval_std", "curve",
                  "solved_at_steps"}


def test_train_writes_every_output_and_resumes(tmp_path):
    out = tmp_path / "run"
    argv = ["train", "ppo", "--env", "CartPole-v1", "--seed", "3", "--total-steps", "1024",
            "--out", str(out), "--eval-every", "512", "--eval-episodes", "2", "--no-progress",
            "--set", "rollout_length=64", "--set", "minibatch_size=64"]
    assert run(argv) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert SUMMARY_FIELDS <= set(summary)
    assert (summary["algo"], summary["env"], summary["seed"], summary["env_steps"]) == \
        ("ppo", "CartPole-v1", 3, 1024)
    assert [point[0] for point in summary["curve"]] == [0, 512, 1024]
    assert summary["eval_mean"] == summary["curve"][-1][1]
    assert summary["settings"]["rollout_length"] == 64
    assert (out / "curve.png").read_bytes()[:4] == b"\x89PNG"
    assert list((out / "tb").glob("events.out.tfevents.*"))
    assert (out / "checkpoints" / "step-1024.pt").exists()

    argv[argv.index("1024")] = "2048"
    assert run(argv + ["--resume"]) == 0
    resumed = json.loads((out / "summary.json").read_text())
    assert resumed["env_steps"] == 2048
    assert resumed["curve"][:3] == summary["curve"]
    assert resumed["wall_s"] > summary["wall_s"]


def test_unknown_algorithm_and_environment(tmp_path, capsys):
    assert run(["train", "nope", "--env", "CartPole-v1", "--out", str(tmp_path / "x")]) == 2
    assert "python -m rl train: error: unknown algorithm 'nope'" in capsys.readouterr().err
    assert run(["train", "ppo", "--env", "NoSuchEnv-v9", "--out", str(tmp_path / "x"),
                "--no-progress"]) == 2
    assert "unknown environment" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()


def test_fiberrl_program_has_the_train_command():
    fiberrl = Path(sys.executable).with_name("fiberrl")
    result = subprocess.run([str(fiberrl), "train", "--help"], capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stderr
    assert "--total-steps" in result.stdout and "--workers" in result.stdout
