"""The algorithms ``fiberrl train`` knows: what a builder gets and returns, and the table.

A builder (in :mod:`rl.builders` and :mod:`rl.algos`) registers itself with
:func:`register`; :mod:`rl.train` looks algorithms up here. Nothing here imports a
builder, so builders and the trainer do not import each other.
"""
from __future__ import annotations

import logging
import math
import os
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional

logger = logging.getLogger(__name__)


@dataclass
class TrainSpec:
    """What to train, on what, for how long, where to write it."""

    algo: str
    env: str
    out: os.PathLike
    seed: int = 0
    total_steps: int = 100_000
    workers: int = 0          # pool workers (ES) or env processes (PPO); 0: in this process
    num_envs: Optional[int] = None  # envs of step-driven algorithms (default per algorithm)
    backend: Optional[str] = None
    eval_every: Optional[int] = None  # env steps between evaluations (default: total / 20)
    eval_episodes: int = 10
    checkpoint_every: Optional[int] = None  # env steps between checkpoints (default: eval_every)
    resume: bool = False
    stop_on_solve: bool = False  # stop at the first evaluation at or above the threshold
    progress: Optional[bool] = None  # progress bar (default: when stderr is a terminal)
    overrides: Dict[str, Any] = field(default_factory=dict)  # algorithm settings (--set k=v)
    ranks: int = 1                  # data-parallel learner ranks (ppo, td3, ddpg), one process each
    devices: Optional[str] = None   # "cpu" (gloo) or "cuda" (one GPU per rank, NCCL)
    rank_resources: Dict[str, Any] = field(default_factory=lambda: {"mem": "2G"})  # per rank job


@dataclass
class Trainee:
    """What a builder returns: the agent, the env it acts in, what to close afterwards."""

    agent: Any
    env: Any = None
    closers: List[Callable[[], None]] = field(default_factory=list)
    eval_env: Any = None  # the env spec evaluations use (default: spec.env), e.g. a wrapped env


ALGORITHMS: Dict[str, Callable[[TrainSpec], Trainee]] = {}

# Algorithms whose learner can run data-parallel over ranks (the agent has
# ``enable_data_parallel``); the offline DQN family has its own path (rl.offline).
DATA_PARALLEL = ("ppo", "td3", "ddpg")
RANK_SEED_STRIDE = 1000  # rank r steps its envs with seed + r * RANK_SEED_STRIDE


def register(name: str) -> Callable[[Callable[[TrainSpec], Trainee]], Callable[[TrainSpec], Trainee]]:
    """Decorator: register a builder under ``name`` for ``fiberrl train NAME``."""
    def decorate(builder: Callable[[TrainSpec], Trainee]) -> Callable[[TrainSpec], Trainee]:
        ALGORITHMS[name] = builder
        return builder
    return decorate


def step_trainee(spec: TrainSpec, make_agent: Callable[[Any], Any], default_num_envs: int = 1,
                 env_spec: Any = None, **trainee: Any) -> Trainee:
    """A step-driven algorithm's :class:`Trainee`: a vector env of ``spec.num_envs``
    members (default ``default_num_envs``) of ``env_spec`` (default ``spec.env``),
    stepped in this process, or in ``spec.workers`` fiberrl processes when
    ``spec.workers`` > 0; then ``make_agent(env)``. The env is closed if that fails."""
    from .envs import make_vector_env
    num_envs = spec.num_envs or default_num_envs
    env_spec = spec.env if env_spec is None else env_spec
    if spec.workers > 0:
        env = make_vector_env(env_spec, num_envs, seed=spec.seed, in_processes=True,
                              envs_per_process=math.ceil(num_envs / spec.workers))
    else:
        env = make_vector_env(env_spec, num_envs, seed=spec.seed)
    try:
        agent = make_agent(env)
    except BaseException:
        env.close()
        raise
    return Trainee(agent, env, [env.close], **trainee)


