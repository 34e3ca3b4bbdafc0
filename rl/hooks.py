"""Hooks for :func:`rl.run`: evaluation, episode returns, TensorBoard, checkpoints,
a progress bar and the run's output files. Compose them in a list; they run in
list order at every stage (put :class:`Checkpoint` first so that it restores the
run before the others look at it).
"""
from __future__ import annotations

import logging
import math
import os
from pathlib import Path
from typing import Any, Dict, List, Optional

import numpy as np

from .evaluation import EVAL_SEED, evaluate
from .loop import Episode, Hook, RunState

logger = logging.getLogger(__name__)


class Evaluate(Hook):
    """Evaluate the policy every ``every_steps`` training env steps (and at the start
    and the end), deterministic actions over ``episodes`` seeded episodes.

    Each evaluation is appended to ``run.evaluations`` as ``(env_steps, mean, std)``;
    ``threshold`` (default: the env's registered reward threshold) sets
    ``solved_at_steps``, the env steps of the first evaluation at or above it.
    """

    def __init__(self, env: Any, every_steps: int, episodes: int = 10, deterministic: bool = True,
                 seed: int = EVAL_SEED, threshold: Optional[float] = None) -> None:
        if every_steps < 1:
            raise ValueError(f"every_steps must be at least 1, got {every_steps}")
        from .envs import reward_threshold
        self.env, self.every_steps, self.episodes = env, int(every_steps), int(episodes)
        self.deterministic, self.seed = deterministic, seed
        self.threshold = reward_threshold(env) if threshold is None else threshold
        self.next_at = 0
        self.solved_at_steps: Optional[int] = None

    def experiment_pre(self, run: RunState) -> None:
        self.next_at = (run.env_steps // self.every_steps) * self.every_steps
        for steps, mean, _ in run.evaluations:
            self._note_solved(steps, mean)
        if not run.evaluations or run.evaluations[-1][0] < run.env_steps:
            self._evaluate(run)
        else:  # resumed just after an evaluation: the next one is a full interval away
            self.next_at = (run.env_steps // self.every_steps + 1) * self.every_steps

    def act_post(self, run: RunState, step: Dict[str, np.ndarray]) -> None:
        if run.env_steps >= self.next_at:
            self._evaluate(run)

    def learn_post(self, run: RunState, stats: Dict[str, float]) -> None:
        if run.env_steps >= self.next_at:
            self._evaluate(run)

    def experiment_post(self, run: RunState) -> None:
        if not run.evaluations or run.evaluations[-1][0] != run.env_steps:
            self._evaluate(run)

    def _evaluate(self, run: RunState) -> None:
        result = evaluate(run.policy, self.env, self.episodes, self.seed, self.deterministic)
        run.evaluations.append((run.env_steps, result.mean, result.std))
        self._note_solved(run.env_steps, result.mean)
        self.next_at = (run.env_steps // self.every_steps + 1) * self.every_steps
        logger.info("env steps %d: evaluation mean %.2f (std %.2f)", run.env_steps, result.mean, result.std)

    def _note_solved(self, steps: int, mean: float) -> None:
        if self.solved_at_steps is None and self.threshold is not None and mean >= self.threshold:
            self.solved_at_steps = int(steps)


class EpisodeReturns(Hook):
    """Log the mean return of the last ``window`` training episodes every ``every`` episodes."""

    def __init__(self, every: int = 100, window: int = 100) -> None:
        self.every, self.window = int(every), int(window)
        self.returns: List[float] = []

    def episode_post(self, run: RunState, episode: Episode) -> None:
        self.returns.append(episode.ret)
        if run.episodes % self.every == 0:
            recent = self.returns[-self.window:]
            logger.info("episodes %d, env steps %d: mean return of the last %d: %.2f",
                        run.episodes, run.env_steps, len(recent), float(np.mean(recent)))

    @property
    def mean(self) -> float:
        """Mean return of the last ``window`` episodes (nan before any)."""
        recent = self.returns[-self.window:]
        return float(np.mean(recent)) if recent else math.nan


class TensorBoard(Hook):
    """TensorBoard scalars: training episode returns, learning statistics, evaluations."""

    def __init__(self, logdir: os.PathLike, flush_secs: int = 10) -> None:
        self.logdir, self.flush_secs = Path(logdir), flush_secs
        self.writer: Any = None
        self.logged_evaluations = 0

    def experiment_pre(self, run: RunState) -> None:
        from torch.utils.tensorboard import SummaryWriter
        self.writer = SummaryWriter(str(self.logdir), flush_secs=self.flush_secs)
        self.logged_evaluations = len(run.evaluations)

    def episode_post(self, run: RunState, episode: Episode) -> None:
        self.writer.add_scalar("train/episode_return", episode.ret, run.env_steps)
        self.writer.add_scalar("train/episode_length", episode.length, run.env_steps)

    def learn_post(self, run: RunState, stats: Dict[str, float]) -> None:
        for key, value in stats.items():
            self.writer.add_scalar(f"learn/{key}", value, run.env_steps)
        self._log_evaluations(run)

    def act_post(self, run: RunState, step: Dict[str, np.ndarray]) -> None:
        if len(run.evaluations) > self.logged_evaluations:
            self._log_evaluations(run)

    def experiment_post(self, run: RunState) -> None:
        self._log_evaluations(run)
        self.writer.close()

    def _log_evaluations(self, run: RunState) -> None:
        for steps, mean, std in run.evaluations[self.logged_evaluations:]:
            self.writer.add_scalar("eval/mean_return", mean, steps)
            self.writer.add_scalar("eval/std_return", std, steps)
        self.logged_evaluations = len(run.evaluations)


class Progress(Hook):
    """A progress bar over ``total_steps`` env steps (tqdm; off when not a terminal)."""

    def __init__(self, total_steps: int, description: str = "train",
                 disable: Optional[bool] = None) -> None:
        self.total_steps, self.description, self.disable = int(total_steps), description, disable
        self.bar: Any = None

    def experiment_pre(self, run: RunState) -> None:
        from tqdm import tqdm
        self.bar = tqdm(total=self.total_steps, initial=min(run.env_steps, self.total_steps),
                        desc=self.description, unit="step", unit_scale=True, disable=self.disable,
                        dynamic_ncols=True)

    def learn_post(self, run: RunState, stats: Dict[str, float]) -> None:
        self.bar.update(min(run.env_steps, self.total_steps) - self.bar.n)
        if run.evaluations:
            self.bar.set_postfix(eval=f"{run.evaluations[-1][1]:.1f}", refresh=False)

    def experiment_post(self, run: RunState) -> None:
        self.learn_post(run, {})
        self.bar.close()
