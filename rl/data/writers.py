"""Write logged rows (dicts in the logged format of :mod:`rl.data.records`) to a
JSON-lines, CSV or Parquet file.

The file is written under a temporary name and renamed when the writer closes
without error, so an interrupted run leaves no file that looks complete. In CSV,
maps and lists are JSON cells; in Parquet, feature maps are ``map<string, double>``
columns and the column types follow the first row (string or map actions, number
or metric-map rewards).
"""
from __future__ import annotations

import csv
import json
import logging
import os
import uuid
from pathlib import Path
from typing import Any, Dict, Iterable, List, Optional, Union

from .schema import (ACTION, ACTION_PROBABILITY, MDP_ID, POSSIBLE_ACTIONS, REWARD,
                     SEQUENCE_NUMBER, STATE_FEATURES, detect_format, feature_map_type)

logger = logging.getLogger(__name__)

FIELDS = (MDP_ID, SEQUENCE_NUMBER, STATE_FEATURES, ACTION, ACTION_PROBABILITY, REWARD,
          POSSIBLE_ACTIONS)


class LoggedRowWriter:
    """Streams logged rows to ``path`` (format from ``format`` or the suffix)."""

    def __init__(self, path: Union[str, Path], format: Optional[str] = None,
                 batch_rows: int = 10_000) -> None:
        self.path = Path(path)
        self.format = detect_format(self.path, format)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.tmp = self.path.parent / f".{self.path.name}.tmp-{uuid.uuid4().hex[:12]}"
        self.rows = 0
        self._batch: List[Dict[str, Any]] = []
        self._batch_rows = batch_rows
        self._parquet = None
        self._csv = None
        self._handle = None
        if self.format != "parquet":
            self._handle = open(self.tmp, "w", encoding="utf-8", newline="")
            if self.format == "csv":
                self._csv = csv.writer(self._handle, lineterminator="\n")
                self._csv.writerow(FIELDS)

    def write(self, row: Dict[str, Any]) -> None:
        """Append one logged row."""
        if self.format == "jsonl":
            self._handle.write(json.dumps(row) + "\n")
        elif self.format == "csv":
            self._csv.writerow(["" if row.get(f) is None else
                                json.dumps(row[f]) if isinstance(row[f], (dict, list))
                                else row[f] for f in FIELDS])
        else:
            self._batch.append(row)
            if len(self._batch) >= self._batch_rows:
                self._flush()
        self.rows += 1

    def _flush(self) -> None:
        import pyarrow as pa
        import pyarrow.parquet as pq
        if not self._batch:
            return
        if self._parquet is None:
            self._parquet = pq.ParquetWriter(self.tmp, _parquet_schema(self._batch[0]))
        schema = self._parquet.schema
        columns = [pa.array([row.get(f.name) for row in self._batch], type=f.type) for f in schema]
        self._parquet.write_table(pa.Table.from_arrays(columns, schema=schema))
        self._batch = []

    def close(self) -> None:
        """Finish the file and move it into place."""
        if self.format == "parquet":
            self._flush()
            if self._parquet is None:
                raise ValueError(f"{self.path}: no rows to write")
            self._parquet.close()
        else:
            self._handle.close()
        os.replace(self.tmp, self.path)

    def discard(self) -> None:
        """Drop the unfinished file."""
        if self._handle is not None:
            self._handle.close()
        if self._parquet is not None:
            self._parquet.close()
        if self.tmp.exists():
            self.tmp.unlink()

    def __enter__(self) -> "LoggedRowWriter":
        return self

    def __exit__(self, exc_type: Any, *exc_info: Any) -> None:
        if exc_type is None:
            self.close()
        else:
            self.discard()


def _parquet_schema(row: Dict[str, Any]):
    import pyarrow as pa
    features = feature_map_type()
    action = features if isinstance(row.get(ACTION), dict) else pa.string()
    reward = features if isinstance(row.get(REWARD), dict) else pa.float64()
    mdp = pa.int64() if isinstance(row.get(MDP_ID), int) else pa.string()
    return pa.schema([(MDP_ID, mdp), (SEQUENCE_NUMBER, pa.int64()), (STATE_FEATURES, features),
                      (ACTION, action), (ACTION_PROBABILITY, pa.float64()), (REWARD, reward),
                      (POSSIBLE_ACTIONS, pa.list_(action))])


def write_logged_rows(rows: Iterable[Dict[str, Any]], path: Union[str, Path],
                      format: Optional[str] = None) -> int:
    """Write ``rows`` to ``path``; returns the number of rows written."""
    with LoggedRowWriter(path, format) as writer:
        for row in rows:
            writer.write(row)
    return writer.rows
