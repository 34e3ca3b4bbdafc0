"""Reinforcement learning on fiberrl: environments, a run loop with hooks, a
functional policy builder, ES and PPO populations (population-based training,
:mod:`rl.pbt`) whose work runs in fiberrl processes on any backend, the DQN family and DDPG/TD3, Horizon's data pipeline
(:mod:`rl.data`), offline training with CPE (:mod:`rl.offline`), data-parallel
ranks (:mod:`rl.distributed`) and exported policies (:mod:`rl.export`, :mod:`rl.serving`).

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
    "ES": "rl.algos.es", "PPO": "rl.algos.ppo", "DQN": "rl.algos.dqn",
    "ParametricDQN": "rl.algos.parametric_dqn", "TD3": "rl.algos.td3", "DDPG": "rl.algos.td3",
    "TrainSpec": "rl.train", "train": "rl.train",
    "hooks": None, "envs": None, "outputs": None, "data": None, "offline": None,
    "distributed": None, "export": None, "serving": None, "pbt": None, "agent_export": None,
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'rl' has no attribute {name!r}")
    module = _EXPORTS[name]
    if module is None:
        return importlib.import_module(f"rl.{name}")
    return getattr(importlib.import_module(module), name)
