"""A run's files: checkpoints it can resume from, ``summary.json`` and the
learning-curve PNG.

Layout of an output directory::

    DIR/summary.json            algo, env, seed, env_steps, wall_s, eval_mean, eval_std,
                                curve [[env_steps, eval_mean], ...], solved_at_steps, ...
    DIR/curve.png               evaluation mean (± std) against env steps (at the end,
                                and every 30 s of a longer run)
    DIR/checkpoints/step-N.pt   policy state and run counters (the newest ``keep``)
    DIR/tb/                     TensorBoard events (rl.hooks.TensorBoard)

Every file is written to a temporary name and renamed, so a run killed mid-write
leaves the previous complete file, never a torn one.
"""
from __future__ import annotations

import json
import logging
import math
import os
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

from .hooks import Evaluate
from .loop import Hook, RunState

logger = logging.getLogger(__name__)


def _replace_atomically(path: Path, write: Any) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    write(tmp)
    os.replace(tmp, path)


class Checkpoint(Hook):
    """Save the policy and the run's counters every ``every_steps`` env steps and at the end.

    With ``resume=True`` the newest checkpoint in ``directory`` (if any) is loaded in
    ``experiment_pre``: the policy continues where it stopped and the counters, the
    evaluations and the wall time carry on.
    """

    def __init__(self, directory: os.PathLike, every_steps: int, keep: int = 2,
                 resume: bool = False, write: bool = True) -> None:
        """``write=False`` only restores (the other ranks of a data-parallel run)."""
        if every_steps < 1 or keep < 1:
            raise ValueError("every_steps and keep must be at least 1")
        self.directory, self.every_steps, self.keep = Path(directory), int(every_steps), int(keep)
        self.resume, self.write = resume, write
        self.next_at = self.every_steps
        self.resumed_from: Optional[Path] = None

    def checkpoints(self) -> List[Path]:
        """The checkpoints in the directory, oldest first."""
        if not self.directory.is_dir():
            return []
        found = [p for p in self.directory.glob("step-*.pt") if p.stem[5:].isdigit()]
        return sorted(found, key=lambda p: int(p.stem[5:]))

    def experiment_pre(self, run: RunState) -> None:
        if self.write:
            self.directory.mkdir(parents=True, exist_ok=True)
        existing = self.checkpoints()
        if self.resume and existing:
            import torch
            saved = torch.load(existing[-1], map_location="cpu", weights_only=False)
            run.policy.load_state_dict(saved["policy"])
            run.restore(saved["run"])
            self.resumed_from = existing[-1]
            logger.info("resumed from %s at %d env steps", existing[-1], run.env_steps)
        self.next_at = (run.env_steps // self.every_steps + 1) * self.every_steps

    def learn_post(self, run: RunState, stats: Dict[str, float]) -> None:
        if self.write and run.env_steps >= self.next_at:
            self.save(run)

    def experiment_post(self, run: RunState) -> None:
        if self.write:
            self.save(run)

    def save(self, run: RunState) -> Path:
        """Write a checkpoint of the current state now; returns its path."""
        import torch
        path = self.directory / f"step-{run.env_steps}.pt"
        state = {"policy": run.policy.state_dict(), "run": run.counters()}
        _replace_atomically(path, lambda tmp: torch.save(state, tmp))
        for old in self.checkpoints()[:-self.keep]:
            old.unlink()
        self.next_at = (run.env_steps // self.every_steps + 1) * self.every_steps
        return path


class Summary(Hook):
    """Write ``summary.json`` after every evaluation and at the end; ``curve.png`` at
    the end and, during a longer run, at most every ``plot_every_s`` seconds from its
    start: plotting is slow (the first plot ~1 s, matplotlib's import), and a curve
    of the first evaluation alone would stall training for a single point."""

    def __init__(self, directory: os.PathLike, evaluate: Evaluate, info: Dict[str, Any],
                 plot_every_s: float = 30.0) -> None:
        self.directory, self.evaluate, self.info = Path(directory), evaluate, dict(info)
        self.plot_every_s = plot_every_s
        self.written_evaluations = -1
        self.plotted_at = -math.inf

    def experiment_pre(self, run: RunState) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        self.plotted_at = time.monotonic()   # the first plot: plot_every_s in, or the end

    def learn_post(self, run: RunState, stats: Dict[str, float]) -> None:
        if len(run.evaluations) != self.written_evaluations:
            self.write(run, finished=False)

    def experiment_post(self, run: RunState) -> None:
        self.write(run, finished=True)

    def summary(self, run: RunState, finished: bool) -> Dict[str, Any]:
        """The summary as a dict (what ``summary.json`` holds)."""
        last = run.evaluations[-1] if run.evaluations else (run.env_steps, None, None)
        return {
            **self.info,
            "env_steps": run.env_steps,
            "episodes": run.episodes,
            "iterations": run.iterations,
            "wall_s": round(run.wall_s, 3),
            "eval_mean": last[1],
            "eval_std": last[2],
            "eval_episodes": self.evaluate.episodes,
            "reward_threshold": self.evaluate.threshold,
            "solved_at_steps": self.evaluate.solved_at_steps,
            "curve": [[steps, mean] for steps, mean, _ in run.evaluations],
            "finished": finished,
        }

    def write(self, run: RunState, finished: bool) -> None:
        """Write both files now."""
        summary = self.summary(run, finished)
        text = json.dumps(json_safe(summary), indent=2)
        _replace_atomically(self.directory / "summary.json", lambda tmp: tmp.write_text(text))
        if run.evaluations and (finished or time.monotonic() - self.plotted_at >= self.plot_every_s):
            self.plotted_at = time.monotonic()
            plot_curve(run.evaluations, self.directory / "curve.png",
                       title=f"{summary.get('algo', '')} on {summary.get('env', '')}",
                       threshold=self.evaluate.threshold)
        self.written_evaluations = len(run.evaluations)


def json_safe(value: Any) -> Any:
    """``value`` as strict JSON data: NaN and infinities become None, tuples lists,
    paths strings."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    if isinstance(value, Path):
        return str(value)
    return value


def plot_curve(evaluations: List[tuple], path: Path, title: str = "",
               threshold: Optional[float] = None) -> None:
    """A PNG of evaluation mean ± std against env steps."""
    import matplotlib
    matplotlib.use("Agg")
    from matplotlib import pyplot as plt
    steps = [e[0] for e in evaluations]
    means = [e[1] for e in evaluations]
    stds = [e[2] for e in evaluations]
    figure, axes = plt.subplots(figsize=(6, 4), dpi=100)
    axes.plot(steps, means, marker="o", markersize=3, label="evaluation mean")
    axes.fill_between(steps, [m - s for m, s in zip(means, stds)],
                      [m + s for m, s in zip(means, stds)], alpha=0.2)
    if threshold is not None:
        axes.axhline(threshold, color="gray", linestyle="--", linewidth=1, label="reward threshold")
    axes.set_xlabel("env steps")
    axes.set_ylabel("return")
    axes.set_title(title)
    axes.legend(loc="lower right")
    figure.tight_layout()
    _replace_atomically(path, lambda tmp: figure.savefig(tmp, format="png"))
    plt.close(figure)
