"""Find input files, cut them into chunks that workers read independently, and read
one chunk into the canonical table of :mod:`rl.data.schema`.

A chunk is a byte range of a JSON-lines or CSV file whose ends fall on line
boundaries (so one large file is read by several workers at once), or a range of
row groups of a Parquet file. Planning reads only a few bytes around each cut
and the Parquet footers; the rows themselves are read by the workers.

Text formats: one JSON object per line (blank lines are skipped), or CSV with a
header row where ``state_features``, map-valued ``action``/``reward`` and
``possible_actions`` cells hold JSON (``"{""3"": 0.5}"``); a CSV record must not
span lines (``json.dumps`` never writes raw newlines). Files are UTF-8.
"""
from __future__ import annotations

import csv
import dataclasses
import glob
import json
import logging
from pathlib import Path
from typing import Iterator, List, Optional, Sequence, Tuple, Union

from .records import FieldError, RecordBuilder
from .schema import (ACTION, ORDER_SHIFT, POSSIBLE_ACTIONS, REQUIRED_FIELDS, REWARD, STATE_FEATURES,
                     LoggedDataError, detect_format, is_data_file)

logger = logging.getLogger(__name__)

DEFAULT_CHUNK_BYTES = 64 << 20
DEFAULT_CHUNK_ROWS = 1_000_000
_JSON_CELLS = (STATE_FEATURES, POSSIBLE_ACTIONS)
_MAYBE_JSON_CELLS = (ACTION, REWARD)
_PARQUET_COLUMNS = REQUIRED_FIELDS + (POSSIBLE_ACTIONS,)

PathLike = Union[str, Path]


@dataclasses.dataclass(frozen=True)
class Chunk:
    """A piece of one input file read by one worker."""

    path: str           #: the input file
    format: str         #: ``jsonl``, ``csv`` or ``parquet``
    file_index: int     #: position of the file in the sorted input list
    index: int          #: position of the chunk among all chunks
    start: int          #: first byte (text) or first row group (Parquet)
    stop: int           #: byte or row group after the last one
    first_row: int = 0  #: Parquet: rows of the file before ``start``
    rows: int = -1      #: Parquet: rows in the chunk (-1: unknown, text formats)


def find_inputs(inputs: Union[PathLike, Sequence[PathLike]]) -> List[Path]:
    """The input files: files as given, directories' data files (recursively,
    skipping hidden and ``_``-prefixed names) and glob patterns, in sorted order."""
    if isinstance(inputs, (str, Path)):
        inputs = [inputs]
    found: List[Path] = []
    for item in inputs:
        path = Path(item)
        if path.is_dir():
            found.extend(p for p in sorted(path.rglob("*")) if is_data_file(p) and not any(
                part.startswith((".", "_")) for part in p.relative_to(path).parts))
        elif path.is_file():
            found.append(path)
        elif any(ch in str(item) for ch in "*?["):
            found.extend(Path(p) for p in sorted(glob.glob(str(item), recursive=True))
                         if is_data_file(Path(p)))
        else:
            raise FileNotFoundError(f"{item}: no such file or directory")
    if not found:
        raise FileNotFoundError(f"no input files in {[str(i) for i in inputs]}")
    unique = sorted(dict.fromkeys(found))
    if len(unique) >= 1 << (63 - ORDER_SHIFT):
        raise ValueError(f"too many input files ({len(unique)})")
    return unique


def plan_chunks(files: Sequence[PathLike], format: Optional[str] = None,
                chunk_bytes: int = DEFAULT_CHUNK_BYTES,
                chunk_rows: int = DEFAULT_CHUNK_ROWS) -> List[Chunk]:
    """Cut ``files`` into chunks of about ``chunk_bytes`` (text) or ``chunk_rows``
    rows (Parquet, whole row groups)."""
    if chunk_bytes <= 0 or chunk_rows <= 0:
        raise ValueError("chunk_bytes and chunk_rows must be positive")
    chunks: List[Chunk] = []
    for file_index, path in enumerate(files):
        fmt = detect_format(path, format)
        ranges = (_parquet_ranges(path, chunk_rows) if fmt == "parquet"
                  else _text_ranges(path, fmt, chunk_bytes))
        for start, stop, first_row, rows in ranges:
            chunks.append(Chunk(str(path), fmt, file_index, len(chunks), start, stop,
                                first_row, rows))
    return chunks


def _text_ranges(path: PathLike, fmt: str, chunk_bytes: int) -> List[Tuple[int, int, int, int]]:
    with open(path, "rb") as handle:
        handle.seek(0, 2)
        size = handle.tell()
        handle.seek(0)
        start = len(handle.readline()) if fmt == "csv" else 0
        if size >= 1 << ORDER_SHIFT:
            raise ValueError(f"{path}: files above {1 << ORDER_SHIFT} bytes are not supported")
        cuts = [start]
        while cuts[-1] + chunk_bytes < size:
            handle.seek(cuts[-1] + chunk_bytes)
            handle.readline()  # finish the line the cut fell into
            if handle.tell() >= size:
                break
            cuts.append(handle.tell())
        cuts.append(size)
    return [(a, b, 0, -1) for a, b in zip(cuts, cuts[1:]) if b > a]


def _parquet_ranges(path: PathLike, chunk_rows: int) -> List[Tuple[int, int, int, int]]:
    import pyarrow.parquet as pq
    metadata = pq.ParquetFile(path).metadata
    ranges, first, rows_before, rows = [], 0, 0, 0
    for group in range(metadata.num_row_groups):
        rows += metadata.row_group(group).num_rows
        if rows >= chunk_rows or group == metadata.num_row_groups - 1:
            ranges.append((first, group + 1, rows_before, rows))
            first, rows_before, rows = group + 1, rows_before + rows, 0
    return ranges


def estimate_rows(chunk: Chunk) -> int:
    """Rows in ``chunk``: exact for Parquet, from the first 256 KiB for text."""
    if chunk.rows >= 0:
        return chunk.rows
    size = chunk.stop - chunk.start
    with open(chunk.path, "rb") as handle:
        handle.seek(chunk.start)
        sample = handle.read(min(size, 256 << 10))
    return int(size * max(sample.count(b"\n"), 1) / max(len(sample), 1))


def read_chunk(chunk: Chunk, reward_metric: Optional[str] = None):
    """The canonical table of ``chunk`` (None when it holds no rows).

    Raises :class:`LoggedDataError` naming the file and line or row on bad input.
    """
    if chunk.format == "parquet":
        return _read_parquet(chunk, reward_metric)
    builder = RecordBuilder(reward_metric)
    base = chunk.file_index << ORDER_SHIFT
    lines = _lines(chunk)
    records = _json_records(chunk, lines) if chunk.format == "jsonl" else _csv_records(chunk, lines)
    for offset, record in records:
        try:
            builder.add(record, base + offset)
        except FieldError as error:
            raise LoggedDataError(chunk.path, error.message, line=_line_number(chunk.path, offset),
                                  field=error.field) from None
    return builder.table()


def _lines(chunk: Chunk) -> Iterator[Tuple[int, str]]:
    """``(byte offset, text)`` of the non-blank lines of a text chunk."""
    with open(chunk.path, "rb") as handle:
        handle.seek(chunk.start)
        offset = chunk.start
        while offset < chunk.stop:
            raw = handle.readline()
            if not raw:
                break
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as error:
                raise LoggedDataError(chunk.path, f"not UTF-8 ({error.reason})",
                                      line=_line_number(chunk.path, offset)) from None
            if text.strip():
                yield offset, text
            offset += len(raw)


def _json_records(chunk: Chunk, lines: Iterator[Tuple[int, str]]) -> Iterator[Tuple[int, object]]:
    for offset, text in lines:
        try:
            yield offset, json.loads(text)
        except json.JSONDecodeError as error:
            raise LoggedDataError(chunk.path, f"invalid JSON ({error.msg}, column {error.colno})",
                                  line=_line_number(chunk.path, offset)) from None


def _csv_records(chunk: Chunk, lines: Iterator[Tuple[int, str]]) -> Iterator[Tuple[int, dict]]:
    with open(chunk.path, "r", encoding="utf-8", newline="") as handle:
        header = next(csv.reader([handle.readline()]), [])
    header = [name.strip() for name in header]
    for offset, text in lines:
        cells = next(csv.reader([text]))
        if len(cells) != len(header):
            raise LoggedDataError(chunk.path, f"{len(cells)} cells for {len(header)} columns "
                                  "in the header", line=_line_number(chunk.path, offset))
        record = {}
        for name, cell in zip(header, cells):
            if cell == "":
                continue
            if name in _JSON_CELLS or (name in _MAYBE_JSON_CELLS and cell.lstrip().startswith("{")):
                try:
                    cell = json.loads(cell)
                except json.JSONDecodeError as error:
                    line = _line_number(chunk.path, offset)
                    raise LoggedDataError(chunk.path, f"invalid JSON in cell ({error.msg})",
                                          line=line, field=name) from None
            record[name] = cell
        yield offset, record


def locate(chunk: Chunk, order: int) -> dict:
    """``{"line": n}`` or ``{"row": n}`` (1-based) of the row at input position ``order``."""
    offset = int(order) & ((1 << ORDER_SHIFT) - 1)
    if chunk.format == "parquet":
        return {"row": offset + 1}
    return {"line": _line_number(chunk.path, offset)}


def _line_number(path: str, offset: int) -> int:
    """The 1-based line number of the line starting at byte ``offset``."""
    count = 0
    with open(path, "rb") as handle:
        remaining = offset
        while remaining > 0:
            block = handle.read(min(remaining, 1 << 20))
            if not block:
                break
            count += block.count(b"\n")
            remaining -= len(block)
    return count + 1


def _read_parquet(chunk: Chunk, reward_metric: Optional[str]):
    import pyarrow as pa
    import pyarrow.parquet as pq
    from .columnar import canonical_from_arrow
    if chunk.stop <= chunk.start:
        return None
    try:
        handle = pq.ParquetFile(chunk.path)
        wanted = [name for name in handle.schema_arrow.names if name in _PARQUET_COLUMNS]
        table = handle.read_row_groups(list(range(chunk.start, chunk.stop)), columns=wanted)
    except (OSError, pa.ArrowException) as error:
        raise LoggedDataError(chunk.path, f"cannot read Parquet ({error})") from None
    if table.num_rows == 0:
        return None
    return canonical_from_arrow(table, chunk.path, chunk.file_index, chunk.first_row, reward_metric)
