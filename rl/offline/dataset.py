"""Timeline output as training transitions for offline (batch) RL.

:class:`OfflineDataset` holds one rank's transitions as numpy arrays in the layout
the value-based policies' ``update(batch)`` takes:

- ``obs`` / ``next_obs``: float32 ``[N, F]`` raw state features in ``features``
  order, **NaN where a feature is missing** (the model's :class:`MaskedNormalizer`
  turns NaN into "absent"; terminal rows' ``next_obs`` is all NaN and never used);
- ``actions``, ``next_actions`` (int64, -1 on terminal rows), ``rewards``;
- ``terminated``: the Timeline's terminal flag (the last row of an MDP);
- ``discounts``: ``gamma ** time_diff``, the discount over the sequence-number gap to
  the next row (duplicates: ``time_diff`` 0, discount 1), as Horizon does;
- ``possible_next_actions`` (bool ``[N, A]``) when possible actions were logged;
- for CPE and metrics: ``mdp_ids`` (str), ``ordinals`` (1, 2, ... within the MDP),
  ``propensities`` (the logged action probability), ``episode_values`` (the
  discounted Monte Carlo return from the row, for the MC loss).
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Iterator, Optional, Sequence, Tuple

import numpy as np

logger = logging.getLogger(__name__)

UPDATE_KEYS = ("obs", "actions", "rewards", "next_obs", "terminated", "discounts",
               "next_actions", "possible_next_actions")


@dataclass
class OfflineDataset:
    """One rank's transitions (see the module docstring for the arrays)."""

    arrays: Dict[str, np.ndarray]
    features: Sequence[str]
    action_names: Sequence[str]
    gamma: float

    @classmethod
    def from_timeline(cls, directory: Path, gamma: float, features: Optional[Sequence[str]] = None,
                      action_names: Optional[Sequence[str]] = None,
                      shard: Tuple[int, int] = (0, 1)) -> "OfflineDataset":
        """Read a Timeline output (only ``shard = (rank, world_size)``'s output shards)."""
        from ..data import read_transitions
        data = read_transitions(directory, state_features=features, action_names=action_names,
                                shard=shard)
        if "action_names" not in data:
            raise ValueError(f"{directory}: offline training here needs discrete actions "
                             "(the logged actions are feature maps)")
        obs = np.where(data["state_present"], data["state"], np.nan).astype(np.float32)
        next_obs = np.where(data["next_state_present"], data["next_state"], np.nan).astype(np.float32)
        arrays = {
            "obs": obs, "next_obs": next_obs,
            "actions": data["action"], "next_actions": data["next_action"],
            "rewards": data["reward"].astype(np.float32),
            "terminated": data["terminal"],
            "discounts": np.power(gamma, data["time_diff"]).astype(np.float32),
            "mdp_ids": data["mdp_id"].astype(str), "ordinals": data["sequence_number_ordinal"],
            "propensities": data["action_probability"],
            "episode_values": data["episode_value"].astype(np.float32),
        }
        if "possible_next_actions" in data:
            arrays["possible_next_actions"] = data["possible_next_actions"]
        logger.info("read %d transitions of %d MDPs from %s (shard %d of %d)", len(obs),
                    len(set(data["mdp_id"])), directory, shard[0], shard[1])
        return cls(arrays, [str(f) for f in data["state_features"]],
                   [str(a) for a in data["action_names"]], float(gamma))

    def __len__(self) -> int:
        return len(self.arrays["obs"])

    def take(self, rows: np.ndarray) -> Dict[str, np.ndarray]:
        """The ``update`` batch of ``rows``."""
        return {key: self.arrays[key][rows] for key in UPDATE_KEYS if key in self.arrays}

    def minibatches(self, batch_size: int, rng: np.random.Generator,
                    drop_last: bool = True) -> Iterator[np.ndarray]:
        """Row indices of one epoch: a fresh permutation cut into ``batch_size`` pieces."""
        if batch_size < 1:
            raise ValueError(f"batch_size must be at least 1, got {batch_size}")
        order = rng.permutation(len(self))
        stop = len(order) - (len(order) % batch_size if drop_last else 0)
        for start in range(0, stop, batch_size):
            yield order[start:start + batch_size]

    def episode_rows(self, rows: np.ndarray) -> np.ndarray:
        """``rows`` in their original order: by MDP, then by position in the MDP."""
        keys = np.lexsort((self.arrays["ordinals"][rows], self.arrays["mdp_ids"][rows]))
        return rows[keys]
