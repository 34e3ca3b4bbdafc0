"""The interface of population algorithms (ES and its kin) that :func:`rl.run` drives.

A population algorithm does not act step by step in the learner: each
*generation* it evaluates many perturbed policies (on a ``fiberrl.Pool``) and
updates itself. :func:`rl.run` calls :meth:`PopulationAlgorithm.generation`
until the stop condition holds, and reports every episode and the generation's
statistics to the hooks, exactly as it does for step-driven policies.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Dict, List, Tuple

import numpy as np


@dataclass
class Generation:
    """What one generation did: its training episodes, env steps and statistics."""

    episodes: List[Tuple[float, int]]  # (return, length) of every training episode
    env_steps: int  # env steps of this generation's training episodes
    stats: Dict[str, float] = field(default_factory=dict)  # scalars to log (e.g. "grad_norm")


class PopulationAlgorithm(ABC):
    """A policy improved one generation at a time (see the module docstring)."""

    @abstractmethod
    def generation(self) -> Generation:
        """Evaluate one population and update the policy."""

    @abstractmethod
    def compute_actions(self, obs: np.ndarray, explore: bool = True) -> Tuple[np.ndarray, dict]:
        """Actions of the current (unperturbed) policy for a batch of observations."""

    @abstractmethod
    def state_dict(self) -> dict:
        """Everything needed to resume (parameters, optimizer, counters, RNG state)."""

    @abstractmethod
    def load_state_dict(self, state: dict) -> None:
        """Restore what :meth:`state_dict` returned."""

    def close(self) -> None:
        """Release the pool and any other resources (default: nothing)."""
