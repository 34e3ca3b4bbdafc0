"""TD3 and DDPG benchmarks on Pendulum-v1: learning (3 seeds each) and throughput
against Stable-Baselines3.

    python bench/bench_td3.py [--part all|accept|throughput] [--steps 30000]
                              [--throughput-steps 6000] [--rounds 2] [--algos td3,ddpg]
                              [--seeds 0,1,2] [--full]

- accept: TD3 and DDPG with their defaults, one env, seeds 0, 1, 2, up to
  ``--steps`` env steps; deterministic evaluation (rl.hooks.Evaluate, 10 episodes)
  every 2,000 steps; a seed stops at its first evaluation mean >= -200 (unless
  ``--full``: then the final evaluation shows whether it stays there). Prints per
  seed the first env steps with evaluation >= -200, the final evaluation and env
  steps/s (wall time of the whole run, evaluations included).
- throughput: env steps/s of ``--throughput-steps`` steps, learning included, no
  evaluation, for this TD3 and Stable-Baselines3's TD3 with the same settings
  (256x256 ReLU MLPs, batch 256, Adam 1e-3, learning_starts 1000, one gradient
  step per env step, policy delay 2, Gaussian exploration noise 0.1 of the half
  range), alternating ``--rounds`` times in this process (on a shared machine the
  load moves the numbers more than anything else; the load average is printed
  with each figure, and the table compares the best round of each).

One torch thread (``torch.set_num_threads(1)``), as ``fiberrl train`` uses.
"""
from __future__ import annotations

import argparse
import importlib.util
import logging
import os
import time
from typing import List, Tuple

import torch

import rl
from rl.algos.td3 import DDPG, TD3
from rl.hooks import Evaluate

logger = logging.getLogger("bench_td3")

ENV = "Pendulum-v1"
BAR = -200.0
POLICIES = {"td3": TD3, "ddpg": DDPG}


def _load() -> str:
    return f"load {os.getloadavg()[0]:.1f}"


def accept_run(algo: str, seed: int, steps: int, full: bool) -> Tuple[object, float, float, int]:
    """One seed: (first env steps with eval >= BAR or None, final eval, steps/s, env steps)."""
    env = rl.make_vector_env(ENV, 1, seed=seed)
    try:
        policy = POLICIES[algo](env.observation_space, env.action_space, seed=seed)
        evaluate = Evaluate(ENV, every_steps=2_000, episodes=10, threshold=BAR)
        started = time.perf_counter()
        stop = rl.AfterSteps(steps) if full else rl.AfterSteps(steps) | rl.RewardReached(BAR)
        state = rl.run(policy, env, stop, [evaluate], seed=seed)
        rate = state.env_steps / (time.perf_counter() - started)
    finally:
        env.close()
    return evaluate.solved_at_steps, state.evaluations[-1][1], rate, state.env_steps


def accept(algos: List[str], seeds: List[int], steps: int, full: bool) -> None:
    rows = []
    for algo in algos:
        for seed in seeds:
            solved, final, rate, taken = accept_run(algo, seed, steps, full)
            rows.append((algo, seed, solved, final, rate, taken))
            logger.info("  %s seed %d: eval >= %g at %s, final eval %.1f, %.0f steps/s (%s)",
                        algo, seed, BAR, solved, final, rate, _load())
    logger.info("")
    logger.info("%s, up to %d env steps, eval every 2,000 (10 episodes, deterministic):", ENV, steps)
    logger.info("| algo | seed | first env steps with eval >= %g | final eval | env steps | env steps/s |", BAR)
    logger.info("|------|------|------|------|------|------|")
    for algo, seed, solved, final, rate, taken in rows:
        logger.info("| %s | %d | %s | %.1f | %d | %.0f |", algo, seed,
                    "-" if solved is None else f"{solved:,}", final, taken, rate)
    for algo in algos:
        passed = sum(1 for row in rows if row[0] == algo and row[2] is not None)
        logger.info("%s: %d of %d seeds reached %g", algo, passed, len(seeds), BAR)


def fiberrl_rate(steps: int) -> float:
    env = rl.make_vector_env(ENV, 1, seed=0)
    try:
        policy = TD3(env.observation_space, env.action_space, seed=0)
        started = time.perf_counter()
        rl.run(policy, env, rl.AfterSteps(steps), seed=0)
        return steps / (time.perf_counter() - started)
    finally:
        env.close()


def sb3_rate(steps: int) -> float:
    import numpy as np
    from stable_baselines3 import TD3 as SB3TD3
    from stable_baselines3.common.noise import NormalActionNoise
    noise = NormalActionNoise(mean=np.zeros(1), sigma=np.full(1, 0.1 * 2.0))  # 0.1 of half of [-2, 2]
    model = SB3TD3("MlpPolicy", ENV, learning_rate=1e-3, buffer_size=1_000_000, learning_starts=1_000,
                   batch_size=256, tau=0.005, gamma=0.99, train_freq=1, gradient_steps=1,
                   action_noise=noise, policy_delay=2, target_policy_noise=0.2, target_noise_clip=0.5,
                   policy_kwargs={"net_arch": [256, 256]}, seed=0, device="cpu", verbose=0)
    started = time.perf_counter()
    model.learn(total_timesteps=steps)
    return steps / (time.perf_counter() - started)


def throughput(steps: int, rounds: int) -> None:
    runners = [("fiberrl rl TD3", fiberrl_rate), ("Stable-Baselines3 TD3", sb3_rate)]
    if importlib.util.find_spec("stable_baselines3") is None:
        logger.info("stable-baselines3 is not installed; no peer figure")
        runners = runners[:1]
    rates: dict = {name: [] for name, _ in runners}
    for round_ in range(rounds):  # alternate, so a change in the machine's load hits both
        for name, rate_of in runners:
            rates[name].append(rate_of(steps))
            logger.info("  round %d, %s: %.0f steps/s (%s)", round_, name, rates[name][-1], _load())
    logger.info("")
    logger.info("TD3 %s throughput over %d env steps (1 env, learning included, no evaluation), "
                "%d alternating rounds:", ENV, steps, rounds)
    logger.info("| implementation | env steps/s, each round | best | best / fiberrl best |")
    logger.info("|------|------|------|------|")
    base = max(rates[runners[0][0]])
    for name, values in rates.items():
        logger.info("| %s | %s | %.0f | %.2f |", name, ", ".join(f"{v:.0f}" for v in values),
                    max(values), max(values) / base)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--part", choices=("all", "accept", "throughput"), default="all")
    parser.add_argument("--steps", type=int, default=30_000)
    parser.add_argument("--throughput-steps", type=int, default=6_000)
    parser.add_argument("--rounds", type=int, default=2, help="alternating throughput rounds")
    parser.add_argument("--algos", default="td3,ddpg")
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--full", action="store_true",
                        help="accept: run every seed to --steps instead of stopping at -200")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    logging.getLogger("rl").setLevel(logging.WARNING)
    torch.set_num_threads(1)
    if args.part in ("all", "throughput"):
        throughput(args.throughput_steps, args.rounds)
    if args.part in ("all", "accept"):
        accept(args.algos.split(","), [int(s) for s in args.seeds.split(",")], args.steps, args.full)


if __name__ == "__main__":
    main()
