"""Collect the steps of a vector env into training batches, in one of two modes.

Every step the run loop hands the collector ``obs``, ``actions``, ``rewards``,
``terminated``, ``truncated``, ``next_obs`` (the true next observation: the final
one where an episode ended, not the reset one) and the policy's per-row extras.

``fragments`` (PPO): every ``rollout_length`` vector steps the collector returns
one batch of arrays shaped ``[T, N, ...]`` (time-major, ``N`` members); the
policy's ``postprocess`` sees that layout (so GAE can run over time for all
members at once, bootstrapping from ``next_obs``) and the collector then flattens
every ``[T, N, ...]`` array to ``[T * N, ...]`` before learning.

``episodes`` (policy gradient): each member's steps are kept until its episode
ends; the finished episode (arrays shaped ``[L, ...]``) goes through
``postprocess`` on its own, and once at least ``train_batch_size`` steps of
finished episodes are waiting they are concatenated into one batch.
"""
from __future__ import annotations

import logging
from typing import Callable, Dict, List, Optional

import numpy as np

logger = logging.getLogger(__name__)

Batch = Dict[str, np.ndarray]
STEP_KEYS = ("obs", "actions", "rewards", "terminated", "truncated", "next_obs")


class FragmentCollector:
    """Batches of ``rollout_length`` vector steps (see the module docstring)."""

    def __init__(self, rollout_length: int, postprocess: Callable[[Batch], Batch]) -> None:
        if rollout_length < 1:
            raise ValueError(f"rollout_length must be at least 1, got {rollout_length}")
        self.rollout_length = int(rollout_length)
        self.postprocess = postprocess
        self.steps: Dict[str, list] = {}

    def add(self, step: Dict[str, np.ndarray]) -> Optional[Batch]:
        """Keep one vector step; a postprocessed, flattened batch when one is complete."""
        for key, value in step.items():
            self.steps.setdefault(key, []).append(value)
        if len(self.steps["obs"]) < self.rollout_length:
            return None
        steps, self.steps = self.steps, {}
        batch = {key: np.stack(values) for key, values in steps.items()}
        batch = self.postprocess(batch)
        return flatten_time(batch, self.rollout_length)


def flatten_time(batch: Batch, length: int) -> Batch:
    """``[T, N, ...]`` arrays to ``[T * N, ...]``; arrays of other shapes are dropped."""
    flat = {}
    for key, value in batch.items():
        if value.ndim >= 2 and value.shape[0] == length:
            flat[key] = value.reshape((-1,) + value.shape[2:])
    return flat


class EpisodeCollector:
    """Batches of whole episodes, at least ``train_batch_size`` steps each."""

    def __init__(self, num_envs: int, train_batch_size: int,
                 postprocess: Callable[[Batch], Batch]) -> None:
        if train_batch_size < 1:
            raise ValueError(f"train_batch_size must be at least 1, got {train_batch_size}")
        self.train_batch_size = int(train_batch_size)
        self.postprocess = postprocess
        self.open: List[Dict[str, list]] = [{} for _ in range(num_envs)]
        self.finished: List[Batch] = []
        self.finished_steps = 0

    def add(self, step: Dict[str, np.ndarray]) -> Optional[Batch]:
        """Keep one vector step; a batch once enough finished episodes are waiting."""
        done = step["terminated"] | step["truncated"]
        for member, trajectory in enumerate(self.open):
            for key, value in step.items():
                trajectory.setdefault(key, []).append(value[member])
            if done[member]:
                episode = {key: np.stack(values) for key, values in trajectory.items()}
                self.open[member] = {}
                self.finished.append(self.postprocess(episode))
                self.finished_steps += len(episode["obs"])
        if self.finished_steps < self.train_batch_size:
            return None
        batch = {key: np.concatenate([episode[key] for episode in self.finished])
                 for key in self.finished[0]}
        self.finished, self.finished_steps = [], 0
        return batch
