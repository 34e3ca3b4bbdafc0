"""Population-based training (Jaderberg et al. 2017) of any step-driven algorithm on
fiberrl: each member a fiberrl process on whichever backend is configured.

- :mod:`rl.pbt.space` — search spaces, ``--search`` specs, explore;
- :mod:`rl.pbt.records` — the controller's state (``population.json``) and exploit;
- :mod:`rl.pbt.member` — a member's process and its messages;
- :mod:`rl.pbt.controller` — :func:`train_population`, the master's loop;
- :mod:`rl.pbt.outputs` — summary.json, population.png, TensorBoard, checkpoints, policy.pt.

Names are imported lazily so ``import rl.pbt`` stays cheap.
"""
from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "PopulationSpec": "rl.pbt.controller", "train_population": "rl.pbt.controller",
    "PopulationFailedError": "rl.pbt.controller", "MEMBER_SEED_STRIDE": "rl.pbt.controller",
    "parse_search": "rl.pbt.space", "default_space": "rl.pbt.space", "explore": "rl.pbt.space",
    "LogUniform": "rl.pbt.space", "Uniform": "rl.pbt.space", "IntRange": "rl.pbt.space",
    "Choice": "rl.pbt.space",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'rl.pbt' has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name]), name)
