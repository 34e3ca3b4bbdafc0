"""Load a Timeline output directory: as an Arrow table, or as dense numpy arrays
ready for training.

:func:`read_transitions` turns feature maps into dense matrices over an ordered
feature list, with a presence mask (a missing feature reads as 0.0 with presence
False; features not in the list are dropped). For Gridworld logs from
:mod:`rl.data.generate` (state ``{"<cell>": 1.0}``) the dense state over the ids
``"0" .. "24"`` is exactly the one-hot observation.
"""
from __future__ import annotations

import logging
from pathlib import Path
from typing import Dict, Optional, Sequence, Tuple, Union

import numpy as np

from .output import part_files, read_metadata
from .schema import feature_sort_key, flat_map

logger = logging.getLogger(__name__)

PathLike = Union[str, Path]


def read_table(directory: PathLike, columns: Optional[Sequence[str]] = None,
               shard: Tuple[int, int] = (0, 1)):
    """The shards of a complete Timeline output as one Arrow table (only ``columns``
    when given). ``shard=(rank, world_size)`` keeps the output shards ``i`` with
    ``i % world_size == rank`` (a whole MDP is always in one output shard).
    Raises ValueError for an incomplete directory."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    rank, world_size = shard
    if not 0 <= rank < world_size:
        raise ValueError(f"shard must be (rank, world_size) with 0 <= rank < world_size, got {shard}")
    paths = part_files(directory)[rank::world_size]
    if not paths:
        raise ValueError(f"{directory}: no output shard for rank {rank} of {world_size} "
                         f"(write the Timeline with at least {world_size} shards)")
    tables = [pq.read_table(path, columns=list(columns) if columns else None) for path in paths]
    return pa.concat_tables(tables)


def dense_features(maps, feature_ids: Sequence[str]) -> Tuple[np.ndarray, np.ndarray]:
    """``(values float32 [N, F], presence bool [N, F])`` of a ``map<string, double>``
    array over ``feature_ids`` (in that order)."""
    import pyarrow as pa
    import pyarrow.compute as pc
    if hasattr(maps, "combine_chunks"):
        maps = maps.combine_chunks()
    n, width = len(maps), len(feature_ids)
    values = np.zeros((n, width), np.float32)
    presence = np.zeros((n, width), bool)
    offsets, keys, items = flat_map(maps)
    if len(keys) == 0 or width == 0:
        return values, presence
    column = np.asarray(pc.index_in(keys, value_set=pa.array(list(feature_ids), pa.string()))
                        .fill_null(-1), dtype=np.int64)
    row = np.repeat(np.arange(n), np.diff(offsets))
    keep = column >= 0
    values[row[keep], column[keep]] = np.asarray(items, dtype=np.float64)[keep]
    presence[row[keep], column[keep]] = True
    return values, presence


def _action_indices(actions, names: Sequence[str], allow_empty: bool) -> np.ndarray:
    import pyarrow as pa
    import pyarrow.compute as pc
    if hasattr(actions, "combine_chunks"):
        actions = actions.combine_chunks()
    index = pc.index_in(actions, value_set=pa.array(list(names), pa.string()))
    result = np.asarray(index.fill_null(-1), dtype=np.int64)
    unknown = result < 0
    if allow_empty:
        unknown &= np.asarray(pc.not_equal(actions, ""), dtype=bool)
    if unknown.any():
        bad = actions[int(np.argmax(unknown))].as_py()
        raise ValueError(f"action {bad!r} is not in action_names {list(names)}")
    return result


def _action_mask(lists, names: Sequence[str], null_means_all: bool) -> np.ndarray:
    """bool [N, A]: which of ``names`` each list holds (a null list: all or none)."""
    if hasattr(lists, "combine_chunks"):
        lists = lists.combine_chunks()
    n = len(lists)
    mask = np.zeros((n, len(names)), bool)
    offsets, values, _ = flat_map(lists)
    if len(values):
        column = _action_indices(values, names, allow_empty=False)
        row = np.repeat(np.arange(n), np.diff(offsets))
        mask[row, column] = True
    nulls = np.asarray(lists.is_null(), dtype=bool)
    mask[nulls] = null_means_all
    return mask


def read_transitions(directory: PathLike, state_features: Optional[Sequence[str]] = None,
                     action_names: Optional[Sequence[str]] = None,
                     shard: Tuple[int, int] = (0, 1)) -> Dict[str, np.ndarray]:
    """A Timeline output as numpy arrays, one row per transition (``shard``: only the
    output shards of one rank, see :func:`read_table`).

    ``state_features``: the ordered feature ids of the dense state (default: every id
    in the output's metadata, integer ids numerically first). ``action_names``:
    discrete actions in index order (default: the metadata's sorted names; pass the
    env's order, e.g. ``Gridworld.ACTION_NAMES``, to match env action indices).

    Keys: ``state``/``next_state`` (float32 [N, F]) with ``state_present``/
    ``next_state_present`` (bool [N, F]); ``action``/``next_action`` (int64 indices
    into ``action_names``, ``next_action`` -1 on terminal rows) for discrete actions,
    or float32 matrices with presence masks (``action_present``...) over
    ``action_features`` for parametric ones; ``action_probability``,
    ``next_action_probability``, ``reward``, ``episode_value`` (float64);
    ``terminal`` (bool); ``mdp_id`` (str), ``sequence_number``,
    ``sequence_number_ordinal``, ``time_diff`` (int64); for discrete actions
    ``possible_actions`` and ``possible_next_actions`` (bool [N, A], when logged; a
    row that logged none allows every action, a terminal row's next allows none;
    parametric possible actions stay in :func:`read_table`); and the lists used:
    ``state_features``, ``action_names`` or ``action_features`` (str arrays).
    """
    metadata = read_metadata(directory)
    table = read_table(directory, shard=shard)
    if state_features is None:
        state_features = metadata.get("state_features")
        if state_features is None:
            raise ValueError(f"{directory}: too many feature ids to list; pass state_features")
    state_features = [str(f) for f in state_features]
    out: Dict[str, np.ndarray] = {}
    for name in ("mdp_id",):
        out[name] = np.asarray(table.column(name).to_pylist(), dtype=object)
    for name in ("sequence_number", "sequence_number_ordinal", "time_diff"):
        out[name] = np.asarray(table.column(name), dtype=np.int64)
    for name in ("action_probability", "next_action_probability", "reward", "episode_value"):
        out[name] = np.asarray(table.column(name), dtype=np.float64)
    out["terminal"] = np.asarray(table.column("terminal"), dtype=bool)
    out["state"], out["state_present"] = dense_features(table.column("state_features"),
                                                        state_features)
    out["next_state"], out["next_state_present"] = dense_features(
        table.column("next_state_features"), state_features)
    out["state_features"] = np.asarray(state_features, dtype=str)
    if metadata["action_kind"] == "discrete":
        names = list(action_names) if action_names is not None else metadata.get("actions")
        if names is None:
            raise ValueError(f"{directory}: too many action names to list; pass action_names")
        names = [str(a) for a in names]
        out["action"] = _action_indices(table.column("action"), names, allow_empty=False)
        out["next_action"] = _action_indices(table.column("next_action"), names, allow_empty=True)
        if metadata.get("possible_actions"):
            out["possible_actions"] = _action_mask(table.column("possible_actions"), names, True)
            out["possible_next_actions"] = _action_mask(table.column("possible_next_actions"),
                                                        names, True)
            out["possible_next_actions"][out["terminal"]] = False
        out["action_names"] = np.asarray(names, dtype=str)
    else:
        import pyarrow.compute as pc
        keys = flat_map(table.column("action").combine_chunks())[1]
        features = sorted(pc.unique(keys).to_pylist(), key=feature_sort_key)
        out["action"], out["action_present"] = dense_features(table.column("action"), features)
        out["next_action"], out["next_action_present"] = dense_features(
            table.column("next_action"), features)
        out["action_features"] = np.asarray(features, dtype=str)
    return out
