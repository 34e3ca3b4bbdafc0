"""Environments: gymnasium envs by id (old-gym-style ones too), a Gridworld with a
known model, and vector envs stepped in this process or in fiberrl processes.

See :mod:`rl.envs.vector` for the vector-env contract every algorithm relies on.
"""
from .gridworld import Gridworld, optimal_q, policy_value
from .make import GRIDWORLD_ID, EnvSpec, OldGymAdapter, clip_action, is_discrete, make_env, reward_threshold
from .remote import ProcessVectorEnv
from .vector import EpisodeTally, InProcessVectorEnv, VectorEnv


def make_vector_env(spec, num_envs: int, seed=None, in_processes: bool = False, **kwargs) -> VectorEnv:
    """``num_envs`` members of ``spec``: in this process, or each in a fiberrl process."""
    cls = ProcessVectorEnv if in_processes else InProcessVectorEnv
    return cls(spec, num_envs, seed=seed, **kwargs)


__all__ = [
    "GRIDWORLD_ID", "EnvSpec", "EpisodeTally", "Gridworld", "InProcessVectorEnv", "OldGymAdapter",
    "ProcessVectorEnv", "VectorEnv", "clip_action", "is_discrete", "make_env", "make_vector_env",
    "optimal_q", "policy_value", "reward_threshold",
]
