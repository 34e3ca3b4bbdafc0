"""Environments for benchmarks: CartPole-v1 whose step also costs a set CPU time.

Importing this module registers ``SlowCartPole-v1`` (``busy_us`` keyword, default 300),
so ``gymnasium.make("slow_envs:SlowCartPole-v1")`` works in any process that can import
it (jobs get the parent's ``sys.path``; put ``bench/`` on ``PYTHONPATH`` for commands).
"""
from __future__ import annotations

import time
from typing import Any

import gymnasium as gym


class BusyStep(gym.Wrapper):
    """Spend ``busy_s`` seconds of CPU in every step (an expensive simulator's stand-in)."""

    def __init__(self, env: gym.Env, busy_s: float) -> None:
        super().__init__(env)
        self.busy_s = busy_s

    def step(self, action: Any) -> Any:
        started = time.perf_counter()
        while time.perf_counter() - started < self.busy_s:
            pass
        return self.env.step(action)


def make_slow_cartpole(busy_us: float = 300.0, **kwargs: Any) -> gym.Env:
    """CartPole-v1 with a ``busy_us`` microseconds busy step."""
    env = gym.make("CartPole-v1", **kwargs)
    return BusyStep(env, busy_us * 1e-6) if busy_us else env


if "SlowCartPole-v1" not in gym.registry:
    gym.register("SlowCartPole-v1", entry_point=make_slow_cartpole)
