"""Offline (batch) training of a value model on logged transitions, with metrics and
CPE after every epoch, on one rank or several (torch.distributed).

Each epoch::

    for every minibatch of a fresh permutation of this rank's transitions:
        policy.update(batch)                  one gradient step (DDP averages the ranks')
        every target_update_every steps:      policy.update_target()
        keep the rows of the epoch's CPE sample (whole MDPs) as they pass
    at the end (rank 0):  TD loss (mean over the epoch and the ranks), MC loss (Q(s, a)
        against the logged discounted return on the sample), CPE of the softmax policy
        on the sample in its original order, optional evaluation in a gymnasium env,
        then TensorBoard, summary.json and a checkpoint

With several ranks every rank reads its own shard of the Timeline output, takes
``batch_size // world_size`` rows per step, and all ranks take the same number of
steps per epoch (the smallest shard decides), so the ranks together train on global
batches of ``batch_size`` rows.
"""
from __future__ import annotations

import json
import logging
import math
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Optional

import numpy as np
import torch

from .cpe_epoch import evaluate_sample, flat_scalars
from ..outputs import json_safe
from .dataset import OfflineDataset

logger = logging.getLogger(__name__)


@dataclass
class OfflineSettings:
    """How to train offline (one line per setting)."""

    epochs: int = 10                # passes over the data
    batch_size: int = 256           # global rows per gradient step (split across ranks)
    target_update_every: int = 100  # gradient steps between target-network updates
    cpe_mdps: int = 300             # MDPs in each epoch's CPE sample (0: no CPE)
    temperature: float = 0.1        # softmax temperature of the CPE target policy
    n_bootstrap: int = 200          # bootstrap replicates of each CPE estimate
    seed: int = 0
    eval_env: Optional[str] = None  # gymnasium id to evaluate the greedy policy in
    eval_episodes: int = 10
    checkpoint: bool = True         # write a checkpoint every epoch (rank 0)
    resume: bool = False            # continue from the newest checkpoint in out/checkpoints


@dataclass
class EpochReport:
    """What one epoch measured."""

    epoch: int
    td_loss: float
    mc_loss: float
    updates: int
    samples_per_s: float
    cpe: Dict[str, Any] = field(default_factory=dict)
    eval_mean: Optional[float] = None
    eval_std: Optional[float] = None


class LocalBatches:
    """This rank's minibatches: ``steps`` of ``size`` rows per epoch, seeded per rank."""

    def __init__(self, dataset: OfflineDataset, size: int, seed: int, rank: int = 0,
                 steps: Optional[int] = None) -> None:
        if size < 1 or size > len(dataset):
            raise ValueError(f"a minibatch of {size} rows does not fit {len(dataset)} transitions")
        self.dataset, self.size, self.seed, self.rank = dataset, size, seed, rank
        self.steps = steps if steps is not None else len(dataset) // size

    def epoch(self, epoch: int) -> Iterator[np.ndarray]:
        """Row indices of each step of ``epoch``."""
        rng = np.random.default_rng([self.seed, epoch, self.rank])
        for step, rows in enumerate(self.dataset.minibatches(self.size, rng)):
            if step >= self.steps:
                return
            yield rows


class OfflineTrainer:
    """Train ``policy`` (a value-based policy with ``update``/``update_target``) on
    ``dataset``; rank 0 writes ``out``, every rank resumes from its checkpoints (see
    the module docstring)."""

    def __init__(self, policy: Any, dataset: OfflineDataset, settings: OfflineSettings,
                 out: Optional[os.PathLike] = None, rank: int = 0, world_size: int = 1,
                 info: Optional[Dict[str, Any]] = None,
                 acting: Optional[Callable[[Any], Any]] = None) -> None:
        """``acting(policy)`` adapts the policy to the evaluation env's observations
        (default: the policy itself)."""
        if settings.batch_size % world_size:
            raise ValueError(f"batch_size {settings.batch_size} is not divisible by "
                             f"{world_size} ranks")
        self.policy, self.dataset, self.settings = policy, dataset, settings
        self.rank, self.world_size = rank, world_size
        self.out = Path(out) if out is not None else None
        self.info = dict(info or {})
        self.acting = acting or (lambda policy: policy)
        self.reports: List[EpochReport] = []
        self.start_epoch = 0
        self.wall_s = 0.0
        local = settings.batch_size // world_size
        steps = len(dataset) // local
        if world_size > 1:
            steps = self._agree_on_steps(steps)
        self.batches = LocalBatches(dataset, local, settings.seed, rank, steps)
        self.writer: Any = None

    # -- distributed plumbing ------------------------------------------------------
    @staticmethod
    def _agree_on_steps(steps: int) -> int:
        import torch.distributed as dist
        count = torch.tensor([steps], dtype=torch.int64)
        dist.all_reduce(count, op=dist.ReduceOp.MIN)
        return int(count.item())

    def _mean_over_ranks(self, value: float) -> float:
        if self.world_size == 1:
            return value
        import torch.distributed as dist
        tensor = torch.tensor([value], dtype=torch.float64)
        dist.all_reduce(tensor)
        return float(tensor.item()) / self.world_size

    def _wrap_for_ranks(self) -> None:
        if self.world_size > 1:
            self.policy.enable_data_parallel()  # DDP starts every rank from rank 0's weights
            self.policy.update_target(1.0)  # ... and the target from them too

    # -- checkpoints -------------------------------------------------------------------
    def _checkpoint_dir(self) -> Optional[Path]:
        return None if self.out is None else self.out / "checkpoints"

    def _restore(self) -> None:
        directory = self._checkpoint_dir()
        if not (self.settings.resume and directory and directory.is_dir()):
            return
        found = sorted(directory.glob("epoch-*.pt"), key=lambda p: int(p.stem[6:]))
        if not found:
            return
        saved = torch.load(found[-1], map_location="cpu", weights_only=False)
        self.policy.load_state_dict(saved["policy"])
        self.start_epoch = int(saved["epoch"]) + 1
        self.reports = [EpochReport(**r) for r in saved["reports"]]
        self.wall_s = float(saved["wall_s"])
        logger.info("resumed from %s: epoch %d next", found[-1], self.start_epoch)

    def _save(self, epoch: int) -> None:
        directory = self._checkpoint_dir()
        directory.mkdir(parents=True, exist_ok=True)
        state = {"policy": self.policy.state_dict(), "epoch": epoch, "wall_s": self.wall_s,
                 "reports": [asdict(r) for r in self.reports]}
        path = directory / f"epoch-{epoch}.pt"
        tmp = path.with_name(f".{path.name}.tmp")
        torch.save(state, tmp)
        os.replace(tmp, path)
        for old in sorted(directory.glob("epoch-*.pt"), key=lambda p: int(p.stem[6:]))[:-2]:
            old.unlink()

    # -- the loop --------------------------------------------------------------------
    def train(self) -> Dict[str, Any]:
        """Run the remaining epochs; returns the summary (rank 0 also writes it)."""
        self._restore()
        self._wrap_for_ranks()
        if self.rank == 0 and self.out is not None:
            from torch.utils.tensorboard import SummaryWriter
            self.out.mkdir(parents=True, exist_ok=True)
            self.writer = SummaryWriter(str(self.out / "tb"))
        try:
            for epoch in range(self.start_epoch, self.settings.epochs):
                self._epoch(epoch)
        finally:
            if self.writer is not None:
                self.writer.close()
            self.policy.learner_model = self.policy.model  # the process group ends with the run
        return self.summary()

    def _cpe_sample_mask(self, epoch: int) -> np.ndarray:
        mdp_ids = self.dataset.arrays["mdp_ids"]
        if self.rank != 0 or self.settings.cpe_mdps <= 0:
            return np.zeros(len(mdp_ids), bool)
        unique = np.unique(mdp_ids)
        rng = np.random.default_rng([self.settings.seed, epoch, 7919])
        chosen = rng.choice(unique, size=min(len(unique), self.settings.cpe_mdps), replace=False)
        return np.isin(mdp_ids, chosen)

    def _epoch(self, epoch: int) -> None:
        started = time.perf_counter()
        in_sample = self._cpe_sample_mask(epoch)
        kept: List[np.ndarray] = []
        losses: List[float] = []
        updates = 0
        for rows in self.batches.epoch(epoch):
            stats = self.policy.update(self.dataset.take(rows))
            losses.append(stats["td_loss"])
            updates += 1
            if updates % self.settings.target_update_every == 0:
                self.policy.update_target()
            kept.append(rows[in_sample[rows]])
        elapsed = time.perf_counter() - started
        td_loss = self._mean_over_ranks(float(np.mean(losses)) if losses else math.nan)
        samples = updates * self.batches.size * self.world_size
        report = EpochReport(epoch=epoch, td_loss=td_loss, mc_loss=math.nan, updates=updates,
                             samples_per_s=samples / max(elapsed, 1e-9))
        if self.rank == 0:
            self._rank0_epoch_end(report, np.concatenate(kept) if kept else np.zeros(0, int))
        self.wall_s += time.perf_counter() - started
        self.reports.append(report)
        if self.rank == 0:
            self._log(report)
            if self.out is not None:
                if self.settings.checkpoint:
                    self._save(epoch)
                self._write_summary()

    @torch.no_grad()
    def _rank0_epoch_end(self, report: EpochReport, sample: np.ndarray) -> None:
        if len(sample):
            arrays = self.dataset.arrays
            q = self.policy.model(torch.as_tensor(arrays["obs"][sample]))
            taken = q.gather(1, torch.as_tensor(arrays["actions"][sample]).unsqueeze(1)).squeeze(1)
            report.mc_loss = float(((taken - torch.as_tensor(arrays["episode_values"][sample])) ** 2)
                                   .mean())
            report.cpe = evaluate_sample(self.policy, self.dataset, sample, self.settings.temperature,
                                         self.settings.n_bootstrap, seed=self.settings.seed)
        if self.settings.eval_env:
            from ..evaluation import evaluate
            result = evaluate(self.acting(self.policy), self.settings.eval_env,
                              self.settings.eval_episodes)
            report.eval_mean, report.eval_std = result.mean, result.std

    def _log(self, report: EpochReport) -> None:
        dr = report.cpe.get("sequential", {}).get("dr", {}).get("value")
        logger.info("epoch %d: td_loss %.5f, mc_loss %.5f, %.0f samples/s, sequential DR %s, eval %s",
                    report.epoch, report.td_loss, report.mc_loss, report.samples_per_s,
                    "-" if dr is None else f"{dr:.4f}",
                    "-" if report.eval_mean is None else f"{report.eval_mean:.1f}")
        if self.writer is None:
            return
        scalars = {"train/td_loss": report.td_loss, "train/mc_loss": report.mc_loss,
                   "train/samples_per_s": report.samples_per_s, **flat_scalars(report.cpe)}
        if report.eval_mean is not None:
            scalars["eval/mean_return"] = report.eval_mean
        for key, value in scalars.items():
            if math.isfinite(value):
                self.writer.add_scalar(key, value, report.epoch)
        self.writer.flush()

    def summary(self) -> Dict[str, Any]:
        """Settings, per-epoch reports and the last epoch's figures."""
        last = self.reports[-1] if self.reports else None
        return {**self.info, "settings": asdict(self.settings), "world_size": self.world_size,
                "epochs": [asdict(r) for r in self.reports], "wall_s": round(self.wall_s, 3),
                "td_loss": None if last is None else last.td_loss,
                "mc_loss": None if last is None else last.mc_loss,
                "cpe": None if last is None else last.cpe,
                "eval_mean": None if last is None else last.eval_mean,
                "eval_std": None if last is None else last.eval_std}

    def _write_summary(self) -> None:
        text = json.dumps(json_safe(self.summary()), indent=2)
        path = self.out / "summary.json"
        tmp = path.with_name(".summary.json.tmp")
        tmp.write_text(text)
        os.replace(tmp, path)
