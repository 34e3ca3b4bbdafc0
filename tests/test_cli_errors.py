"""Every command keeps one error contract: bad input gives exit status 2 and one line
``fiberrl CMD: error: ...`` on stderr, no traceback, and no output directory."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FIBERRL = [sys.executable, "-m", "fiberrl.cli"]

BAD = [
    (["ps", "--backend", "nosuch"], "fiberrl ps: error: unknown backend 'nosuch'"),
    (["cancel", "local-999999"], "fiberrl cancel: error: no local fiberrl job"),
    (["cancel", "nosuchjob"], "fiberrl cancel: error: no local fiberrl job 'nosuchjob': a "
                              "local job's id is local-<pid>"),
    (["cancel"], "fiberrl cancel: error: name the jobs to cancel, or --all"),
    (["logs", "local-1"], "fiberrl logs: error: local jobs write"),
    (["run", "nosuch.py"], "fiberrl run: error: no such script"),
    (["run", "--backend", "nosuch", "job.py"], "fiberrl run: error: unknown backend"),
    (["nosuchcommand"], "fiberrl: error: argument COMMAND: invalid choice"),
    (["train", "nosuchalgo"], "fiberrl train: error: unknown algorithm 'nosuchalgo'"),
    (["train", "nosuchalgo", "--env", "CartPole-v1", "--out", "out"],
     "fiberrl train: error: unknown algorithm 'nosuchalgo'"),
    (["train", "ppo"], "fiberrl train: error: --env is required"),
    (["train", "ppo", "--env", "NoSuchEnv-v9", "--out", "out"],
     "fiberrl train: error: unknown environment 'NoSuchEnv-v9'"),
    (["train", "dqn", "--env", "Pendulum-v1", "--out", "out"],
     "fiberrl train: error: dqn needs a Discrete action space"),
    (["train", "ppo", "--env", "CartPole-v1", "--set", "lr=fast", "--out", "out"],
     "fiberrl train: error: --set lr=\"fast\": lr takes a number"),
    (["train", "ppo", "--env", "CartPole-v1", "--set", "nosuch=1", "--out", "out"],
     "fiberrl train: error: --set nosuch: ppo has no setting 'nosuch'"),
    (["train", "es", "--env", "CartPole-v1", "--backend", "nosuch", "--out", "out"],
     "fiberrl train: error: unknown backend 'nosuch'"),
    (["train", "ppo", "--env", "CartPole-v1", "--ranks", "64", "--devices", "cuda", "--out", "out"],
     "fiberrl train: error: --devices cuda: 64 rank(s) with devices='cuda' need 64 GPU(s) on "
     "this host"),   # on the GPU machine it was RankFailedError from inside CUDA, status 1
    (["train", "ppo", "--env", "CartPole-v1", "--total-steps", "x"],
     "fiberrl train: error: argument --total-steps: invalid int value"),
    # 0 is no count of envs nor a period: not silently the default
    *[(["train", "ppo", "--env", "CartPole-v1", flag, value, "--out", "out"],
       f"fiberrl train: error: {flag} must be at least 1")
      for flag in ("--num-envs", "--eval-every") for value in ("0", "-3")],
    (["workflow", "timeline", "--input", "nosuch.jsonl", "--out", "out", "--gamma", "0.9"],
     "fiberrl workflow timeline: error:"),
    (["workflow", "train", "--config", "nosuch.toml"], "fiberrl workflow train: error:"),
    (["workflow"], "fiberrl workflow: error: the following arguments are required: STEP"),
    (["--log-level", "bogus", "backends"], "fiberrl: error: --log-level: unknown log level"),
    (["cpe"], "fiberrl cpe: error: the following arguments are required: COMMAND"),
    (["cpe", "evaluate", "nosuch.jsonl"], "fiberrl cpe evaluate: error: nosuch.jsonl: no such"),
    (["cpe", "evaluate", "log.txt"], "fiberrl cpe evaluate: error: log.txt: cannot tell the "
                                     "format from suffix '.txt'; use one of"),
    (["cpe", "evaluate", "log.jsonl", "--target-policy", "nosuch.pt"],
     "fiberrl cpe evaluate: error: --target-policy nosuch.pt: no such file"),
    # a discount outside [0, 1] is refused for bandit data too (there it would be unused)
    (["cpe", "evaluate", "log.jsonl", "--gamma", "2"],
     "fiberrl cpe evaluate: error: --gamma must lie in [0, 1], got 2.0"),
    (["cpe", "evaluate", "log.jsonl", "--gamma", "nan"],
     "fiberrl cpe evaluate: error: --gamma must lie in [0, 1], got nan"),
]


def _run(args, cwd, env=None):
    env = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
    env.pop("FIBERRL_LOG_LEVEL", None) if "FIBERRL_LOG_LEVEL" not in (env or {}) else None
    return subprocess.run(FIBERRL + args, cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=300)


@pytest.mark.parametrize("args,message", BAD, ids=[" ".join(a) for a, _ in BAD])
def test_bad_input_is_one_line_and_status_2(tmp_path, args, message):
    pytest.importorskip("torch") if args[0] in ("train", "workflow") else None
    (tmp_path / "job.py").write_text("print('hi')\n")
    (tmp_path / "log.txt").write_text("")
    (tmp_path / "log.jsonl").write_text('{"action": 0, "reward": 1, "action_probability": 1,'
                                        ' "target_probs": [1]}\n')
    done = _run(args, tmp_path)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith(message), done.stderr
    assert "Traceback" not in done.stderr
    assert not (tmp_path / "out").exists() and not (tmp_path / "runs").exists()


def test_an_unknown_log_level_in_the_environment_is_one_line_and_status_2(tmp_path):
    done = _run(["backends"], tmp_path, env={"FIBERRL_LOG_LEVEL": "bogus"})
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith("fiberrl: error: FIBERRL_LOG_LEVEL: unknown log level 'bogus'")
    assert len(done.stderr.splitlines()) == 1


def test_debug_shows_the_traceback(tmp_path):
    done = _run(["cancel", "--debug", "local-999999"], tmp_path)
    assert done.returncode == 2 and "Traceback" in done.stderr
    done = _run(["cancel", "local-999999"], tmp_path, env={"FIBERRL_LOG_LEVEL": "DEBUG"})
    assert done.returncode == 2 and "Traceback" in done.stderr


def test_backends_say_which_extra_is_missing(monkeypatch, capsys):
    import importlib.util
    from fiberrl import cli
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "docker" else real(name, *a))
    assert cli.main(["backends"]) == 0
    docker = [line for line in capsys.readouterr().out.splitlines() if " docker" in line][0]
    assert "pip install 'fiberrl[docker]'" in docker
    assert cli.main(["ps", "--backend", "docker"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("fiberrl ps: error: the docker backend needs the docker Python package")


def test_workflow_train_checks_the_onnx_extra_before_training(tmp_path, monkeypatch, capsys):
    pytest.importorskip("torch")
    import importlib.util
    from rl.cli import run
    config = tmp_path / "c.toml"
    config.write_text('out = "run"\n[generate]\nepisodes = 5\n[export]\n'
                      'formats = ["torchscript", "onnx"]\n')
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "onnx" else real(name, *a))
    assert run(["workflow", "train", "--config", str(config)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "pip install 'fiberrl[export]'" in err
    assert not (tmp_path / "run").exists()


@pytest.mark.slow
def test_out_reuse_is_refused_and_resume_continues(tmp_path):
    pytest.importorskip("torch")
    args = ["train", "ppo", "--env", "CartPole-v1", "--total-steps", "512", "--eval-episodes", "1",
            "--no-progress", "--set", "rollout_length=64", "--set", "minibatch_size=64"]
    first = _run(args, tmp_path)
    assert first.returncode == 0, first.stderr
    assert "solved at None" not in first.stdout and "not solved" in first.stdout
    (out,) = (tmp_path / "runs").iterdir()
    assert out.name.startswith("ppo-CartPole-v1-")
    again = _run(args + ["--out", str(out)], tmp_path)
    assert again.returncode == 2 and "pass --resume" in again.stderr
    steps = args[:]
    steps[steps.index("512")] = "1024"
    resumed = _run(steps + ["--out", str(out), "--resume"], tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert summary["env_steps"] == 1024 and summary["curve"][0][0] == 0
    assert len(list((out / "tb").iterdir())) <= 2


def test_output_piped_into_a_reader_that_leaves_ends_quietly(tmp_path):
    """``fiberrl ps | head -1``: once the reader has gone, the command stops with the
    shell's SIGPIPE status and prints nothing (it printed 'error: BrokenPipeError')."""
    script = (
        "import argparse, sys\n"
        "from fiberrl.cli.support import run_command\n"
        "def lots(args):\n"
        "    for i in range(200000):\n"
        "        print('job', i)\n"
        "sys.exit(run_command(lots, argparse.Namespace(), 'fiberrl ps'))\n")
    done = subprocess.run(f"{sys.executable} -c \"{script}\" | head -1", shell=True, cwd=tmp_path,
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True,
                          text=True, timeout=120, executable="/bin/bash")
    assert done.stdout == "job 0\n"
    assert done.stderr == "", done.stderr


@pytest.mark.parametrize("error", [
    BrokenPipeError("the other end of the pipe is closed"),   # a fiberrl pipe's peer
    "manager",                                                 # a manager's server gone
])
def test_a_broken_pipe_that_is_not_our_output_is_reported_as_an_error(error, capsys):
    """Only a write to our own output whose reader left ends quietly; a fiberrl pipe or
    manager connection failing inside the command is an error, one line, exit 1."""
    import argparse
    import fiberrl
    from fiberrl.cli.support import run_command
    if error == "manager":
        error = fiberrl.ManagerConnectionError("the manager's server is gone")

    def fails(args):
        raise error

    assert run_command(fails, argparse.Namespace(), "fiberrl ps") == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"error: {type(error).__name__}: {error}" in err, err
