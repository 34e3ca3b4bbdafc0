"""Export an agent trained online (PPO, DQN, TD3, DDPG) as one TorchScript file, in
the formats of :mod:`rl.export` (what :func:`rl.serving.load` reads).

Observation index ``i`` is feature ``"i"`` (all present), discrete action ``j`` is
named ``"j"``. What each agent becomes, acting as its deterministic evaluation does:

- PPO, discrete actions: :class:`~rl.export.ExportedPolicy` scoring with the actor's
  logits (the greedy action is the argmax, propensities the softmax);
- PPO, continuous actions: :class:`~rl.export.ExportedActor`, the Gaussian's mean
  clipped to the action space (what the run loop sends the env);
- DQN: :class:`~rl.export.ExportedPolicy` scoring with the Q-values;
- TD3 and DDPG: :class:`~rl.export.ExportedActor` of the actor in env units.
"""
from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Dict, List, Union

import numpy as np
import torch
from torch import nn

logger = logging.getLogger(__name__)


class ClippedMean(nn.Module):
    """A PPO actor's mean clipped into the action space's bounds."""

    def __init__(self, actor: nn.Module, low: np.ndarray, high: np.ndarray) -> None:
        super().__init__()
        self.actor = actor
        self.register_buffer("low", torch.as_tensor(low, dtype=torch.float32).reshape(-1))
        self.register_buffer("high", torch.as_tensor(high, dtype=torch.float32).reshape(-1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Actions ``[B, k]``."""
        return torch.minimum(torch.maximum(self.actor(x), self.low), self.high)


def _features(agent: Any) -> List[str]:
    return [str(i) for i in range(int(np.prod(agent.observation_space.shape)))]


def exported_module(agent: Any) -> nn.Module:
    """The :mod:`rl.export` module for ``agent`` (a copy: later training leaves it as is).

    Raises TypeError for an agent it does not know (parametric DQN, ES, others).
    """
    import copy
    from .algos.dqn import DQN
    from .algos.parametric_dqn import ParametricDQN
    from .algos.td3 import TD3
    from .export import ExportedActor, ExportedPolicy
    features = _features(agent)
    if getattr(agent, "name", None) == "PPO":
        actor = copy.deepcopy(agent.model.actor)
        if agent.discrete:
            actions = [str(a) for a in range(int(agent.action_space.n))]
            return ExportedPolicy(None, actor, actions, features=features)
        space = agent.action_space
        return ExportedActor(None, ClippedMean(actor, space.low, space.high),
                             int(np.prod(space.shape)), features=features)
    if isinstance(agent, DQN) and not isinstance(agent, ParametricDQN):
        from .offline.preprocess import QScorer
        if not isinstance(agent.model.preprocessor, nn.Identity):
            raise TypeError("a DQN with a preprocessor is exported by the offline workflow")
        actions = [str(a) for a in range(agent.num_actions)]
        return ExportedPolicy(None, QScorer(copy.deepcopy(agent.model)), actions, features=features)
    if isinstance(agent, TD3):
        return ExportedActor(None, copy.deepcopy(agent.greedy_actor()), agent.action_size,
                             features=features)
    raise TypeError(f"no export for {type(agent).__name__} agents (PPO, DQN, TD3 and DDPG "
                    "have one)")


def export_agent(agent: Any, path: Union[str, Path]) -> Dict[str, Any]:
    """Write ``agent`` as TorchScript at ``path``; returns the stored metadata."""
    from .export import export_torchscript
    return export_torchscript(exported_module(agent), path)
