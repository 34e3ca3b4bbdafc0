"""A fixed-size ring buffer of continuous-action transitions for off-policy
learners (DDPG, TD3).

Rows are ``(obs, action, reward, next_obs, terminated)``; ``action`` is a float
vector in env units. Arrays are allocated once, at construction, with the shapes
of the first row's spaces; when the buffer is full the oldest rows are
overwritten. :meth:`ContinuousReplay.sample` draws rows uniformly with
replacement using the generator it is given, so the caller owns the randomness
(and its checkpointed state).

Pitfall: ``capacity`` rows of observations are held twice (``obs`` and
``next_obs``), as float32: ``2 * capacity * obs_size * 4`` bytes. Pages are only
touched as rows arrive, so a large capacity on a short run costs little memory.
"""
from __future__ import annotations

import logging
from typing import Dict, Tuple

import numpy as np

logger = logging.getLogger(__name__)


class ContinuousReplay:
    """Ring buffer of ``capacity`` transitions with observations of ``obs_shape``
    and actions of ``action_size`` floats."""

    def __init__(self, capacity: int, obs_shape: Tuple[int, ...], action_size: int) -> None:
        if capacity < 1:
            raise ValueError(f"replay capacity must be at least 1, got {capacity}")
        self.capacity = int(capacity)
        self.obs = np.zeros((self.capacity, *obs_shape), np.float32)
        self.next_obs = np.zeros((self.capacity, *obs_shape), np.float32)
        self.actions = np.zeros((self.capacity, action_size), np.float32)
        self.rewards = np.zeros(self.capacity, np.float32)
        self.terminated = np.zeros(self.capacity, bool)
        self.position = 0  # where the next row goes
        self.size = 0

    def __len__(self) -> int:
        return self.size

    def add(self, obs: np.ndarray, actions: np.ndarray, rewards: np.ndarray,
            next_obs: np.ndarray, terminated: np.ndarray) -> None:
        """Append ``B`` rows (leading dimension ``B`` on every array)."""
        count = len(obs)
        if count > self.capacity:  # only the newest rows would survive anyway
            obs, actions, rewards = obs[-self.capacity:], actions[-self.capacity:], rewards[-self.capacity:]
            next_obs, terminated = next_obs[-self.capacity:], terminated[-self.capacity:]
            count = self.capacity
        index = (self.position + np.arange(count)) % self.capacity
        self.obs[index] = obs
        self.actions[index] = np.asarray(actions, np.float32).reshape(count, -1)
        self.rewards[index] = rewards
        self.next_obs[index] = next_obs
        self.terminated[index] = terminated
        self.position = int((self.position + count) % self.capacity)
        self.size = min(self.capacity, self.size + count)

    def sample(self, batch_size: int, generator: np.random.Generator) -> Dict[str, np.ndarray]:
        """``batch_size`` rows drawn uniformly with replacement."""
        if self.size == 0:
            raise ValueError("cannot sample from an empty replay buffer")
        index = generator.integers(0, self.size, size=batch_size)
        return {"obs": self.obs[index], "actions": self.actions[index],
                "rewards": self.rewards[index], "next_obs": self.next_obs[index],
                "terminated": self.terminated[index]}
