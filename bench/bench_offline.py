"""Offline acceptance of the Horizon workflow, through ``fiberrl workflow train``'s code.

    python bench/bench_offline.py [--part all|gridworld|cartpole]

- gridworld: ``configs/gridworld_offline.toml`` (2,000 epsilon-greedy episodes, Q-learning
  over the Timeline output, 10 epochs): mean absolute error of the learned Q against the
  exact Q* by value iteration, and each CPE estimate of the learned softmax policy next
  to its true value (policy evaluation on the known model).
- cartpole: ``configs/cartpole_offline.toml`` (~30,000 transitions of a random policy):
  evaluation mean (10 deterministic episodes) after every epoch.
"""
from __future__ import annotations

import argparse
import logging
import tempfile
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parent.parent
logger = logging.getLogger("bench_offline")


def _final_policy(config, out: Path):
    from rl.data.spec import load_spec, spec_features
    from rl.offline.workflow import _policy
    spec = load_spec(out / "spec.json")
    features = spec_features(spec)
    saved = torch.load(sorted((out / "checkpoints").glob("epoch-*.pt"),
                              key=lambda p: int(p.stem[6:]))[-1], weights_only=False)
    policy = _policy(config, spec, features, 4)
    policy.load_state_dict(saved["policy"])
    return policy, features


def gridworld(out: Path) -> None:
    from rl.envs import Gridworld, optimal_q, policy_value
    from rl.offline.cpe_epoch import softmax_policy
    from rl.offline.workflow import load_config, run_workflow
    config = load_config(ROOT / "configs" / "gridworld_offline.toml")
    config.out = out
    summary = run_workflow(config)
    policy, features = _final_policy(config, out)
    env, gamma = Gridworld(), config.data.gamma
    obs = np.full((25, len(features)), np.nan, np.float32)
    for column, feature in enumerate(features):
        obs[int(feature), column] = 1.0
    q = policy.q_values(obs).numpy().astype(np.float64)
    cells = [int(f) for f in features]
    mae = float(np.abs(q[cells] - optimal_q(env, gamma)[cells]).mean())
    probs = softmax_policy(q, config.training.temperature)
    value = policy_value(env, probs, gamma)
    logger.info("Gridworld offline Q-learning: MAE of Q against Q* = %.4f (bar 0.1)", mae)
    logger.info("CPE of softmax(Q / %g) vs its true value %.4f:", config.training.temperature, value[0])
    for name, e in summary["cpe"]["sequential"].items():
        inside = e["ci_low"] <= value[0] <= e["ci_high"]
        logger.info("  %-6s %.4f  [%.4f, %.4f]  %s", name, e["value"], e["ci_low"], e["ci_high"],
                    "contains the true value" if inside else "misses")


def cartpole(out: Path) -> None:
    from rl.offline.workflow import load_config, run_workflow
    config = load_config(ROOT / "configs" / "cartpole_offline.toml")
    config.out = out
    summary = run_workflow(config)
    evals = [round(e["eval_mean"], 1) for e in summary["epochs"]]
    first = next((i for i, v in enumerate(evals) if v >= 120), None)
    logger.info("CartPole offline DQN from %s random-policy transitions: evaluation per epoch %s",
                "~30,500", evals)
    logger.info("  first epoch with mean >= 120: %s; best %.1f; final (exported policy) %.1f",
                first, max(evals), summary["eval_mean"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--part", choices=("all", "gridworld", "cartpole"), default="all")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    logging.getLogger("rl").setLevel(logging.WARNING)
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        if args.part in ("all", "gridworld"):
            gridworld(Path(tmp) / "gridworld")
        if args.part in ("all", "cartpole"):
            cartpole(Path(tmp) / "cartpole")


if __name__ == "__main__":
    main()
