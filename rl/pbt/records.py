"""What the controller knows about a population, kept as plain JSON data in
``population.json`` (rewritten atomically after every event, so ``--resume`` continues
from it), and PBT's exploit rule.

Exploit (Jaderberg et al. 2017, arXiv:1711.09846, section 3, *truncation selection*):
when a member reports, the members that have reported are ranked by their latest
evaluation; one in the bottom ``quantile`` copies a member drawn uniformly from the top
``quantile``, provided the donor's evaluation is strictly better (so tied members,
e.g. several at CartPole's cap of 500, leave each other alone). Ranking uses each
member's *latest* evaluation whatever its step count: members run asynchronously, as
in Ray Tune's asynchronous PBT scheduler.
"""
from __future__ import annotations

import json
import logging
import math
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional

import numpy as np

logger = logging.getLogger(__name__)

RUNNING, FINISHED, DROPPED = "running", "finished", "dropped"


@dataclass
class MemberRecord:
    """One member: its settings over time, evaluations, exploits and fate."""

    index: int
    seed: int
    hyperparameters: Dict[str, Any]            # in force now
    initial: Dict[str, Any]                    # drawn at the start
    env_steps: int = 0                         # at its latest report
    evaluations: List[List[float]] = field(default_factory=list)  # [env_steps, mean, std, wall_s]
    schedule: List[List[Any]] = field(default_factory=list)       # [env_steps, {values}] changes
    lineage: List[Dict[str, Any]] = field(default_factory=list)   # its exploits, in order
    status: str = RUNNING
    reason: Optional[str] = None               # why it was dropped
    restarts: int = 0                          # times its process died and was restarted
    deaths_in_a_row: int = 0                   # deaths since its last report
    checkpoint: Optional[str] = None           # its newest checkpoint file (relative to out)
    host: Optional[str] = None
    pid: Optional[int] = None
    train_s: float = 0.0                       # seconds its processes spent training
    cpu_s: float = 0.0                         # CPU seconds of training and evaluation
    wait_s: float = 0.0                        # seconds they spent waiting for the controller

    @property
    def score(self) -> float:
        """The latest evaluation mean (-inf before any, and for NaN)."""
        if not self.evaluations:
            return -math.inf
        value = self.evaluations[-1][1]
        return -math.inf if value is None or math.isnan(value) else float(value)

    @property
    def final_eval(self) -> Optional[List[float]]:
        """``[env_steps, mean, std]`` of its last evaluation, or None."""
        return self.evaluations[-1] if self.evaluations else None


@dataclass
class PopulationState:
    """The controller's state: settings, members, exploits, its random generator."""

    algo: str
    env: str
    seed: int
    total_steps: int                           # per member
    interval: int                              # env steps between exploit decisions (0: none)
    report_every: int
    quantile: float
    resample_probability: float
    search: Dict[str, str]                     # key -> spec
    members: List[MemberRecord]
    exploits: int = 0
    wall_s: float = 0.0                        # wall time of earlier (resumed) controller runs
    rng: Dict[str, Any] = field(default_factory=dict)  # numpy bit generator state

    def to_json(self) -> Dict[str, Any]:
        """Plain data for ``population.json``."""
        return asdict(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "PopulationState":
        """Read what :meth:`to_json` wrote."""
        fields = dict(data)
        fields["members"] = [MemberRecord(**m) for m in data["members"]]
        return cls(**fields)

    def save(self, path: Path) -> None:
        """Write atomically (a temporary file renamed over ``path``)."""
        from ..outputs import json_safe
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text(json.dumps(json_safe(self.to_json()), indent=1))
        os.replace(tmp, path)

    @classmethod
    def load(cls, path: Path) -> "PopulationState":
        """Read ``population.json``."""
        return cls.from_json(json.loads(path.read_text()))


def truncation_selection(index: int, members: List[MemberRecord], quantile: float,
                         rng: np.random.Generator) -> Optional[int]:
    """The donor member ``index`` should copy, or None (see the module docstring).

    ``members``: the whole population; those without an evaluation and those dropped
    take no part. With ``n`` ranked members, the top and bottom quantiles hold
    ``ceil(n * quantile)`` each, at most ``n // 2``.
    """
    ranked = sorted((m for m in members if m.evaluations and m.status != DROPPED),
                    key=lambda m: (m.score, -m.index))
    count = min(len(ranked) // 2, math.ceil(len(ranked) * quantile))
    if count < 1:
        return None
    bottom, top = ranked[:count], ranked[-count:]
    me = next((m for m in bottom if m.index == index), None)
    if me is None:
        return None
    donor = top[int(rng.integers(len(top)))]
    return donor.index if donor.score > me.score else None
