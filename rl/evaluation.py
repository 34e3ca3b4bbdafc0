"""Evaluate a policy: deterministic actions over a fixed set of seeded episodes.

All episodes run side by side in one in-process vector env, so the policy is asked
for a batch of actions per step (one forward pass), and each member stops after
its first episode. Episode ``i`` uses seed ``seed + i``, so two evaluations of the
same policy with the same seed see the same starts.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, List, Protocol, Tuple

import numpy as np

from .envs import EnvSpec, make_env

logger = logging.getLogger(__name__)

EVAL_SEED = 10_000  # evaluation episodes use seeds EVAL_SEED, EVAL_SEED + 1, ...


class ActingPolicy(Protocol):
    """What evaluation needs from a policy."""

    def compute_actions(self, obs: np.ndarray, explore: bool = True) -> Tuple[np.ndarray, dict]:
        """Actions for a batch of observations (and per-row extras)."""


@dataclass
class Evaluation:
    """Returns and lengths of the evaluation episodes."""

    returns: List[float]
    lengths: List[int]

    @property
    def mean(self) -> float:
        """Mean episode return."""
        return float(np.mean(self.returns))

    @property
    def std(self) -> float:
        """Standard deviation of the episode returns."""
        return float(np.std(self.returns))

    @property
    def env_steps(self) -> int:
        """Steps taken by the evaluation (not counted as training steps)."""
        return int(sum(self.lengths))


def evaluate(policy: ActingPolicy, env: EnvSpec, episodes: int = 10, seed: int = EVAL_SEED,
             deterministic: bool = True, max_steps: int = 100_000) -> Evaluation:
    """Run ``episodes`` episodes of ``env`` with ``policy`` and return their returns.

    ``deterministic=True`` asks the policy for its greedy / mean action
    (``explore=False``). ``max_steps`` bounds an episode of an env without a limit.
    """
    if episodes < 1:
        raise ValueError(f"episodes must be at least 1, got {episodes}")
    envs = [make_env(env) for _ in range(episodes)]
    try:
        obs = np.stack([e.reset(seed=seed + i)[0] for i, e in enumerate(envs)])
        returns = np.zeros(episodes)
        lengths = np.zeros(episodes, np.int64)
        running = np.ones(episodes, bool)
        for _ in range(max_steps):
            live = np.flatnonzero(running)
            if live.size == 0:
                break
            actions, _ = policy.compute_actions(obs[live], explore=not deterministic)
            for action, i in zip(actions, live):
                next_obs, reward, terminated, truncated, _ = envs[i].step(_native(action))
                returns[i] += reward
                lengths[i] += 1
                obs[i] = next_obs
                if terminated or truncated:
                    running[i] = False
        return Evaluation([float(r) for r in returns], [int(n) for n in lengths])
    finally:
        for e in envs:
            e.close()


def _native(action: Any) -> Any:
    """A numpy scalar action as a Python int (discrete) or the array itself."""
    if isinstance(action, np.ndarray) and action.ndim == 0:
        return action.item()
    if isinstance(action, np.integer):
        return int(action)
    return action
