"""Field names, Arrow types and the error raised on bad logged data.

Every reader turns logged rows into one *canonical* Arrow layout (whatever the
file format), so the Timeline never looks at JSON, CSV or Parquet details:

============================  ===========================================================
column                        type
============================  ===========================================================
``mdp_id``                    string (integers in the input become their decimal string)
``sequence_number``           int64
``_order``                    int64: input position, ``file_index << 40 | offset`` where
                              offset is the byte offset of the line (JSON lines, CSV) or
                              the row index (Parquet); ties between equal sequence
                              numbers are broken by it
``state_features``            map<string, double> (missing features are absent keys)
``action``                    string (discrete) or map<string, double> (parametric)
``action_probability``        double in (0, 1]
``reward``                    double (the chosen metric when rewards are metric maps)
``metrics``                   map<string, double>, null unless rewards are metric maps
``possible_actions``          list<string> or list<map<string, double>>, null if not given
============================  ===========================================================
"""
from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Optional

logger = logging.getLogger(__name__)

MDP_ID = "mdp_id"
SEQUENCE_NUMBER = "sequence_number"
STATE_FEATURES = "state_features"
ACTION = "action"
ACTION_PROBABILITY = "action_probability"
REWARD = "reward"
POSSIBLE_ACTIONS = "possible_actions"
METRICS = "metrics"
ORDER = "_order"

#: Fields every logged row must have (``possible_actions`` is optional).
REQUIRED_FIELDS = (MDP_ID, SEQUENCE_NUMBER, STATE_FEATURES, ACTION, ACTION_PROBABILITY, REWARD)

DISCRETE = "discrete"
PARAMETRIC = "parametric"

#: Input positions are ``file_index << ORDER_SHIFT | offset``: offsets below 2**40.
ORDER_SHIFT = 40

FORMATS = ("jsonl", "csv", "parquet")
_SUFFIXES = {".jsonl": "jsonl", ".ndjson": "jsonl", ".json": "jsonl", ".csv": "csv",
             ".parquet": "parquet", ".pq": "parquet"}


class LoggedDataError(ValueError):
    """Bad logged data. The message names the file, the line (JSON lines, CSV; 1-based,
    the CSV header is line 1) or the row (Parquet; 1-based), and the field."""

    def __init__(self, path: Any, message: str, line: Optional[int] = None,
                 row: Optional[int] = None, field: Optional[str] = None) -> None:
        self.path, self.message = str(path), message
        self.line, self.row, self.field = line, row, field
        where = self.path
        if line is not None:
            where += f", line {line}"
        if row is not None:
            where += f", row {row}"
        if field is not None:
            where += f", field {field!r}"
        super().__init__(f"{where}: {message}")

    def __reduce__(self):
        return (type(self), (self.path, self.message, self.line, self.row, self.field))


def detect_format(path: Any, format: Optional[str] = None) -> str:
    """The input format: ``format`` when given, else from the file suffix."""
    if format is not None:
        if format not in FORMATS:
            raise ValueError(f"format must be one of {', '.join(FORMATS)}, got {format!r}")
        return format
    suffix = Path(path).suffix.lower()
    if suffix not in _SUFFIXES:
        raise ValueError(f"{path}: cannot tell the format from suffix {suffix!r}; use one of "
                         f"{', '.join(sorted(_SUFFIXES))} or pass a format ({', '.join(FORMATS)})")
    return _SUFFIXES[suffix]


def is_data_file(path: Path) -> bool:
    """Whether ``path`` looks like an input file (known suffix, not hidden or ``_``-prefixed)."""
    return (path.is_file() and path.suffix.lower() in _SUFFIXES
            and not path.name.startswith((".", "_")))


def feature_sort_key(feature_id: str):
    """Sort key putting integer ids first in numeric order (``"2" < "10"``), then the rest."""
    text = str(feature_id)
    try:
        return (0, int(text), "")
    except ValueError:
        return (1, 0, text)


def flat_map(array):
    """``(offsets, keys, items)`` of a map (or list: ``items`` is None) array, with
    ``offsets`` an int64 numpy array starting at 0 even for a sliced array."""
    import numpy as np
    import pyarrow as pa
    offsets = np.asarray(array.offsets, dtype=np.int64)
    start, stop = int(offsets[0]), int(offsets[-1])
    if pa.types.is_map(array.type):
        return (offsets - start, array.keys.slice(start, stop - start),
                array.items.slice(start, stop - start))
    return offsets - start, array.values.slice(start, stop - start), None


def feature_map_type():
    """``map<string, double>``: state features, parametric actions and metrics."""
    import pyarrow as pa
    return pa.map_(pa.string(), pa.float64())


def action_type(kind: str):
    """Arrow type of an action of ``kind`` (``discrete`` or ``parametric``)."""
    import pyarrow as pa
    if kind == DISCRETE:
        return pa.string()
    if kind == PARAMETRIC:
        return feature_map_type()
    raise ValueError(f"action kind must be {DISCRETE!r} or {PARAMETRIC!r}, got {kind!r}")


def canonical_schema(kind: str):
    """The canonical row schema for actions of ``kind`` (see the module docstring)."""
    import pyarrow as pa
    features = feature_map_type()
    return pa.schema([
        pa.field(MDP_ID, pa.string(), nullable=False),
        pa.field(SEQUENCE_NUMBER, pa.int64(), nullable=False),
        pa.field(ORDER, pa.int64(), nullable=False),
        pa.field(STATE_FEATURES, features, nullable=False),
        pa.field(ACTION, action_type(kind), nullable=False),
        pa.field(ACTION_PROBABILITY, pa.float64(), nullable=False),
        pa.field(REWARD, pa.float64(), nullable=False),
        pa.field(METRICS, features),
        pa.field(POSSIBLE_ACTIONS, pa.list_(action_type(kind))),
    ])
