"""Vector environments: N copies of an env stepped as one, in this process.

Every vector env in ``rl`` (this one and :class:`rl.envs.ProcessVectorEnv`) has
the same contract, which the algorithms rely on:

- ``reset(seed=None) -> obs`` with ``obs`` stacked, shape ``(num_envs, *obs_shape)``.
  Member ``i`` is seeded with ``seed + i`` (the constructor's seed when none given).
- ``step(actions) -> (obs, rewards, terminated, truncated, info)``; arrays of length
  ``num_envs``. A member whose episode ends is **reset in the same step**: ``obs[i]``
  is then the first observation of its next episode, and the true last observation
  is ``info["final_obs"][i]`` (needed to bootstrap a truncated episode). This
  differs from gymnasium 1.x's vector envs, which reset on the *next* step and so
  return a step that is not a transition; here every step is one.
- ``info["episodes"]``: a list of ``(member, return, length)`` for every episode that
  ended in this step; the vector env keeps the tallies so algorithms need not.
- ``close()``; also a context manager.
"""
from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from .make import EnvSpec, make_env

logger = logging.getLogger(__name__)

StepResult = Tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, Dict[str, Any]]


class EpisodeTally:
    """Running return and length of each member's current episode."""

    def __init__(self, num_envs: int) -> None:
        self.returns = np.zeros(num_envs, np.float64)
        self.lengths = np.zeros(num_envs, np.int64)

    def add(self, rewards: np.ndarray, done: np.ndarray) -> List[Tuple[int, float, int]]:
        """Count one step; returns ``(member, return, length)`` of the episodes that ended."""
        self.returns += rewards
        self.lengths += 1
        if not done.any():
            return []
        ended = []
        for i in np.flatnonzero(done):
            ended.append((int(i), float(self.returns[i]), int(self.lengths[i])))
            self.returns[i] = 0.0
            self.lengths[i] = 0
        return ended


class VectorEnv(ABC):
    """The vector-env interface (see the module docstring) and its context manager."""

    num_envs: int
    observation_space: Any
    action_space: Any

    @abstractmethod
    def reset(self, seed: Optional[int] = None) -> np.ndarray:
        """Reset every member; see the module docstring."""

    @abstractmethod
    def step(self, actions: Sequence[Any]) -> StepResult:
        """Step every member; see the module docstring."""

    @abstractmethod
    def close(self) -> None:
        """Release the members."""

    def processes_here(self) -> int:
        """How many processes step members on this machine's cores, beside the caller
        (0: the members step in the caller's process, or on other machines)."""
        return 0

    def __enter__(self) -> "VectorEnv":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class InProcessVectorEnv(VectorEnv):
    """``num_envs`` copies of ``spec`` stepped in a loop in this process (cheap envs)."""

    def __init__(self, spec: EnvSpec, num_envs: int, seed: Optional[int] = None, **kwargs: Any) -> None:
        if num_envs < 1:
            raise ValueError(f"num_envs must be at least 1, got {num_envs}")
        self.num_envs = int(num_envs)
        self.seed = seed
        self.envs = [make_env(spec, **kwargs) for _ in range(self.num_envs)]
        self.observation_space = self.envs[0].observation_space
        self.action_space = self.envs[0].action_space
        self._tally = EpisodeTally(self.num_envs)

    def reset(self, seed: Optional[int] = None) -> np.ndarray:
        """Reset every member (member ``i`` with ``seed + i``)."""
        seed = self.seed if seed is None else seed
        observations = []
        for i, env in enumerate(self.envs):
            obs, _ = env.reset(seed=None if seed is None else seed + i)
            if seed is not None:
                env.action_space.seed(seed + i)
            observations.append(obs)
        self._tally = EpisodeTally(self.num_envs)
        return np.stack(observations)

    def step(self, actions: Sequence[Any]) -> StepResult:
        """Step every member, resetting those whose episode ended (same step)."""
        if len(actions) != self.num_envs:
            raise ValueError(f"expected {self.num_envs} actions, got {len(actions)}")
        observations, rewards = [], np.zeros(self.num_envs, np.float64)
        terminated = np.zeros(self.num_envs, bool)
        truncated = np.zeros(self.num_envs, bool)
        final_obs = None
        for i, (env, action) in enumerate(zip(self.envs, actions)):
            obs, reward, term, trunc, _ = env.step(action)
            rewards[i], terminated[i], truncated[i] = reward, term, trunc
            if term or trunc:
                if final_obs is None:
                    final_obs = [None] * self.num_envs
                final_obs[i] = obs
                obs, _ = env.reset()
            observations.append(obs)
        done = terminated | truncated
        info: Dict[str, Any] = {"episodes": self._tally.add(rewards, done)}
        if final_obs is not None:
            info["final_obs"] = final_obs
        return np.stack(observations), rewards, terminated, truncated, info

    def close(self) -> None:
        """Close every member."""
        for env in self.envs:
            env.close()
