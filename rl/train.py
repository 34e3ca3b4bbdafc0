"""Train an algorithm on an env and write its outputs: what ``fiberrl train`` runs.

    spec = TrainSpec(algo="ppo", env="CartPole-v1", seed=0, total_steps=150_000, out="runs/ppo")
    summary = train(spec)

Each algorithm registers a *builder* in :data:`ALGORITHMS`: a function from the
:class:`TrainSpec` to a :class:`Trainee` (the policy or population algorithm, the
env the run loop steps, and what to close afterwards). :func:`train` then runs it
with the same hooks for every algorithm: checkpoints (resumable), evaluation,
TensorBoard, a progress bar and ``summary.json`` with the learning-curve PNG.
"""
from __future__ import annotations

import logging
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
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


def algorithm_names() -> List[str]:
    """The names ``fiberrl train`` accepts."""
    from . import builders  # noqa: F401  (registers the built-in algorithms)
    return sorted(ALGORITHMS)


def train(spec: TrainSpec) -> Dict[str, Any]:
    """Run ``spec`` to the end and return the summary (also in ``out/summary.json``).

    With ``spec.ranks > 1`` (PPO, TD3, DDPG) every rank is a fiberrl process (:mod:`rl.distributed`)
    stepping its own envs (seeds offset by ``RANK_SEED_STRIDE`` per rank); gradients are
    averaged over the ranks; rank 0 evaluates and writes the outputs; every rank resumes
    from the checkpoints. ``env_steps`` counts the steps of all ranks.
    """
    names = algorithm_names()
    if spec.algo not in ALGORITHMS:
        raise ValueError(f"unknown algorithm {spec.algo!r}; choose one of {', '.join(names)}")
    if spec.total_steps < 1:
        raise ValueError(f"total_steps must be at least 1, got {spec.total_steps}")
    if spec.backend:
        import fiberrl
        fiberrl.init(backend=spec.backend)
    if spec.ranks > 1:
        if spec.algo not in DATA_PARALLEL:
            raise ValueError(f"--ranks > 1 is available for {', '.join(DATA_PARALLEL)} (and the "
                             f"offline workflow's [training] ranks), not {spec.algo!r}")
        if spec.stop_on_solve:
            raise ValueError("--stop-on-solve cannot be used with --ranks > 1 (only rank 0 "
                             "evaluates, so the ranks would disagree on when to stop)")
        from .distributed import launch
        return launch(_train_rank, spec.ranks, args=(spec,), devices=spec.devices,
                      resources=spec.rank_resources)[0]
    return _train_rank(None, spec)


def _train_rank(ctx: Any, spec: TrainSpec) -> Dict[str, Any]:
    """One rank of :func:`train` (``ctx`` None: the only rank, in this process)."""
    from dataclasses import replace
    from .hooks import Evaluate, Progress, TensorBoard
    from .loop import run
    from .outputs import Checkpoint, Summary
    from .stops import AfterSteps, RewardReached
    import torch
    torch.set_num_threads(1)  # small networks: threads cost more than they give on few cores
    rank, ranks = (0, 1) if ctx is None else (ctx.rank, ctx.world_size)
    algorithm_names()  # a rank is a fresh process: register the built-in algorithms
    out = Path(spec.out)
    eval_every = spec.eval_every or max(1, math.ceil(spec.total_steps / 20))
    trainee = ALGORITHMS[spec.algo](replace(spec, seed=spec.seed + rank * RANK_SEED_STRIDE))
    try:
        if ranks > 1:
            trainee.agent.enable_data_parallel(ctx.device)
        checkpoint = Checkpoint(out / "checkpoints", spec.checkpoint_every or eval_every,
                                resume=spec.resume, write=rank == 0)
        if rank > 0:  # restore like rank 0, then only learn in step with it
            return run(trainee.agent, trainee.env, AfterSteps(spec.total_steps), [checkpoint],
                       seed=spec.seed + rank * RANK_SEED_STRIDE, ranks=ranks).counters()
        from .envs import reward_threshold
        evaluate = Evaluate(trainee.eval_env or spec.env, every_steps=eval_every,
                            episodes=spec.eval_episodes, threshold=reward_threshold(spec.env))
        hooks = [
            checkpoint,
            evaluate,
            TensorBoard(out / "tb"),
            Summary(out, evaluate, {"algo": spec.algo, "env": spec.env, "seed": spec.seed,
                                    "workers": spec.workers, "backend": spec.backend,
                                    "ranks": ranks,
                                    "settings": _settings(trainee.agent)}),
            Progress(spec.total_steps, description=f"{spec.algo} {spec.env}",
                     disable=None if spec.progress is None else not spec.progress),
        ]
        stop = AfterSteps(spec.total_steps)
        if spec.stop_on_solve and evaluate.threshold is not None:
            stop = stop | RewardReached(evaluate.threshold)
        state = run(trainee.agent, trainee.env, stop, hooks, seed=spec.seed, ranks=ranks)
        return hooks[3].summary(state, finished=True)
    finally:
        for close in reversed(trainee.closers):
            close()


def _settings(agent: Any) -> Dict[str, Any]:
    """The agent's settings as JSON-friendly values."""
    settings = getattr(agent, "config", None)
    if settings is None and hasattr(agent, "settings"):
        settings = agent.settings()
    return {k: (list(v) if isinstance(v, tuple) else v) for k, v in (settings or {}).items()
            if isinstance(v, (int, float, str, bool, tuple, list, type(None)))}
