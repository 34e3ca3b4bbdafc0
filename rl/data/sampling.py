"""A uniform sample of every feature's values, gathered in parallel.

Each pool task reads one chunk of the input (a Timeline output's shards or logged
files) and keeps, per feature, the values with the ``size`` smallest random
priorities ("bottom-k" sampling). Because priorities are i.i.d. uniform, the
``size`` smallest over all chunks are a uniform sample without replacement of all
the values: the coordinator merges the chunks' samples by keeping the smallest
priorities again, so it holds at most ``size`` values per feature plus one
chunk's result. Priorities are seeded by ``(seed, chunk index)``, so the sample
does not depend on the number of workers.

Only present values count: a missing feature contributes nothing.
"""
from __future__ import annotations

import dataclasses
import logging
from pathlib import Path
from typing import Any, Dict, Optional, Tuple

import numpy as np

from .parallel import TaskRunner
from .readers import Chunk, find_inputs, plan_chunks, read_chunk
from .schema import STATE_FEATURES, LoggedDataError, flat_map

logger = logging.getLogger(__name__)

DEFAULT_SAMPLE_SIZE = 10_000


@dataclasses.dataclass(frozen=True)
class SampleTask:
    """Sample the feature map column ``field`` of one chunk."""

    chunk: Chunk
    field: str
    size: int
    seed: int
    reward_metric: Optional[str] = None


@dataclasses.dataclass
class FeatureSample:
    """Per feature id: sampled values, their priorities, and how many values were seen."""

    values: Dict[str, np.ndarray] = dataclasses.field(default_factory=dict)
    priorities: Dict[str, np.ndarray] = dataclasses.field(default_factory=dict)
    counts: Dict[str, int] = dataclasses.field(default_factory=dict)

    def merge(self, other: "FeatureSample", size: int) -> None:
        """Fold ``other`` in, keeping the ``size`` smallest priorities per feature."""
        for feature, values in other.values.items():
            priorities = other.priorities[feature]
            if feature in self.values:
                values = np.concatenate([self.values[feature], values])
                priorities = np.concatenate([self.priorities[feature], priorities])
            if len(values) > size:
                keep = np.argpartition(priorities, size - 1)[:size]
                values, priorities = values[keep], priorities[keep]
            self.values[feature], self.priorities[feature] = values, priorities
            self.counts[feature] = self.counts.get(feature, 0) + other.counts[feature]


def _feature_column(task: SampleTask):
    chunk = task.chunk
    if chunk.format == "parquet":
        import pyarrow.parquet as pq
        from .columnar import RowLocator, feature_maps
        handle = pq.ParquetFile(chunk.path)
        if task.field not in handle.schema_arrow.names:
            raise LoggedDataError(chunk.path, "missing column", field=task.field)
        table = handle.read_row_groups(list(range(chunk.start, chunk.stop)), columns=[task.field])
        return feature_maps(table.column(task.field).combine_chunks(),
                            RowLocator(chunk.path, chunk.first_row), task.field)
    table = read_chunk(chunk, task.reward_metric)
    if table is None:
        return None
    if task.field not in table.column_names:
        raise LoggedDataError(chunk.path, "logged rows have no such feature map", field=task.field)
    column = table.column(task.field).combine_chunks()
    if column.type != table.schema.field(STATE_FEATURES).type:
        raise ValueError(f"{chunk.path}: field {task.field!r} is not a feature map")
    return column


def sample_chunk(task: SampleTask) -> FeatureSample:
    """Pool task: the bottom-``size`` sample of each feature of one chunk."""
    import pyarrow.compute as pc
    sample = FeatureSample()
    maps = _feature_column(task)
    if maps is None:
        return sample
    _, keys, items = flat_map(maps)
    if len(keys) == 0:
        return sample
    encoded = pc.dictionary_encode(keys)
    codes = np.asarray(encoded.indices, dtype=np.int64)
    names = encoded.dictionary.to_pylist()
    values = np.asarray(items, dtype=np.float64)
    priorities = np.random.default_rng([task.seed, task.chunk.index]).random(len(values))
    order = np.lexsort((priorities, codes))
    codes, values, priorities = codes[order], values[order], priorities[order]
    starts = np.flatnonzero(np.concatenate([[True], codes[1:] != codes[:-1]]))
    stops = np.concatenate([starts[1:], [len(codes)]])
    for start, stop in zip(starts.tolist(), stops.tolist()):
        feature = names[codes[start]]
        end = min(stop, start + task.size)
        sample.values[feature] = values[start:end].copy()
        sample.priorities[feature] = priorities[start:end].copy()
        sample.counts[feature] = stop - start
    return sample


def input_chunks(inputs: Any, format: Optional[str] = None) -> list:
    """Chunks of ``inputs``: a Timeline output directory (its shards) or logged files."""
    from .output import SUCCESS, part_files
    paths = [inputs] if isinstance(inputs, (str, Path)) else list(inputs)
    files = []
    for path in paths:
        if Path(path).is_dir() and (Path(path) / SUCCESS).is_file():
            files.extend(part_files(path))
        else:
            files.extend(find_inputs(path))
    return plan_chunks(files, format)


def sample_features(inputs: Any, field: str = STATE_FEATURES, size: int = DEFAULT_SAMPLE_SIZE,
                    seed: int = 0, *, workers: int = 1, pool: Any = None,
                    reward_metric: Optional[str] = None, format: Optional[str] = None,
                    progress: bool = False) -> Tuple[Dict[str, np.ndarray], Dict[str, int]]:
    """``(samples, counts)``: up to ``size`` uniformly sampled values of every feature of
    the map column ``field``, and how many values of each were seen in all."""
    if size < 1:
        raise ValueError(f"size must be positive, got {size}")
    chunks = input_chunks(inputs, format)
    merged = FeatureSample()
    with TaskRunner(workers, pool, progress) as runner:
        tasks = [SampleTask(chunk, field, size, seed, reward_metric) for chunk in chunks]
        for sample in runner.imap(sample_chunk, tasks, "normalize: sample"):
            merged.merge(sample, size)
    # the merge order varies with completion order: sort by priority for a fixed result
    samples = {}
    for feature, values in merged.values.items():
        samples[feature] = values[np.argsort(merged.priorities[feature], kind="stable")]
    return samples, dict(merged.counts)
