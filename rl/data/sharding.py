"""The Timeline run, sharded by ``mdp_id`` over pool workers in two phases.

Data flow (the coordinator passes paths and counts, never rows)::

    input files ──plan──> chunks (byte ranges at line ends / Parquet row groups)
        │
        phase 1, one task per chunk: read and validate the chunk, hash each row's
        mdp_id (CRC-32) into one of S shards, write  _scratch/sNNNNN/cMMMMMM.arrow
        (Arrow IPC with LZ4: several times faster to write and read than Parquet)
        │
        phase 2, one task per shard: read the shard's scratch files (every row of
        its MDPs, from every chunk), compute the Timeline, write  part-NNNNN.parquet
        │
    _SUCCESS written last, the directory renamed into place (rl.data.output)

A worker holds one chunk (phase 1) or one shard (phase 2) at a time, so memory is
bounded by ``chunk_bytes``/``chunk_rows`` and by the shard size (rows / S, or the
largest MDP when one dominates), never by the dataset. By default
``S = max(2 * workers, estimated rows / rows_per_shard)``.

All workers must see the output directory's file system (shared storage on a
cluster); scratch files live inside the temporary output directory.
"""
from __future__ import annotations

import dataclasses
import logging
import math
import zlib
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np

from .output import OUTPUT_FORMAT, AtomicDirectory, part_name
from .parallel import TaskRunner, run_all
from .readers import (DEFAULT_CHUNK_BYTES, DEFAULT_CHUNK_ROWS, Chunk, estimate_rows, find_inputs,
                      locate, plan_chunks, read_chunk)
from .schema import (ACTION, DISCRETE, MDP_ID, ORDER, PARAMETRIC, POSSIBLE_ACTIONS,
                     STATE_FEATURES, LoggedDataError, feature_sort_key, flat_map)
from .timeline import DEFAULT_REWARD_HORIZON, compute_timeline

logger = logging.getLogger(__name__)

DEFAULT_ROWS_PER_SHARD = 500_000
#: Feature ids and action names are listed in the metadata up to this many.
MAX_LISTED = 10_000


@dataclasses.dataclass(frozen=True)
class PartitionTask:
    """Phase 1: read one chunk and split its rows into shard files."""

    chunk: Chunk
    scratch: str
    shards: int
    reward_metric: Optional[str]


@dataclasses.dataclass
class PartitionResult:
    """What phase 1 learned about one chunk."""

    chunk: Chunk
    rows: int = 0
    shard_rows: Dict[int, int] = dataclasses.field(default_factory=dict)
    action_kind: Optional[str] = None
    first_order: int = 0
    possible_actions: bool = False
    feature_ids: Optional[List[str]] = dataclasses.field(default_factory=list)
    action_names: Optional[List[str]] = dataclasses.field(default_factory=list)


@dataclasses.dataclass(frozen=True)
class TimelineTask:
    """Phase 2: the Timeline of one shard."""

    shard: int
    files: Tuple[str, ...]
    out_path: str
    gamma: float
    reward_horizon: int
    possible_actions: bool
    metrics: bool


@dataclasses.dataclass
class ShardResult:
    """Counts of one written output shard."""

    shard: int
    file: str
    rows: int
    mdps: int
    duplicates: int


def shard_of(mdp_ids, shards: int) -> np.ndarray:
    """The shard of every row: CRC-32 of the UTF-8 ``mdp_id`` modulo ``shards``
    (the same in every process, unlike ``hash``)."""
    import pyarrow.compute as pc
    encoded = pc.dictionary_encode(mdp_ids)
    if hasattr(encoded, "combine_chunks"):
        encoded = encoded.combine_chunks()
    table = np.array([zlib.crc32(value.encode("utf-8")) % shards
                      for value in encoded.dictionary.to_pylist()], dtype=np.int64)
    return table[np.asarray(encoded.indices, dtype=np.int64)]


def scratch_name(chunk_index: int) -> str:
    """File name of a chunk's rows in a shard's scratch directory (Arrow IPC, LZ4)."""
    return f"c{chunk_index:06d}.arrow"


def scratch_dir(scratch: Union[str, Path], shard: int) -> Path:
    """Directory of shard ``shard``'s phase-1 files."""
    return Path(scratch) / f"s{shard:05d}"


def _unique_strings(array) -> Optional[List[str]]:
    import pyarrow.compute as pc
    unique = pc.unique(array)
    return None if len(unique) > MAX_LISTED else unique.to_pylist()


def partition_chunk(task: PartitionTask) -> PartitionResult:
    """Phase 1 (runs in a worker): validate a chunk and write its rows by shard."""
    import pyarrow as pa
    import pyarrow.feather as feather
    chunk = task.chunk
    table = read_chunk(chunk, task.reward_metric)
    result = PartitionResult(chunk)
    if table is None or table.num_rows == 0:
        return result
    shard = shard_of(table.column(MDP_ID), task.shards)
    order = np.argsort(shard, kind="stable")
    counts = np.bincount(shard, minlength=task.shards)
    table = table.take(order)
    start = 0
    for index, count in enumerate(counts.tolist()):
        if count:
            path = scratch_dir(task.scratch, index) / scratch_name(chunk.index)
            feather.write_feather(table.slice(start, count), path, compression="lz4")
            result.shard_rows[index] = count
            start += count
    action = table.column(ACTION).combine_chunks()
    result.rows = table.num_rows
    result.action_kind = DISCRETE if pa.types.is_string(action.type) else PARAMETRIC
    result.first_order = int(np.min(np.asarray(table.column(ORDER))))
    result.possible_actions = table.column(POSSIBLE_ACTIONS).null_count < table.num_rows
    result.feature_ids = _unique_strings(flat_map(table.column(STATE_FEATURES).combine_chunks())[1])
    result.action_names = _unique_strings(action) if result.action_kind == DISCRETE else None
    return result


def timeline_shard(task: TimelineTask) -> ShardResult:
    """Phase 2 (runs in a worker): the Timeline of one shard, written as Parquet."""
    import pyarrow as pa
    import pyarrow.feather as feather
    import pyarrow.parquet as pq
    table = pa.concat_tables([feather.read_table(path) for path in task.files])
    out = compute_timeline(table, task.gamma, task.reward_horizon,
                           with_possible_actions=task.possible_actions, with_metrics=task.metrics)
    del table
    # no dictionary pages or statistics: a third faster to write, a little larger
    pq.write_table(out, task.out_path, use_dictionary=False, write_statistics=False)
    terminal = np.asarray(out.column("terminal"), dtype=bool)
    time_diff = np.asarray(out.column("time_diff"))
    return ShardResult(task.shard, Path(task.out_path).name, out.num_rows, int(terminal.sum()),
                       int(np.sum(~terminal & (time_diff == 0))))


class _PhaseOne:
    """What the coordinator keeps of phase 1, folded in result by result: counts,
    each shard's scratch files, the first chunk of each action kind, and the
    feature ids and action names (dropped beyond MAX_LISTED)."""

    def __init__(self, scratch: Path) -> None:
        self.scratch = scratch
        self.rows = 0
        self.possible_actions = False
        self.files_of: Dict[int, List[str]] = {}
        self.first_of_kind: Dict[str, PartitionResult] = {}
        self.feature_ids: Optional[set] = set()
        self.action_names: Optional[set] = set()

    def add(self, part: PartitionResult) -> None:
        """Fold in one chunk's result."""
        if not part.rows:
            return
        self.rows += part.rows
        self.possible_actions |= part.possible_actions
        for shard in part.shard_rows:
            path = scratch_dir(self.scratch, shard) / scratch_name(part.chunk.index)
            self.files_of.setdefault(shard, []).append(str(path))
        known = self.first_of_kind.get(part.action_kind)
        if known is None or part.chunk.index < known.chunk.index:
            self.first_of_kind[part.action_kind] = dataclasses.replace(
                part, feature_ids=None, action_names=None)
        self.feature_ids = _union(self.feature_ids, part.feature_ids)
        self.action_names = _union(self.action_names, part.action_names)

    def action_kind(self) -> str:
        """The dataset's action kind; raises LoggedDataError when chunks disagree."""
        if len(self.first_of_kind) > 1:
            first, other = sorted(self.first_of_kind.values(), key=lambda p: p.chunk.index)[:2]
            where = locate(first.chunk, first.first_order)
            raise LoggedDataError(
                other.chunk.path, f"{other.action_kind} actions, but {first.chunk.path} "
                f"({', '.join(f'{k} {v}' for k, v in where.items())}) has "
                f"{first.action_kind} actions; a dataset has one kind", field=ACTION,
                **locate(other.chunk, other.first_order))
        return next(iter(self.first_of_kind))


def _union(merged: Optional[set], part: Optional[List[str]]) -> Optional[set]:
    if merged is None or part is None:
        return None
    merged.update(part)
    return merged if len(merged) <= MAX_LISTED else None


def _listed(values: Optional[set]) -> Optional[List[str]]:
    return None if values is None else sorted(values, key=feature_sort_key)


def default_shards(chunks: Sequence[Chunk], workers: int,
                   rows_per_shard: int = DEFAULT_ROWS_PER_SHARD) -> int:
    """``max(2 * workers, estimated rows / rows_per_shard)``."""
    rows = sum(estimate_rows(chunk) for chunk in chunks)
    return max(2 * workers, math.ceil(rows / rows_per_shard), 1)


def run_timeline(inputs: Any, out: Union[str, Path], gamma: float, *, workers: int = 1,
                 pool: Any = None, reward_metric: Optional[str] = None,
                 reward_horizon: int = DEFAULT_REWARD_HORIZON, shards: Optional[int] = None,
                 rows_per_shard: int = DEFAULT_ROWS_PER_SHARD, format: Optional[str] = None,
                 chunk_bytes: int = DEFAULT_CHUNK_BYTES, chunk_rows: int = DEFAULT_CHUNK_ROWS,
                 overwrite: bool = False, progress: bool = False) -> Dict[str, Any]:
    """Run the Timeline over logged rows and write Parquet shards to ``out``.

    ``inputs``: files, directories or glob patterns (JSON lines, CSV, Parquet; see
    :mod:`rl.data.readers`). ``gamma`` discounts ``episode_value`` per unit of
    sequence number. Work runs on ``pool`` if given, else on a ``fiberrl.Pool`` of
    ``workers`` processes (``workers == 1``: in this process). ``reward_metric``
    picks the reward when rewards are maps of metrics; ``reward_horizon`` bounds
    ``reward_timeline`` (-1: no bound). ``shards`` fixes the number of output
    shards. ``out`` must not exist unless ``overwrite``.

    Returns the metadata also written to ``out/_SUCCESS``. Raises
    :class:`LoggedDataError` on bad input, leaving nothing at ``out``.
    """
    if not 0.0 <= gamma <= 1.0:
        raise ValueError(f"gamma must be in [0, 1], got {gamma}")
    if reward_horizon < -1:
        raise ValueError(f"reward_horizon must be >= 0, or -1 for no limit, got {reward_horizon}")
    files = find_inputs(inputs)
    chunks = plan_chunks(files, format, chunk_bytes, chunk_rows)
    scale = getattr(pool, "processes", workers) if pool is not None else workers
    shards = shards or default_shards(chunks, scale, rows_per_shard)
    logger.info("timeline: %d files, %d chunks, %d shards", len(files), len(chunks), shards)
    with AtomicDirectory(out, overwrite) as target, TaskRunner(workers, pool, progress) as runner:
        for shard in range(shards):
            scratch_dir(target.scratch, shard).mkdir()
        tasks = [PartitionTask(chunk, str(target.scratch), shards, reward_metric)
                 for chunk in chunks]
        phase = _PhaseOne(target.scratch)
        for part in runner.imap(partition_chunk, tasks, "timeline: read"):
            phase.add(part)
        if phase.rows == 0:
            raise LoggedDataError(", ".join(map(str, files)), "no logged rows")
        kind = phase.action_kind()
        jobs = [TimelineTask(shard, tuple(sorted(paths)), str(target.tmp / part_name(shard)),
                             gamma, reward_horizon, phase.possible_actions,
                             reward_metric is not None)
                for shard, paths in sorted(phase.files_of.items())]
        results = run_all(runner, timeline_shard, jobs, "timeline: shards", key=lambda r: r.shard)
        metadata = {
            "format": OUTPUT_FORMAT, "version": 1,
            "rows": sum(r.rows for r in results), "mdps": sum(r.mdps for r in results),
            "duplicate_sequence_numbers": sum(r.duplicates for r in results),
            "gamma": gamma, "reward_horizon": reward_horizon, "reward_metric": reward_metric,
            "action_kind": kind, "possible_actions": phase.possible_actions,
            "state_features": _listed(phase.feature_ids),
            "actions": _listed(phase.action_names) if kind == DISCRETE else None,
            "shards": [r.file for r in results], "shard_rows": [r.rows for r in results],
            "inputs": [str(f) for f in files],
        }
        if metadata["duplicate_sequence_numbers"]:
            logger.warning("timeline: %d rows share their MDP's sequence number with the row "
                           "before; kept in input order with time_diff 0",
                           metadata["duplicate_sequence_numbers"])
        target.commit(metadata)
    logger.info("timeline: %d rows, %d MDPs -> %s", metadata["rows"], metadata["mdps"], out)
    return metadata
