"""Loading logged data from JSON lines, CSV or Parquet files.

One record per logged decision (bandit) or step (trajectories) with fields

* ``action`` (int), ``reward`` (float), ``logged_propensity`` (float),
  ``target_probs`` (list of K floats), optional ``reward_estimates`` (list);
* trajectories additionally ``mdp_id`` (int or str), ``sequence_number`` (number)
  and optional ``q_estimates`` (list of K floats).

A file holds trajectories exactly when it has an ``mdp_id`` field.  In CSV files a
list is a JSON array in one cell (``"[0.2, 0.8]"``).  ``.json`` files may also hold
one JSON array of records.  Parquet needs the optional ``pyarrow`` dependency.
"""

from __future__ import annotations

import csv
import json
import logging
from pathlib import Path
from typing import Any

import numpy as np

from cpe.data import BanditLog, Trajectories

logger = logging.getLogger(__name__)

LIST_FIELDS = ("target_probs", "reward_estimates", "q_estimates")
BANDIT_REQUIRED = ("action", "reward", "logged_propensity", "target_probs")
TRAJECTORY_REQUIRED = BANDIT_REQUIRED + ("mdp_id", "sequence_number")
OPTIONAL_FIELDS = ("reward_estimates", "q_estimates")
FORMATS = ("jsonl", "csv", "parquet")
_SUFFIXES = {".jsonl": "jsonl", ".ndjson": "jsonl", ".json": "jsonl", ".csv": "csv",
             ".parquet": "parquet", ".pq": "parquet"}


def detect_format(path: str | Path) -> str:
    """File format from the suffix: ``jsonl``, ``csv`` or ``parquet``."""
    suffix = Path(path).suffix.lower()
    if suffix not in _SUFFIXES:
        raise ValueError(
            f"{path}: cannot tell the format from suffix {suffix!r}; "
            f"use one of {', '.join(sorted(_SUFFIXES))} or pass format= ({', '.join(FORMATS)})"
        )
    return _SUFFIXES[suffix]


def _collect(records: list[tuple[int, dict[str, Any]]], where: str) -> dict[str, list[Any]]:
    """Turn ``(line, record)`` pairs into columns; optional fields are all-or-none."""
    if not records:
        raise ValueError(f"{where}: no records")
    fields = [f for f in (*TRAJECTORY_REQUIRED, *OPTIONAL_FIELDS)
              if any(record.get(f) is not None for _, record in records)]
    columns: dict[str, list[Any]] = {f: [] for f in fields}
    for line, record in records:
        for f in fields:
            value = record.get(f)
            if value is None:
                raise ValueError(f"{where}, record at line {line}: missing field {f!r}")
            columns[f].append(value)
    return columns


def _read_jsonl(path: Path) -> dict[str, list[Any]]:
    """Columns of a JSON-lines file (or a ``.json`` file holding one array)."""
    text = path.read_text(encoding="utf-8")
    records: list[tuple[int, dict[str, Any]]] = []
    if text.lstrip().startswith("["):
        try:
            items = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path}: invalid JSON ({exc})") from None
        records = [(i + 1, item) for i, item in enumerate(items)]
    else:
        for number, line in enumerate(text.splitlines(), start=1):
            if not line.strip():
                continue
            try:
                records.append((number, json.loads(line)))
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path}, line {number}: invalid JSON ({exc})") from None
    for number, record in records:
        if not isinstance(record, dict):
            raise ValueError(f"{path}, line {number}: expected a JSON object per record")
    return _collect(records, str(path))


def _parse_cell(field: str, cell: str, where: str) -> Any:
    """Decode one CSV cell (JSON arrays for list fields, numbers otherwise)."""
    if field in LIST_FIELDS:
        try:
            value = json.loads(cell)
        except json.JSONDecodeError:
            raise ValueError(f"{where}: field {field!r} must be a JSON list, got {cell!r}") from None
        if not isinstance(value, list):
            raise ValueError(f"{where}: field {field!r} must be a JSON list, got {cell!r}")
        return value
    if field == "mdp_id":
        return cell
    try:
        return int(cell) if field in ("action", "sequence_number") else float(cell)
    except ValueError:
        pass
    try:
        return float(cell)
    except ValueError:
        raise ValueError(f"{where}: field {field!r} must be a number, got {cell!r}") from None


def _read_csv(path: Path) -> dict[str, list[Any]]:
    """Columns of a CSV file with a header row."""
    records: list[tuple[int, dict[str, Any]]] = []
    with path.open(newline="", encoding="utf-8") as handle:
        reader = csv.DictReader(handle)
        for record in reader:
            line = reader.line_num
            parsed = {
                field: _parse_cell(field, cell.strip(), f"{path}, line {line}")
                for field, cell in record.items()
                if field in (*TRAJECTORY_REQUIRED, *OPTIONAL_FIELDS) and cell is not None
                and cell.strip() != ""
            }
            records.append((line, parsed))
    return _collect(records, str(path))


def _read_parquet(path: Path) -> dict[str, Any]:
    """Columns of a Parquet file (list columns become ``(N, K)`` arrays)."""
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        raise ValueError(f"{path}: reading Parquet needs pyarrow (pip install pyarrow)") from None
    table = pq.read_table(path)
    columns: dict[str, Any] = {}
    for field in (*TRAJECTORY_REQUIRED, *OPTIONAL_FIELDS):
        if field not in table.column_names:
            continue
        array = table.column(field).combine_chunks()
        if array.null_count:
            raise ValueError(f"{path}: field {field!r} has {array.null_count} missing values")
        if pa.types.is_list(array.type) or pa.types.is_large_list(array.type) \
                or pa.types.is_fixed_size_list(array.type):
            lengths = np.asarray(array.value_lengths())
            if lengths.size and np.any(lengths != lengths[0]):
                raise ValueError(f"{path}: field {field!r} lists have different lengths")
            flat = np.asarray(array.flatten().to_numpy(zero_copy_only=False), dtype=np.float64)
            columns[field] = flat.reshape(len(array), int(lengths[0]) if lengths.size else 0)
        else:
            columns[field] = array.to_numpy(zero_copy_only=False)
    if table.num_rows == 0:
        raise ValueError(f"{path}: no records")
    return columns


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


def read_columns(path: str | Path, format: str | None = None) -> dict[str, Any]:
    """Read the recognised fields of ``path`` into columns (lists or arrays)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such file")
    fmt = format or detect_format(path)
    readers = {"jsonl": _read_jsonl, "csv": _read_csv, "parquet": _read_parquet}
    if fmt not in readers:
        raise ValueError(f"format: expected one of {', '.join(FORMATS)}, got {fmt!r}")
    return readers[fmt](path)


def columns_to_data(columns: dict[str, Any], gamma: float | None = None,
                    where: str = "input") -> BanditLog | Trajectories:
    """Build a :class:`BanditLog` or (with ``mdp_id``) :class:`Trajectories` from columns."""
    trajectories = "mdp_id" in columns
    required = TRAJECTORY_REQUIRED if trajectories else BANDIT_REQUIRED
    missing = [f for f in required if f not in columns]
    if missing:
        raise ValueError(f"{where}: missing required field(s) {', '.join(map(repr, missing))}")
    common = dict(
        actions=np.asarray(columns["action"]),
        rewards=np.asarray(columns["reward"]),
        logged_propensities=np.asarray(columns["logged_propensity"]),
        target_probs=_matrix("target_probs", columns["target_probs"]),
    )
    if not trajectories:
        if gamma is not None:
            logger.warning("gamma is ignored for bandit logs")
        estimates = columns.get("reward_estimates")
        return BanditLog(
            **common,
            reward_estimates=None if estimates is None else _matrix("reward_estimates", estimates),
        )
    q_values = columns.get("q_estimates")
    ids = columns["mdp_id"]
    if not isinstance(ids, np.ndarray):
        mixed = len({type(v) for v in ids}) > 1
        ids = np.asarray([str(v) for v in ids]) if mixed else np.asarray(ids)
    return Trajectories(
        mdp_ids=ids,
        sequence_numbers=np.asarray(columns["sequence_number"]),
        q_estimates=None if q_values is None else _matrix("q_estimates", q_values),
        gamma=1.0 if gamma is None else gamma,
        **common,
    )


def load(path: str | Path, *, format: str | None = None,
         gamma: float | None = None) -> BanditLog | Trajectories:
    """Load a JSON-lines, CSV or Parquet file as a bandit log or trajectories.

    Args:
        path: the file.
        format: ``"jsonl"``, ``"csv"`` or ``"parquet"`` (default: from the suffix).
        gamma: discount for trajectories (default 1.0; ignored for bandit logs).
    """
    return columns_to_data(read_columns(path, format), gamma=gamma, where=str(path))
