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
from pathlib import Path
from typing import Any, Dict, List

# the registry's names stay importable from here, where they used to live
from .registry import (ALGORITHMS, DATA_PARALLEL, RANK_SEED_STRIDE, Trainee,  # noqa: F401
                       TrainSpec, register, step_trainee)

logger = logging.getLogger(__name__)


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
    for name in ("num_envs", "eval_every", "checkpoint_every"):   # None: the default
        value = getattr(spec, name)
        if value is not None and value < 1:
            raise ValueError(f"{name} must be at least 1, got {value}")
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
