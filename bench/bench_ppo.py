"""PPO benchmarks: learning CartPole-v1 (3 seeds), throughput, Pendulum-v1.

    python bench/bench_ppo.py [--part all|accept|throughput|pendulum] [--steps 150000]

- accept: ``fiberrl train ppo`` semantics on CartPole-v1 for seeds 0, 1, 2 up to
  150,000 env steps, evaluation (deterministic, 10 episodes) every 5,000 steps;
  prints the first env steps with evaluation mean >= 475, and also the first env
  steps at which the mean *training* return of the last 20 episodes (the
  stochastic policy, what CleanRL reports) reaches 475.
- throughput: env steps per second including learning, no evaluation, with 4 envs
  in this process, 4 envs in 2 and 4 fiberrl processes, and Stable-Baselines3's
  PPO with the same settings (4 envs, 128 steps, 4 epochs, minibatch 128, 64x64
  MLPs) in the same run when it is installed.
- pendulum: continuous actions, 200,000 steps, evaluation every 20,000.
"""
from __future__ import annotations

import argparse
import logging
import time
from collections import deque

import torch

import rl
from rl.algos.ppo import CONTINUOUS_DEFAULTS, PPO
from rl.hooks import Evaluate
from rl.loop import Hook

logger = logging.getLogger("bench_ppo")


class TrainingReturnCrossing(Hook):
    """First env steps at which one training episode, and the mean of the last
    ``window`` training episodes, reached ``bar`` (training: the stochastic policy)."""

    def __init__(self, bar: float, window: int = 20) -> None:
        self.bar, self.returns, self.crossed_at = bar, deque(maxlen=window), None
        self.first_episode_at = None

    def episode_post(self, run, episode):
        self.returns.append(episode.ret)
        if self.first_episode_at is None and episode.ret >= self.bar:
            self.first_episode_at = run.env_steps
        if (self.crossed_at is None and len(self.returns) == self.returns.maxlen
                and sum(self.returns) / len(self.returns) >= self.bar):
            self.crossed_at = run.env_steps


def accept(steps: int) -> None:
    logger.info("PPO on CartPole-v1, %d env steps, 4 envs", steps)
    for seed in (0, 1, 2):
        env = rl.make_vector_env("CartPole-v1", 4, seed=seed)
        policy = PPO(env.observation_space, env.action_space, seed=seed, config={"total_steps": steps})
        evaluate = Evaluate("CartPole-v1", every_steps=5_000)
        crossing = TrainingReturnCrossing(475)
        started = time.perf_counter()
        state = rl.run(policy, env, rl.AfterSteps(steps), [evaluate, crossing], seed=seed)
        logger.info("seed %d: eval mean >= 475 at %s; first training episode >= 475 at %s; "
                    "mean of 20 training episodes >= 475 at %s; final eval %.1f; %.0f s",
                    seed, evaluate.solved_at_steps, crossing.first_episode_at, crossing.crossed_at,
                    state.evaluations[-1][1], time.perf_counter() - started)


def _fiberrl_rate(steps: int, workers: int) -> float:
    env = rl.make_vector_env("CartPole-v1", 4, seed=0, in_processes=workers > 0,
                             **({"envs_per_process": 4 // workers} if workers else {}))
    try:
        policy = PPO(env.observation_space, env.action_space, seed=0, config={"total_steps": steps})
        started = time.perf_counter()
        rl.run(policy, env, rl.AfterSteps(steps), seed=0)
        return steps / (time.perf_counter() - started)
    finally:
        env.close()


def _sb3_rate(steps: int) -> float:
    from stable_baselines3 import PPO as SB3PPO
    from stable_baselines3.common.env_util import make_vec_env
    env = make_vec_env("CartPole-v1", n_envs=4, seed=0)
    model = SB3PPO("MlpPolicy", env, n_steps=128, batch_size=128, n_epochs=4, learning_rate=2.5e-4,
                   gae_lambda=0.95, ent_coef=0.01, clip_range=0.2, max_grad_norm=0.5, seed=0,
                   policy_kwargs={"net_arch": [64, 64]}, device="cpu", verbose=0)
    started = time.perf_counter()
    model.learn(total_timesteps=steps)
    return steps / (time.perf_counter() - started)


def throughput(steps: int) -> None:
    rows = [("fiberrl rl PPO, 4 envs in this process", _fiberrl_rate(steps, 0)),
            ("fiberrl rl PPO, 4 envs in 2 fiberrl processes", _fiberrl_rate(steps, 2)),
            ("fiberrl rl PPO, 4 envs in 4 fiberrl processes", _fiberrl_rate(steps, 4))]
    try:
        rows.append(("Stable-Baselines3 PPO, 4 envs (DummyVecEnv)", _sb3_rate(steps)))
    except ImportError:
        logger.info("stable-baselines3 is not installed; no peer figure")
    base = rows[0][1]
    logger.info("PPO CartPole-v1 throughput over %d env steps, learning included, no evaluation:", steps)
    for name, rate in rows:
        logger.info("  %-50s %8.0f steps/s  (%.2fx of in-process)", name, rate, rate / base)


def pendulum(steps: int = 200_000) -> None:
    env = rl.make_vector_env("Pendulum-v1", 4, seed=0)
    policy = PPO(env.observation_space, env.action_space, seed=0,
                 config={**CONTINUOUS_DEFAULTS, "total_steps": steps})
    evaluate = Evaluate("Pendulum-v1", every_steps=20_000)
    state = rl.run(policy, env, rl.AfterSteps(steps), [evaluate], seed=0)
    logger.info("PPO Pendulum-v1 (4 envs): evaluation curve %s",
                [(s, round(m)) for s, m, _ in state.evaluations])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--part", choices=("all", "accept", "throughput", "pendulum"), default="all")
    parser.add_argument("--steps", type=int, default=150_000)
    parser.add_argument("--throughput-steps", type=int, default=50_000)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    logging.getLogger("rl").setLevel(logging.WARNING)
    torch.set_num_threads(1)
    if args.part in ("all", "throughput"):
        throughput(args.throughput_steps)
    if args.part in ("all", "accept"):
        accept(args.steps)
    if args.part in ("all", "pendulum"):
        pendulum()


if __name__ == "__main__":
    main()
