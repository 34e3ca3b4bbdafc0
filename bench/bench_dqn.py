"""DQN benchmarks: double + dueling DQN on CartPole-v1 (3 seeds), throughput next to
Stable-Baselines3's DQN, and parametric-action DQN on CartPole-v1.

    python bench/bench_dqn.py [--part all|accept|throughput|parametric] [--steps 300000]
                              [--set key=value ...]

- accept: for seeds 0, 1, 2, DQN with its default config on one CartPole-v1 env, up to
  ``--steps`` env steps, stopped at the first evaluation >= 475 (deterministic, 10
  episodes, every ``--eval-every`` steps, :class:`rl.hooks.Evaluate`); prints per seed
  the env steps of that evaluation, the final evaluation and env steps/s (evaluation
  time included). ``--no-stop`` runs all ``--steps`` instead and also counts the
  evaluations at or above 475 from the first one on (how stable the solution is).
- throughput: env steps/s over ``--throughput-steps`` steps, learning included, no
  evaluation: this package's DQN (defaults, and plain 1-step) and Stable-Baselines3's
  DQN with the same settings (one env, same train frequency, minibatch, buffer,
  learning start, target updates, network sizes); runs interleaved ``--repeats``
  times, best kept (the machine is shared).
- parametric: :class:`rl.algos.parametric_dqn.ParametricDQN` on CartPole-v1 wrapped
  with :class:`rl.envs.parametric.ParametricActions` (one-hot action features), seed 0,
  stopped at the first evaluation >= 195.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import logging
import time
from typing import Any, Dict, List, Tuple

import gymnasium as gym
import torch

import rl
from rl.algos.dqn import DEFAULTS, DQN
from rl.algos.parametric_dqn import ParametricDQN
from rl.envs.parametric import ParametricActions
from rl.hooks import Evaluate

logger = logging.getLogger("bench_dqn")


def _setting(text: str) -> Tuple[str, Any]:
    key, _, value = text.partition("=")
    try:
        return key, json.loads(value)
    except json.JSONDecodeError:
        return key, value


def _train(policy: Any, env: Any, eval_env: Any, steps: int, bar: float, every: int,
           seed: int, stop: bool = True) -> Dict[str, Any]:
    evaluate = Evaluate(eval_env, every_steps=every, threshold=bar)
    started = time.perf_counter()
    condition = rl.AfterSteps(steps) | rl.RewardReached(bar) if stop else rl.AfterSteps(steps)
    state = rl.run(policy, env, condition, [evaluate], seed=seed)
    wall = time.perf_counter() - started
    solved = evaluate.solved_at_steps
    after = [mean for at, mean, _ in state.evaluations if solved is not None and at >= solved]
    return {"solved_at": solved, "final": state.evaluations[-1][1], "steps": state.env_steps,
            "rate": state.env_steps / wall, "wall": wall,
            "at_bar_after": f"{sum(m >= bar for m in after)}/{len(after)}",
            "curve": [(at, round(mean)) for at, mean, _ in state.evaluations]}


def accept(steps: int, every: int, overrides: Dict[str, Any], seeds: List[int], stop: bool) -> None:
    rows = []
    for seed in seeds:
        env = rl.make_vector_env("CartPole-v1", 1, seed=seed)
        try:
            policy = DQN(env.observation_space, env.action_space, config=overrides, seed=seed)
            rows.append((seed, _train(policy, env, "CartPole-v1", steps, 475, every, seed, stop)))
        finally:
            env.close()
        logger.info("  seed %d done: %s", seed, rows[-1][1])
    config = {**DEFAULTS, **overrides}
    logger.info("\nDQN (double=%s, dueling=%s, n_step=%s) on CartPole-v1, 1 env, <= %d env steps, "
                "eval every %d", config["double_q"], config["dueling"], config["n_step"], steps, every)
    logger.info("%-6s %-22s %-12s %-12s %-8s %s", "seed", "first eval >= 475 at", "final eval",
                "env steps/s", "wall s", "" if stop else "evals >= 475 from then on")
    for seed, r in rows:
        logger.info("%-6d %-22s %-12.1f %-12.0f %-8.0f %s", seed, r["solved_at"], r["final"], r["rate"],
                    r["wall"], "" if stop else r["at_bar_after"])
    solved = sum(r["solved_at"] is not None for _, r in rows)
    logger.info("solved: %d of %d seeds", solved, len(rows))


def _ours_rate(steps: int, overrides: Dict[str, Any]) -> float:
    env = rl.make_vector_env("CartPole-v1", 1, seed=0)
    try:
        policy = DQN(env.observation_space, env.action_space, config=overrides, seed=0)
        started = time.perf_counter()
        rl.run(policy, env, rl.AfterSteps(steps), seed=0)
        return steps / (time.perf_counter() - started)
    finally:
        env.close()


def _sb3_rate(steps: int, overrides: Dict[str, Any]) -> float:
    from stable_baselines3 import DQN as SB3DQN
    c = {**DEFAULTS, **overrides}
    env = gym.make("CartPole-v1")
    model = SB3DQN("MlpPolicy", env, learning_rate=c["lr"], buffer_size=c["buffer_size"],
                   learning_starts=c["learning_starts"], batch_size=c["minibatch_size"], tau=c["tau"],
                   gamma=c["gamma"], train_freq=c["train_every"], gradient_steps=c["gradient_steps"],
                   target_update_interval=c["target_update_every"],
                   exploration_fraction=c["epsilon_decay_steps"] / steps,
                   exploration_initial_eps=c["epsilon_start"], exploration_final_eps=c["epsilon_end"],
                   max_grad_norm=c["max_grad_norm"] or 1e9, seed=0, device="cpu", verbose=0,
                   policy_kwargs={"net_arch": list(c["hidden"])})
    started = time.perf_counter()
    model.learn(total_timesteps=steps)
    return steps / (time.perf_counter() - started)


def throughput(steps: int, overrides: Dict[str, Any], repeats: int) -> None:
    c = {**DEFAULTS, **overrides}
    plain = {**overrides, "double_q": False, "dueling": False, "n_step": 1}
    runs = [("fiberrl rl DQN (double + dueling, n-step %d)" % c["n_step"],
             lambda: _ours_rate(steps, overrides)),
            ("fiberrl rl DQN (plain, 1-step)", lambda: _ours_rate(steps, plain))]
    if importlib.util.find_spec("stable_baselines3") is not None:
        runs.append(("Stable-Baselines3 DQN (plain, 1-step)", lambda: _sb3_rate(steps, overrides)))
    else:
        logger.info("stable-baselines3 is not installed; no peer figure")
    rates: Dict[str, List[float]] = {name: [] for name, _ in runs}
    for _ in range(repeats):  # interleaved, so a busy spell of a shared machine hits all alike
        for name, measure in runs:
            rates[name].append(measure())
    logger.info("\nDQN CartPole-v1 throughput over %d env steps, 1 env, train every %d steps, minibatch %d, "
                "network %s, learning included, no evaluation (best of %d, all runs):", steps,
                c["train_every"], c["minibatch_size"], c["hidden"], repeats)
    for name, values in rates.items():
        logger.info("  %-48s %8.0f env steps/s  %s", name, max(values), [round(v) for v in values])


def parametric(steps: int, every: int) -> None:
    def make() -> gym.Env:
        return ParametricActions(gym.make("CartPole-v1"))

    env = rl.make_vector_env(make, 1, seed=0)
    try:
        layout = env.envs[0].get_wrapper_attr("layout")
        policy = ParametricDQN(env.observation_space, env.action_space, seed=0,
                               config=layout.policy_config())
        r = _train(policy, env, make, steps, 195, every, 0)
    finally:
        env.close()
    logger.info("\nParametric-action DQN on CartPole-v1 (one-hot action features), seed 0, "
                "<= %d steps:", steps)
    logger.info("  first eval >= 195 at %s env steps, final eval %.1f, %.0f env steps/s",
                r["solved_at"], r["final"], r["rate"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--part", choices=("all", "accept", "throughput", "parametric"), default="all")
    parser.add_argument("--steps", type=int, default=300_000)
    parser.add_argument("--eval-every", type=int, default=5_000)
    parser.add_argument("--throughput-steps", type=int, default=30_000)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--repeats", type=int, default=2, help="throughput runs per row (best kept)")
    parser.add_argument("--no-stop", action="store_true",
                        help="accept: run all --steps (no stop at 475) and count evaluations >= 475")
    parser.add_argument("--set", dest="settings", action="append", type=_setting, default=[],
                        metavar="KEY=VALUE", help="DQN config override (JSON value), repeatable")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    logging.getLogger("rl").setLevel(logging.WARNING)
    torch.set_num_threads(1)
    overrides = dict(args.settings)
    if args.part in ("all", "throughput"):
        throughput(args.throughput_steps, overrides, args.repeats)
    if args.part in ("all", "accept"):
        accept(args.steps, args.eval_every, overrides, args.seeds, not args.no_stop)
    if args.part in ("all", "parametric"):
        parametric(args.steps, args.eval_every)


if __name__ == "__main__":
    main()
