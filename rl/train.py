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


@dataclass
class Trainee:
    """What a builder returns: the agent, the env it acts in, what to close afterwards."""

    agent: Any
    env: Any = None
    closers: List[Callable[[], None]] = field(default_factory=list)
    eval_env: Any = None  # the env spec evaluations use (default: spec.env), e.g. a wrapped env


ALGORITHMS: Dict[str, Callable[[TrainSpec], Trainee]] = {}


def register(name: str) -> Callable[[Callable[[TrainSpec], Trainee]], Callable[[TrainSpec], Trainee]]:
    """Decorator: register a builder under ``name`` for ``fiberrl train NAME``."""
    def decorate(builder: Callable[[TrainSpec], Trainee]) -> Callable[[TrainSpec], Trainee]:
        ALGORITHMS[name] = builder
        return builder
    return decorate


def algorithm_names() -> List[str]:
    """The names ``fiberrl train`` accepts."""
    from . import builders  # noqa: F401  (registers the built-in algorithms)
    return sorted(ALGORITHMS)


def train(spec: TrainSpec) -> Dict[str, Any]:
    """Run ``spec`` to the end and return the summary (also in ``out/summary.json``)."""
    from .hooks import Evaluate, Progress, TensorBoard
    from .loop import run
    from .outputs import Checkpoint, Summary
    from .stops import AfterSteps, RewardReached

    names = algorithm_names()
    if spec.algo not in ALGORITHMS:
        raise ValueError(f"unknown algorithm {spec.algo!r}; choose one of {', '.join(names)}")
    if spec.total_steps < 1:
        raise ValueError(f"total_steps must be at least 1, got {spec.total_steps}")
    if spec.backend:
        import fiberrl
        fiberrl.init(backend=spec.backend)
    import torch
    torch.set_num_threads(1)  # small networks: threads cost more than they give on few cores
    out = Path(spec.out)
    eval_every = spec.eval_every or max(1, math.ceil(spec.total_steps / 20))
    trainee = ALGORITHMS[spec.algo](spec)
    try:
        from .envs import reward_threshold
        evaluate = Evaluate(trainee.eval_env or spec.env, every_steps=eval_every,
                            episodes=spec.eval_episodes, threshold=reward_threshold(spec.env))
        hooks = [
            Checkpoint(out / "checkpoints", spec.checkpoint_every or eval_every, resume=spec.resume),
            evaluate,
            TensorBoard(out / "tb"),
            Summary(out, evaluate, {"algo": spec.algo, "env": spec.env, "seed": spec.seed,
                                    "workers": spec.workers, "backend": spec.backend,
                                    "settings": _settings(trainee.agent)}),
            Progress(spec.total_steps, description=f"{spec.algo} {spec.env}",
                     disable=None if spec.progress is None else not spec.progress),
        ]
        stop = AfterSteps(spec.total_steps)
        if spec.stop_on_solve and evaluate.threshold is not None:
            stop = stop | RewardReached(evaluate.threshold)
        state = run(trainee.agent, trainee.env, stop, hooks, seed=spec.seed)
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
