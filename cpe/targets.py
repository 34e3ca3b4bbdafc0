"""Target policies for ``fiberrl cpe evaluate --target-policy``: the probabilities the
evaluated policy gives every action in every logged row.

- ``uniform``: uniform over the row's ``possible_actions`` when logged, else over all
  actions.
- a file ``policy.pt`` (TorchScript) or ``policy.onnx`` exported by ``fiberrl workflow
  train`` or :mod:`rl.export`: its softmax propensities ``softmax(scores / temperature)``
  on the row's ``state_features`` (read with :func:`rl.serving.load`; needs the ``rl``
  extra, and ``export`` for ONNX). This answers Horizon's question: how would this
  trained policy have done on the logged data?
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Sequence

import numpy as np

logger = logging.getLogger(__name__)

UNIFORM = "uniform"


def uniform_probs(n: int, action_names: Sequence[str], possible: list | None) -> np.ndarray:
    """``(n, K)`` uniform probabilities, over each row's possible actions when given."""
    k = len(action_names)
    if possible is None:
        return np.full((n, k), 1.0 / k)
    index = {name: j for j, name in enumerate(action_names)}
    probs = np.zeros((n, k))
    for i, row in enumerate(possible):
        names = [str(a) for a in row] if row else list(action_names)
        for name in names:
            if name not in index:
                raise ValueError(f"possible_actions: action {name!r} of row index {i} is not "
                                 f"one of {list(action_names)}")
            probs[i, index[name]] = 1.0 / len(names)
    return probs


def load_policy(path: str | Path) -> Any:
    """An exported policy's predictor (:func:`rl.serving.load`)."""
    try:
        from rl.serving import load
    except ImportError as exc:
        raise ValueError(f"--target-policy {path}: reading an exported policy needs fiberrl's "
                         f"rl extra: pip install 'fiberrl[rl]' ({exc})") from None
    try:
        return load(path)
    except ImportError as exc:
        raise ValueError(f"--target-policy {path}: {exc} (pip install 'fiberrl[export]' for "
                         "ONNX files)") from None


def policy_probs(predictor: Any, features: list, action_names: list,
                 temperature: float) -> tuple[np.ndarray, list]:
    """``(n, K)`` softmax propensities of ``predictor`` on ``features`` (one map per row),
    and the action names of the columns: ``action_names`` followed by any action the
    policy knows and the data never logged."""
    names = list(action_names)
    policy_names = [str(a) for a in (predictor.action_names or [])]
    names += [a for a in policy_names if a not in names]
    unknown = [a for a in action_names if a not in policy_names]
    if unknown:
        raise ValueError(f"--target-policy: the policy's actions {policy_names} lack the logged "
                         f"actions {unknown}")
    index = {name: j for j, name in enumerate(names)}
    probs = np.zeros((len(features), len(names)))
    batch = 4096
    for start in range(0, len(features), batch):
        rows = [{str(k): v for k, v in (row or {}).items()} for row in features[start:start + batch]]
        for i, prediction in enumerate(predictor.predict(rows, temperature=temperature,
                                                         ignore_unknown=True)):
            for name, p in prediction.propensities.items():
                probs[start + i, index[str(name)]] = p
    return probs, names
