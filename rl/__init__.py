"""Reinforcement learning on fiberrl: environments, a run loop with hooks, a
functional policy builder, and ES and PPO populations whose work runs in
fiberrl processes on any backend.

Names are imported lazily so ``import rl`` stays cheap (torch loads on first use).
"""
from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "make_env": "rl.envs", "make_vector_env": "rl.envs", "Gridworld": "rl.envs",
    "run": "rl.loop", "Hook": "rl.loop", "RunState": "rl.loop",
    "Policy": "rl.policy", "build_policy": "rl.policy",
    "evaluate": "rl.evaluation",
    "Stop": "rl.stops", "AfterSteps": "rl.stops", "AfterEpisodes": "rl.stops",
    "AfterIterations": "rl.stops", "AfterSeconds": "rl.stops", "RewardReached": "rl.stops",
    "hooks": None, "envs": None, "outputs": None,
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'rl' has no attribute {name!r}")
    module = _EXPORTS[name]
    if module is None:
        return importlib.import_module(f"rl.{name}")
    return getattr(importlib.import_module(module), name)
