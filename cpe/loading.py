"""Logged columns (:mod:`cpe.io`) to a validated :class:`~cpe.data.BanditLog` or
:class:`~cpe.data.Trajectories`: actions mapped to indices, target probabilities from
the file or a target policy (:mod:`cpe.targets`), and validation errors re-worded to
name the file's field and 1-based line."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np

from cpe import targets
from cpe.data import BanditLog, DataError, Trajectories
from cpe.io import BANDIT_REQUIRED, PROPENSITY, TRAJECTORY_REQUIRED, Where, read_columns

logger = logging.getLogger(__name__)

#: argument name of the containers -> the field name in files
FILE_FIELDS = {"actions": "action", "rewards": "reward", "logged_propensities": PROPENSITY,
               "target_probs": "target_probs", "reward_estimates": "reward_estimates",
               "q_estimates": "q_estimates", "mdp_ids": "mdp_id",
               "sequence_numbers": "sequence_number"}


def _matrix(field: str, values: Any) -> np.ndarray:
    """Stack a list column into an ``(N, K)`` float array, rejecting ragged rows."""
    if isinstance(values, np.ndarray):
        return values
    lengths = {len(v) if isinstance(v, (list, tuple)) else -1 for v in values}
    if -1 in lengths:
        raise ValueError(f"{field}: every record needs a list of numbers")
    if len(lengths) > 1:
        raise ValueError(f"{field}: lists have different lengths {sorted(lengths)}")
    return np.asarray(values, dtype=np.float64)


def _actions(columns: dict[str, Any]) -> tuple[np.ndarray, list[str] | None]:
    """Action indices, and the names in index order when actions are names."""
    raw = list(columns["action"])
    if not any(isinstance(a, str) for a in raw):
        return np.asarray(raw), None
    names = list(columns.get("_action_names") or [])
    for a in sorted({str(a) for a in raw} - set(names)):
        names.append(a)
    index = {name: j for j, name in enumerate(names)}
    return np.asarray([index[str(a)] for a in raw], dtype=np.int64), names


def _target_probs(columns: dict[str, Any], actions: np.ndarray, names: list[str] | None,
                  target_policy: str | None, temperature: float) -> np.ndarray:
    n = len(actions)
    if target_policy is None:
        if "target_probs" not in columns:
            raise ValueError("missing field 'target_probs': give it in the data, or name the "
                             "policy to evaluate with --target-policy (uniform or an exported "
                             "policy.pt/policy.onnx)")
        return _matrix("target_probs", columns["target_probs"])
    if names is None:
        width = int(actions.max()) + 1
        names = [str(j) for j in range(width)]
    possible = columns.get("possible_actions")
    if target_policy == targets.UNIFORM:
        return targets.uniform_probs(n, names, possible)
    if "state_features" not in columns:
        raise ValueError("--target-policy with a policy file needs the field 'state_features'")
    predictor = targets.load_policy(target_policy)
    probs, all_names = targets.policy_probs(predictor, columns["state_features"], names,
                                            temperature)
    names.extend(all_names[len(names):])
    return probs


def columns_to_data(columns: dict[str, Any], gamma: float | None = None, where: Where | None = None,
                    target_policy: str | None = None, temperature: float = 1.0
                    ) -> BanditLog | Trajectories:
    """Build a :class:`BanditLog` or (with ``mdp_id``) :class:`Trajectories`."""
    trajectories = "mdp_id" in columns
    required = TRAJECTORY_REQUIRED if trajectories else BANDIT_REQUIRED
    place = str(where.path) if where is not None else "input"
    missing = [f for f in required if f not in columns]
    if missing:
        raise ValueError(f"{place}: missing required field(s) {', '.join(map(repr, missing))}")
    try:
        actions, names = _actions(columns)
        common = dict(actions=actions, rewards=np.asarray(columns["reward"]),
                      logged_propensities=np.asarray(columns[PROPENSITY]),
                      target_probs=_target_probs(columns, actions, names, target_policy,
                                                 temperature))
        if not trajectories:
            if gamma is not None:
                logger.warning("gamma is ignored for bandit logs")
            estimates = columns.get("reward_estimates")
            return BanditLog(**common, reward_estimates=None if estimates is None
                             else _matrix("reward_estimates", estimates))
        q_values = columns.get("q_estimates")
        ids = columns["mdp_id"]
        if not isinstance(ids, np.ndarray):
            mixed = len({type(v) for v in ids}) > 1
            ids = np.asarray([str(v) for v in ids]) if mixed else np.asarray(ids)
        if gamma is None:
            gamma = columns.get("_gamma")
        return Trajectories(mdp_ids=ids, sequence_numbers=np.asarray(columns["sequence_number"]),
                            q_estimates=None if q_values is None
                            else _matrix("q_estimates", q_values),
                            gamma=1.0 if gamma is None else gamma, **common)
    except DataError as error:
        raise ValueError(_reword(error, where, place)) from None
    except ValueError as error:
        raise ValueError(f"{place}: {error}") from None


def _reword(error: DataError, where: Where | None, place: str) -> str:
    """``error`` naming the file's field and the bad row's line instead of an index."""
    field = FILE_FIELDS.get(error.field, error.field)
    problem = str(error).split(":", 1)[1].strip() if ":" in str(error) else str(error)
    if error.index is not None and where is not None:
        problem = problem.replace(f"first at index {error.index}", f"the first at this {where.unit}")
        return f"{where.row(error.index)}, field {field!r}: {problem}"
    return f"{place}, field {field!r}: {problem}"


def load(path: str | Path, *, format: str | None = None, gamma: float | None = None,
         target_policy: str | None = None, temperature: float = 1.0
         ) -> BanditLog | Trajectories:
    """Load a JSON-lines, CSV or Parquet file, or a Timeline directory, as a bandit log
    or trajectories.

    Args:
        path: the file, or a ``fiberrl workflow timeline`` output directory.
        format: ``"jsonl"``, ``"csv"``, ``"parquet"`` or ``"timeline"`` (default: from
            the path).
        gamma: discount for trajectories (default: a Timeline's gamma, else 1.0).
        target_policy: ``"uniform"`` or the path of an exported policy, whose
            probabilities replace the data's ``target_probs`` (:mod:`cpe.targets`).
        temperature: the softmax temperature of an exported target policy.
    """
    columns, where = read_columns(path, format)
    return columns_to_data(columns, gamma=gamma, where=where, target_policy=target_policy,
                           temperature=temperature)
