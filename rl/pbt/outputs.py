"""A population's files, all written by the controller (members need no shared disk).

Layout of ``--out``::

    summary.json                 the run: best member, its evaluation as eval_mean,
                                 exploits, and ``population`` (every member's final
                                 evaluation, hyperparameters and lineage)
    population.json              the controller's state (rewritten after every event;
                                 --resume reads it)
    population.png               every member's evaluations over env steps, and the best
                                 member's hyperparameter schedule (traced through its exploits)
    policy.pt                    the best member's policy (TorchScript, rl.export)
    members/mNN/checkpoints/     step-N.pt: state, counters and hyperparameters (newest 2)
    members/mNN/tb/              the member's TensorBoard run (train/, learn/, eval/, hp/)
"""
from __future__ import annotations

import logging
import math
import statistics
from pathlib import Path
from typing import Any, Dict, List, Optional

from ..outputs import _replace_atomically, json_safe
from .records import DROPPED, FINISHED, MemberRecord, PopulationState

logger = logging.getLogger(__name__)

KEEP_CHECKPOINTS = 2


def member_dir(index: int) -> str:
    """A member's folder, relative to ``--out``."""
    return f"members/m{index:02d}"


def is_discrete_env(env: Any) -> bool:
    """True when ``env`` (an id or constructor) has a Discrete action space."""
    from ..envs import is_discrete, make_env
    made = make_env(env)
    try:
        return is_discrete(made.action_space)
    finally:
        made.close()


def save_checkpoint(out: Path, member: MemberRecord, checkpoint: Dict[str, Any]) -> str:
    """Write ``checkpoint`` (``policy`` and ``run``) with the member's hyperparameters as
    ``step-N.pt``; keep the newest :data:`KEEP_CHECKPOINTS`. Returns its path relative to
    ``out``."""
    import torch
    directory = out / member_dir(member.index) / "checkpoints"
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"step-{member.env_steps}.pt"
    saved = {**checkpoint, "hyperparameters": dict(member.hyperparameters)}
    _replace_atomically(path, lambda tmp: torch.save(saved, tmp))
    found = sorted((p for p in directory.glob("step-*.pt") if p.stem[5:].isdigit()),
                   key=lambda p: int(p.stem[5:]))
    for old in found[:-KEEP_CHECKPOINTS]:
        old.unlink()
    return str(path.relative_to(out))


def load_checkpoint(path: Path) -> Dict[str, Any]:
    """What :func:`save_checkpoint` wrote."""
    import torch
    return torch.load(path, map_location="cpu", weights_only=False)


class MemberWriters:
    """One TensorBoard run per member; a resumed run discards the events a member will
    write again (those after its newest checkpoint)."""

    def __init__(self, out: Path, members: List[MemberRecord], resumed: bool) -> None:
        # slow to import: do it before the first report waits on it
        from torch.utils.tensorboard import SummaryWriter  # noqa: F401
        self.out, self.members, self.resumed = out, members, resumed
        self.writers: Dict[int, Any] = {}

    def write(self, index: int, scalars: List[tuple], hyperparameters: Dict[str, Any]) -> None:
        """The scalars of one report, and the hyperparameters in force (``hp/KEY``)."""
        writer = self.writers.get(index)
        if writer is None:
            from torch.utils.tensorboard import SummaryWriter
            purge = self.members[index].env_steps if self.resumed else None
            writer = SummaryWriter(str(self.out / member_dir(index) / "tb"), flush_secs=10,
                                   purge_step=purge)
            self.writers[index] = writer
        for tag, step, value in scalars:
            writer.add_scalar(tag, value, step)
        step = self.members[index].env_steps
        for key, value in hyperparameters.items():
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                writer.add_scalar(f"hp/{key}", value, step)

    def close(self) -> None:
        """Flush and close every run."""
        for writer in self.writers.values():
            writer.close()


class PopulationProgress:
    """A progress bar over every member's env steps, showing the best and the median
    latest evaluation and how many members run (tqdm; off when not a terminal)."""

    def __init__(self, state: PopulationState, enabled: Optional[bool]) -> None:
        from tqdm import tqdm
        self.state = state
        total = state.total_steps * len(state.members)
        self.bar = tqdm(total=total, initial=min(total, self._done()), unit="step",
                        unit_scale=True, dynamic_ncols=True,
                        desc=f"{state.algo} x{len(state.members)} {state.env}",
                        disable=None if enabled is None else not enabled)
        self.running = 0

    def _done(self) -> int:
        return sum(min(m.env_steps, self.state.total_steps) for m in self.state.members)

    def reported(self, member: MemberRecord, final: bool) -> None:
        """A member reported: move the bar, log a line."""
        scores = [m.score for m in self.state.members if m.evaluations]
        best, median = max(scores), statistics.median(scores)
        self.bar.update(self._done() - self.bar.n)
        self.bar.set_postfix(best=f"{best:.1f}", median=f"{median:.1f}",
                             running=f"{self.running}/{len(self.state.members)}", refresh=False)
        logger.info("member %d at %d env steps: %.1f%s (population best %.1f, median %.1f, "
                    "%d running)", member.index, member.env_steps, member.score,
                    " (final)" if final else "", best, median, self.running)

    def update(self, running: int) -> None:
        """How many members run now."""
        self.running = running

    def close(self) -> None:
        """Close the bar."""
        self.bar.close()


def best_member(state: PopulationState) -> Optional[MemberRecord]:
    """The finished member with the highest final evaluation (None if none finished)."""
    finished = [m for m in state.members if m.status == FINISHED and m.evaluations]
    return max(finished, key=lambda m: (m.score, -m.index)) if finished else None


def traced_schedule(members: List[MemberRecord], index: int,
                    upto: Optional[int] = None) -> List[List[Any]]:
    """``[[env_steps, values], ...]``: the hyperparameters behind member ``index``'s
    weights, following each exploit back to the donor's schedule before the copy."""
    member = members[index]
    limit = math.inf if upto is None else upto
    copies = [c for c in member.lineage if c["env_steps"] <= limit]
    if not copies:
        return [entry for entry in member.schedule if entry[0] <= limit]
    last = copies[-1]
    before = traced_schedule(members, last["donor"], last["donor_env_steps"])
    before = [entry for entry in before if entry[0] < last["env_steps"]]
    return before + [entry for entry in member.schedule if last["env_steps"] <= entry[0] <= limit]


def plot_population(state: PopulationState, best: Optional[MemberRecord], path: Path,
                    threshold: Optional[float]) -> None:
    """``population.png``: every member's evaluations (exploits marked), and the best
    member's traced hyperparameter schedule, one panel per hyperparameter."""
    import matplotlib
    matplotlib.use("Agg")
    from matplotlib import pyplot as plt
    keys = list(state.search)
    columns = max(1, min(3, len(keys)))
    rows = 1 + math.ceil(len(keys) / columns)
    figure = plt.figure(figsize=(4 * columns + 2, 3.2 * rows), dpi=90)
    grid = figure.add_gridspec(rows, columns)
    axes = figure.add_subplot(grid[0, :])
    for member in state.members:
        if not member.evaluations:
            continue
        steps = [e[0] for e in member.evaluations]
        means = [e[1] for e in member.evaluations]
        is_best = best is not None and member.index == best.index
        label = f"m{member.index}" + (" (best)" if is_best else "") + \
            (" dropped" if member.status == DROPPED else "")
        line, = axes.plot(steps, means, linewidth=2.4 if is_best else 1.0,
                          alpha=1.0 if is_best else 0.7, label=label)
        copies = [c["env_steps"] for c in member.lineage]
        marks = [e for e in member.evaluations if e[0] in copies]
        axes.plot([e[0] for e in marks], [e[1] for e in marks], "x", color=line.get_color())
    if threshold is not None:
        axes.axhline(threshold, color="gray", linestyle="--", linewidth=1)
    mode = "PBT" if state.interval > 0 else "random search"
    axes.set_title(f"{state.algo} on {state.env}: {len(state.members)} members, {mode} "
                   f"(x: exploit)")
    axes.set_xlabel("env steps (each member)")
    axes.set_ylabel("evaluation mean")
    axes.legend(loc="lower right", fontsize=7, ncol=2)
    schedule = traced_schedule(state.members, best.index) if best is not None else []
    for i, key in enumerate(keys):
        panel = figure.add_subplot(grid[1 + i // columns, i % columns])
        points = [(s, v[key]) for s, v in schedule if key in v]
        if points and all(isinstance(v, (int, float)) and not isinstance(v, bool)
                          for _, v in points):
            end = max(state.total_steps, points[-1][0])
            panel.step([p[0] for p in points] + [end], [p[1] for p in points] + [points[-1][1]],
                       where="post")
            if state.search[key].startswith("loguniform"):
                panel.set_yscale("log")
        panel.set_title(f"best member's {key}", fontsize=9)
        panel.set_xlabel("env steps", fontsize=8)
    figure.tight_layout()
    _replace_atomically(path, lambda tmp: figure.savefig(tmp, format="png"))
    plt.close(figure)


def member_summary(member: MemberRecord) -> Dict[str, Any]:
    """One entry of ``summary.json``'s ``population``."""
    final = member.final_eval
    return {"member": member.index, "seed": member.seed, "status": member.status,
            "reason": member.reason, "env_steps": member.env_steps,
            "final_eval": final[1] if final else None,
            "final_eval_std": final[2] if final else None,
            "hyperparameters": member.hyperparameters, "initial_hyperparameters": member.initial,
            "lineage": member.lineage, "restarts": member.restarts, "host": member.host,
            "train_s": round(member.train_s, 3), "cpu_s": round(member.cpu_s, 3),
            "wait_s": round(member.wait_s, 3),
            "curve": [[e[0], e[1]] for e in member.evaluations]}


def finish(out: Path, state: PopulationState, spec: Any, builder: Any,
           latest: Dict[int, Dict[str, Any]], wall_s: float,
           controller_cpu_s: float) -> Dict[str, Any]:
    """Write ``summary.json``, ``population.png`` and the best member's ``policy.pt``;
    return the summary. ``controller_cpu_s``: the controller's own CPU seconds (this run
    of it), the framework's cost next to the members' ``cpu_s``."""
    import json
    from ..envs import reward_threshold
    best = best_member(state)
    threshold = reward_threshold(state.env)
    summary: Dict[str, Any] = {
        "algo": state.algo, "env": state.env, "seed": state.seed,
        "mode": "pbt" if state.interval > 0 else "random_search",
        "population_size": len(state.members), "interval": state.interval,
        "report_every": state.report_every, "quantile": state.quantile,
        "resample_probability": state.resample_probability, "search": state.search,
        "settings": dict(spec.train.overrides), "backend": spec.train.backend,
        "member_steps": state.total_steps,
        "env_steps": sum(m.env_steps for m in state.members),
        "wall_s": round(wall_s, 3),
        "train_s": round(sum(m.train_s for m in state.members), 3),
        "cpu_s": round(sum(m.cpu_s for m in state.members), 3),
        "wait_s": round(sum(m.wait_s for m in state.members), 3),
        "controller_cpu_s": round(controller_cpu_s, 3),
        "best_member": best.index if best else None,
        "eval_mean": best.final_eval[1] if best else None,
        "eval_std": best.final_eval[2] if best else None,
        "eval_episodes": spec.train.eval_episodes,
        "reward_threshold": threshold,
        "solved_at_steps": next((int(e[0]) for e in best.evaluations
                                 if threshold is not None and e[1] >= threshold), None)
        if best else None,
        "curve": [[e[0], e[1]] for e in best.evaluations] if best else [],
        "exploits": state.exploits,
        "dropped": [{"member": m.index, "reason": m.reason} for m in state.members
                    if m.status == DROPPED],
        "population": [member_summary(m) for m in state.members],
        "finished": True,
    }
    if best is not None:
        summary["policy"] = export_best(out, best, spec, builder, latest[best.index])
    text = json.dumps(json_safe(summary), indent=2)
    _replace_atomically(out / "summary.json", lambda tmp: tmp.write_text(text))
    plot_population(state, best, out / "population.png", threshold)
    return summary


def export_best(out: Path, best: MemberRecord, spec: Any, builder: Any,
                checkpoint: Dict[str, Any]) -> Optional[str]:
    """The best member's policy as ``policy.pt`` (None, with a warning, for an agent
    :func:`rl.agent_export.export_agent` does not know)."""
    from dataclasses import replace
    from ..agent_export import export_agent
    member_spec = replace(spec.train, seed=best.seed, workers=0,
                          overrides={**spec.train.overrides, **best.hyperparameters})
    trainee = builder(member_spec)
    try:
        trainee.agent.load_state_dict(checkpoint["policy"])
        try:
            export_agent(trainee.agent, out / "policy.pt")
        except TypeError as error:
            logger.warning("the best member was not exported: %s", error)
            return None
    finally:
        for close in reversed(trainee.closers):
            close()
    return "policy.pt"
