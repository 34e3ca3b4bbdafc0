"""Loading logged data from JSON lines, CSV, Parquet or a Timeline directory.

The field names are the data pipeline's (:mod:`rl.data.schema`), so a file logged for
``fiberrl workflow`` and the directory ``fiberrl workflow timeline`` writes are read as
they are. One record per logged decision (bandit) or step (trajectories):

* ``action``: an action index (int), or an action name (string; names are ordered as
  the Timeline metadata lists them, else sorted);
* ``reward`` (number), ``action_probability`` (number in (0, 1], the logging policy's
  probability of the logged action; ``logged_propensity`` is accepted too);
* ``target_probs`` (list of K numbers, the evaluated policy's probabilities), unless
  ``--target-policy`` computes them (see :mod:`cpe.targets`), which may use
  ``state_features`` (map feature id -> number) and ``possible_actions`` (list);
* optional ``reward_estimates`` (list of K numbers);
* trajectories additionally ``mdp_id`` (int or string), ``sequence_number`` (integer)
  and optional ``q_estimates`` (list of K numbers).

Data holds trajectories exactly when it has an ``mdp_id`` field. In CSV files a list
or map is JSON in one cell. Numbers must be numbers: a JSON string such as ``"0.3"``
is rejected. Errors name the file, its 1-based line (CSV: the header is line 1; JSON
lines: the physical line; Parquet and Timeline rows: ``row``, 1-based) and the field
as the file spells it.
"""

from __future__ import annotations

import csv
import json
import logging
import numbers
from pathlib import Path
from typing import Any

import numpy as np

logger = logging.getLogger(__name__)

PROPENSITY = "action_probability"
PROPENSITY_ALIASES = ("logged_propensity",)
LIST_FIELDS = ("target_probs", "reward_estimates", "q_estimates", "possible_actions")
MAP_FIELDS = ("state_features",)
NUMBER_FIELDS = ("reward", PROPENSITY, "sequence_number")
BANDIT_REQUIRED = ("action", "reward", PROPENSITY)
TRAJECTORY_REQUIRED = BANDIT_REQUIRED + ("mdp_id", "sequence_number")
OPTIONAL_FIELDS = ("target_probs", "reward_estimates", "q_estimates", "state_features",
                   "possible_actions")
ALL_FIELDS = TRAJECTORY_REQUIRED + OPTIONAL_FIELDS
FORMATS = ("jsonl", "csv", "parquet", "timeline")
_SUFFIXES = {".jsonl": "jsonl", ".ndjson": "jsonl", ".json": "jsonl", ".csv": "csv",
             ".parquet": "parquet", ".pq": "parquet"}
#: metadata key of the actions' order in a Timeline directory's ``_SUCCESS``
TIMELINE_METADATA = "_SUCCESS"


class Where:
    """Where each row came from, to name it in errors: ``line`` (text files) or
    ``row`` (Parquet, Timeline), 1-based."""

    def __init__(self, path: Path, unit: str, numbers_: list[int]) -> None:
        self.path, self.unit, self.numbers = path, unit, numbers_

    def row(self, index: int) -> str:
        """``path, line N`` for the row at 0-based ``index``."""
        return f"{self.path}, {self.unit} {self.numbers[index]}"


def detect_format(path: str | Path) -> str:
    """Format from the path: ``timeline`` for a directory, else from the suffix."""
    path = Path(path)
    if path.is_dir():
        return "timeline"
    suffix = path.suffix.lower()
    if suffix not in _SUFFIXES:
        raise ValueError(
            f"{path}: cannot tell the format from suffix {suffix!r}; use one of "
            f"{', '.join(sorted(_SUFFIXES))} or pass --format {{{','.join(FORMATS[:3])}}}"
        )
    return _SUFFIXES[suffix]


def _canonical(record: dict[str, Any]) -> dict[str, Any]:
    """``record`` with a ``logged_propensity`` alias renamed to ``action_probability``."""
    for alias in PROPENSITY_ALIASES:
        if alias in record and PROPENSITY not in record:
            record = {**record, PROPENSITY: record[alias]}
    return record


def _is_number(value: Any) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def _check_types(record: dict[str, Any], where: str) -> None:
    """JSON values must have the field's type: numbers are numbers, not strings."""
    for field in NUMBER_FIELDS:
        value = record.get(field)
        if value is not None and not _is_number(value):
            raise ValueError(f"{where}, field {field!r}: must be a number, got {value!r}")
    action = record.get("action")
    if action is not None and not (isinstance(action, str) or _is_number(action)):
        raise ValueError(f"{where}, field 'action': must be an index or a name, got {action!r}")
    for field in ("target_probs", "reward_estimates", "q_estimates"):
        value = record.get(field)
        if value is not None and (not isinstance(value, list)
                                  or not all(_is_number(v) for v in value)):
            raise ValueError(f"{where}, field {field!r}: must be a list of numbers, got {value!r}")
    features = record.get("state_features")
    if features is not None and not isinstance(features, dict):
        raise ValueError(f"{where}, field 'state_features': must be a map of feature id -> "
                         f"number, got {features!r}")


def _collect(records: list[tuple[int, dict[str, Any]]], path: Path, unit: str
             ) -> tuple[dict[str, list[Any]], Where]:
    """Turn ``(line, record)`` pairs into columns; optional fields are all-or-none."""
    if not records:
        raise ValueError(f"{path}: no records")
    records = [(line, _canonical(record)) for line, record in records]
    fields = [f for f in ALL_FIELDS if any(record.get(f) is not None for _, record in records)]
    columns: dict[str, list[Any]] = {f: [] for f in fields}
    for line, record in records:
        _check_types(record, f"{path}, {unit} {line}")
        for f in fields:
            value = record.get(f)
            if value is None:
                raise ValueError(f"{path}, {unit} {line}: missing field {f!r}")
            columns[f].append(value)
    return columns, Where(path, unit, [line for line, _ in records])


def _read_jsonl(path: Path) -> tuple[dict[str, list[Any]], Where]:
    """Columns of a JSON-lines file (or a ``.json`` file holding one array)."""
    text = path.read_text(encoding="utf-8")
    records: list[tuple[int, dict[str, Any]]] = []
    unit = "line"
    if text.lstrip().startswith("["):
        try:
            items = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path}: invalid JSON ({exc})") from None
        records, unit = [(i + 1, item) for i, item in enumerate(items)], "record"
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
            raise ValueError(f"{path}, {unit} {number}: expected a JSON object per record")
    return _collect(records, path, unit)


def _parse_cell(field: str, cell: str, where: str) -> Any:
    """Decode one CSV cell (JSON for list and map fields, numbers otherwise)."""
    if field in LIST_FIELDS or field in MAP_FIELDS:
        try:
            return json.loads(cell)
        except json.JSONDecodeError:
            raise ValueError(f"{where}, field {field!r}: must be JSON, got {cell!r}") from None
    if field == "mdp_id":
        return cell
    if field == "action":
        try:
            return int(cell)
        except ValueError:
            return cell  # an action name
    try:
        return int(cell) if field == "sequence_number" else float(cell)
    except ValueError:
        raise ValueError(f"{where}, field {field!r}: must be a number, got {cell!r}") from None


def _read_csv(path: Path) -> tuple[dict[str, list[Any]], Where]:
    """Columns of a CSV file with a header row (line 1)."""
    records: list[tuple[int, dict[str, Any]]] = []
    known = set(ALL_FIELDS) | set(PROPENSITY_ALIASES)
    with path.open(newline="", encoding="utf-8") as handle:
        reader = csv.DictReader(handle)
        for record in reader:
            line = reader.line_num
            fields = _canonical({k: v for k, v in record.items() if k in known})
            parsed = {field: _parse_cell(field, cell.strip(), f"{path}, line {line}")
                      for field, cell in fields.items()
                      if cell is not None and cell.strip() != "" and field in ALL_FIELDS}
            records.append((line, parsed))
    return _collect(records, path, "line")


def _arrow_columns(table: Any, path: Path) -> dict[str, Any]:
    """The known fields of an Arrow table as numpy arrays (number lists as ``(N, K)``
    arrays) or Python lists (maps, lists of names)."""
    import pyarrow as pa
    names = set(table.column_names)
    for alias in PROPENSITY_ALIASES:
        if alias in names and PROPENSITY not in names:
            table = table.rename_columns([PROPENSITY if n == alias else n
                                          for n in table.column_names])
    columns: dict[str, Any] = {}
    for field in ALL_FIELDS:
        if field not in table.column_names:
            continue
        array = table.column(field).combine_chunks()
        if array.null_count and field not in ("possible_actions",):
            raise ValueError(f"{path}, field {field!r}: {array.null_count} missing values")
        kind = array.type
        if field in NUMBER_FIELDS and not (pa.types.is_integer(kind) or pa.types.is_floating(kind)):
            raise ValueError(f"{path}, field {field!r}: must be numbers, got {kind}")
        if field in ("target_probs", "reward_estimates", "q_estimates"):
            if not pa.types.is_list(kind) and not pa.types.is_large_list(kind) \
                    and not pa.types.is_fixed_size_list(kind):
                raise ValueError(f"{path}, field {field!r}: must be lists of numbers, got {kind}")
            lengths = np.asarray(array.value_lengths())
            if lengths.size and np.any(lengths != lengths[0]):
                raise ValueError(f"{path}, field {field!r}: lists have different lengths")
            flat = np.asarray(array.flatten().to_numpy(zero_copy_only=False), dtype=np.float64)
            columns[field] = flat.reshape(len(array), int(lengths[0]) if lengths.size else 0)
        elif field in MAP_FIELDS:
            columns[field] = [dict(row) for row in array.to_pylist()]
        elif field == "possible_actions":
            columns[field] = array.to_pylist()
        else:
            columns[field] = array.to_numpy(zero_copy_only=False)
    if table.num_rows == 0:
        raise ValueError(f"{path}: no records")
    return columns


def _read_parquet(path: Path) -> tuple[dict[str, Any], Where]:
    """Columns of a Parquet file."""
    pq = _pyarrow_parquet(path)
    table = pq.read_table(path)
    return _arrow_columns(table, path), Where(path, "row", list(range(1, table.num_rows + 1)))


def _read_timeline(path: Path) -> tuple[dict[str, Any], Where]:
    """Columns of a ``fiberrl workflow timeline`` output directory, with the action
    names in the order its ``_SUCCESS`` metadata lists them (``_action_names``) and its
    ``gamma`` (``_gamma``)."""
    metadata_path = path / TIMELINE_METADATA
    if not metadata_path.is_file():
        raise ValueError(f"{path}: not a finished Timeline directory (no {TIMELINE_METADATA}); "
                         "run fiberrl workflow timeline first")
    metadata = json.loads(metadata_path.read_text(encoding="utf-8"))
    pq = _pyarrow_parquet(path)
    import pyarrow as pa
    shards = [path / name for name in metadata.get("shards", [])] \
        or sorted(path.glob("part-*.parquet"))
    wanted = set(ALL_FIELDS) | set(PROPENSITY_ALIASES)
    tables = []
    for shard in shards:
        table = pq.read_table(shard)
        tables.append(table.select([n for n in table.column_names if n in wanted]))
    table = pa.concat_tables(tables)
    columns = _arrow_columns(table, path)
    columns["_action_names"] = [str(a) for a in metadata.get("actions", [])]
    columns["_gamma"] = metadata.get("gamma")
    return columns, Where(path, "row", list(range(1, table.num_rows + 1)))


def _pyarrow_parquet(path: Path) -> Any:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise ValueError(f"{path}: reading Parquet needs pyarrow: "
                         "pip install 'fiberrl[parquet]'") from None
    return pq


def read_columns(path: str | Path, format: str | None = None) -> tuple[dict[str, Any], Where]:
    """Read the known fields of ``path`` into columns, and where each row came from."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"{path}: no such file or directory")
    fmt = format or detect_format(path)
    readers = {"jsonl": _read_jsonl, "csv": _read_csv, "parquet": _read_parquet,
               "timeline": _read_timeline}
    if fmt not in readers:
        raise ValueError(f"--format: expected one of {', '.join(FORMATS)}, got {fmt!r}")
    if (fmt == "timeline") != path.is_dir():
        raise ValueError(f"{path}: --format {fmt} " + ("needs a Timeline directory"
                                                         if fmt == "timeline" else "needs a file"))
    return readers[fmt](path)
