"""Parametric-action DQN: Q(s, a) = f(state features, action features), for large or
changing action sets where each state lists its possible actions.

The idea is that of Dulac-Arnold et al. 2015 ("Deep Reinforcement Learning in Large
Discrete Action Spaces", arXiv:1512.07679) and of Horizon/ReAgent's parametric DQN
(Gauci et al. 2018, "Horizon: Facebook's Open Source Applied Reinforcement Learning
Platform", arXiv:1811.00260): actions are inputs of the network, not outputs, so one
network scores any number of actions, including ones never seen in training.

Observations use the flat layout of :mod:`rl.envs.parametric`
(``[state | A_max x K action features | A_max mask]``); the policy's action is a
slot index. Every state's Q-values are ``[B, A_max]``; padded slots are excluded from
exploration, from the greedy choice, from the max / argmax of the target and from the
dueling mean.

- plain: ``Q(s, a) = MLP([pre(s), x_a])``;
- dueling (Wang et al. 2016, with the mean over *possible* actions):
  ``Q(s, a) = V(s) + A(s, a) - mean over possible a' of A(s, a')`` with
  ``V = MLP_v(pre(s))`` and ``A = MLP_a([pre(s), x_a])``.

Everything else (replay, n-step, double-Q, SARSA, targets, epsilon-greedy, the
``update`` batch keys) is :class:`rl.algos.dqn.DQN`'s. Extra config keys (required;
:meth:`rl.envs.parametric.ParametricLayout.policy_config` gives them):
``state_size`` (S), ``max_actions`` (A_max, equals the action space's n),
``action_feature_size`` (K). A ``possible_next_actions`` batch key, when given,
replaces the mask read from ``next_obs``. The ``preprocessor`` applies to the state
part only.

Pitfalls: a state must list at least one action (a row without any bootstraps 0, and
its greedy action is slot 0); each update scores ``B x A_max`` state-action pairs
three times (online, target, double-Q chooser), so cost grows with ``A_max``.
"""
from __future__ import annotations

import logging
from typing import Any, Dict, Optional, Sequence, Tuple

import numpy as np
import torch
from torch import nn

from ..envs.parametric import ParametricLayout
from .dqn import DEFAULTS as DQN_DEFAULTS
from .dqn import DQN, mlp, preprocessor_width

logger = logging.getLogger(__name__)

DEFAULTS: Dict[str, Any] = {
    **DQN_DEFAULTS,
    "state_size": None,            # S: length of the state part of an observation
    "max_actions": None,           # A_max: action slots per state
    "action_feature_size": None,   # K: features per action
}


def _scorer(sizes: Sequence[int]) -> nn.Sequential:
    """An MLP ending in one linear output (a score)."""
    return nn.Sequential(mlp(sizes), nn.Linear(sizes[-1], 1))


class ParametricQNetwork(nn.Module):
    """Scores ``[B, A_max]`` of state ``[B, S]`` with action features ``[B, A_max, K]``."""

    def __init__(self, preprocessor: nn.Module, state_in: int, feature_size: int,
                 hidden: Sequence[int], dueling: bool) -> None:
        super().__init__()
        self.preprocessor = preprocessor
        self.dueling = dueling
        self.pair = _scorer((state_in + feature_size, *hidden))
        if dueling:
            self.value = _scorer((state_in, *hidden))

    def streams(self, state: torch.Tensor, features: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        """Dueling only: value ``[B, 1]`` and raw advantages ``[B, A_max]``."""
        if not self.dueling:
            raise TypeError("streams() exists for the dueling architecture only")
        x = self.preprocessor(state)
        return self.value(x), self._pairs(x, features)

    def _pairs(self, x: torch.Tensor, features: torch.Tensor) -> torch.Tensor:
        expanded = x.unsqueeze(1).expand(-1, features.shape[1], -1)
        return self.pair(torch.cat([expanded, features], dim=2)).squeeze(2)

    def forward(self, state: torch.Tensor, features: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """Q-values ``[B, A_max]`` (padded slots hold meaningless values)."""
        if not self.dueling:
            return self._pairs(self.preprocessor(state), features)
        value, advantage = self.streams(state, features)
        weights = mask.float()
        mean = (advantage * weights).sum(1, keepdim=True) / weights.sum(1, keepdim=True).clamp(min=1.0)
        return value + advantage - mean


class ParametricDQN(DQN):
    """DQN over listed, featurized actions (see the module docstring)."""

    name = "ParametricDQN"
    default_config = DEFAULTS

    def validate_config(self) -> None:
        """DQN's checks plus a layout that matches the spaces."""
        super().validate_config()
        c = self.config
        missing = [k for k in ("state_size", "max_actions", "action_feature_size") if c[k] is None]
        if missing:
            raise ValueError(f"{self.name} needs the observation layout in its config: {missing} "
                             "(ParametricActions(...).layout.policy_config() gives them)")
        self.layout = ParametricLayout(int(c["state_size"]), int(c["max_actions"]),
                                       int(c["action_feature_size"]))
        obs_size = int(np.prod(self.observation_space.shape))
        if obs_size != self.layout.size:
            raise ValueError(f"the layout (state {self.layout.state_size} + {self.layout.max_actions} x "
                             f"{self.layout.feature_size} features + mask) has {self.layout.size} values, "
                             f"the observation space {obs_size}")
        if self.num_actions != self.layout.max_actions:
            raise ValueError(f"max_actions ({self.layout.max_actions}) must equal the action space's "
                             f"n ({self.num_actions})")

    def make_model(self) -> nn.Module:
        """The parametric Q-network (the config is validated first)."""
        self.validate_config()
        width = preprocessor_width(self.preprocessor, (self.layout.state_size,), self.preprocessor_out)
        return ParametricQNetwork(self.preprocessor, width, self.layout.feature_size,
                                  tuple(int(h) for h in self.config["hidden"]),
                                  bool(self.config["dueling"]))

    def q_and_mask(self, net: nn.Module, obs: torch.Tensor) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
        """Scores of every slot and the mask of listed slots, both ``[B, A_max]``."""
        state, features, mask = self.layout.split(obs)
        return net(state, features, mask), mask

    @torch.no_grad()
    def q_values(self, obs: Any) -> torch.Tensor:
        """Q-values ``[B, A_max]`` with ``-inf`` in the slots that list no action."""
        q, mask = self.q_and_mask(self.model, torch.as_tensor(obs, dtype=torch.float32))
        return q.masked_fill(~mask, float("-inf"))

    def random_actions(self, obs: np.ndarray) -> np.ndarray:
        """A uniformly random listed slot per row."""
        _, _, mask = self.layout.split(obs)
        counts = mask.sum(axis=1)
        picks = np.floor(self.generator.random(len(obs)) * np.maximum(counts, 1)).astype(np.int64)
        # the pick-th listed slot of each row
        order = np.argsort(~mask, axis=1, kind="stable")
        return order[np.arange(len(obs)), picks]
