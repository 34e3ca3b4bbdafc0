"""Validate logged rows given as an Arrow table (read from Parquet) and convert them
to the canonical columns of :mod:`rl.data.schema`, with vectorized checks.

The rules are those of :mod:`rl.data.records` (the JSON-lines and CSV path), so a
dataset gives the same Timeline whatever its format. Column types accepted:

- ``mdp_id``: string or integer; ``sequence_number``: integer, integral floating
  point or numeric string; ``action_probability`` and ``reward``: numeric (or
  numeric string);
- ``state_features`` (and parametric ``action``, metric ``reward``): a map with
  string or integer keys and numeric values, or a struct of numeric fields (as
  pandas writes dicts); null values are missing features;
- ``possible_actions``: optional list of actions of the dataset's kind.

Errors name the file, the 1-based row within the file and the field.
"""
from __future__ import annotations

import logging
from typing import Optional

import numpy as np

from .schema import (ACTION, ACTION_PROBABILITY, DISCRETE, MDP_ID, METRICS, ORDER_SHIFT,
                     PARAMETRIC, POSSIBLE_ACTIONS, REQUIRED_FIELDS, REWARD, SEQUENCE_NUMBER,
                     STATE_FEATURES, LoggedDataError, canonical_schema, flat_map)

logger = logging.getLogger(__name__)


class RowLocator:
    """The file and first row of the table being converted, for error messages."""

    def __init__(self, path: str, first_row: int, offsets: Optional[np.ndarray] = None) -> None:
        self.path, self.first_row, self.offsets = path, first_row, offsets

    def elements(self, offsets: np.ndarray) -> "RowLocator":
        """A locator for the flattened elements of a list column with ``offsets``."""
        return RowLocator(self.path, self.first_row, offsets)

    def fail(self, index: Optional[int], field: str, message: str) -> LoggedDataError:
        """The error for row (or element) ``index`` of the table (None: the whole column)."""
        if index is not None and self.offsets is not None:
            index = int(np.searchsorted(self.offsets, index, side="right")) - 1
        row = None if index is None else self.first_row + int(index) + 1
        return LoggedDataError(self.path, message, row=row, field=field)

    def check(self, bad: np.ndarray, field: str, message) -> None:
        """Raise for the first True of ``bad``; ``message`` is a text or ``f(index)``."""
        if bad.any():
            index = int(np.argmax(bad))
            raise self.fail(index, field, message(index) if callable(message) else message)


def _kind_of(type_) -> str:
    import pyarrow as pa
    if pa.types.is_map(type_) or pa.types.is_struct(type_):
        return "map"
    if pa.types.is_string(type_) or pa.types.is_large_string(type_):
        return "string"
    if pa.types.is_integer(type_):
        return "integer"
    if pa.types.is_floating(type_) or pa.types.is_decimal(type_):
        return "floating"
    if pa.types.is_null(type_):
        return "null"
    return str(type_)


def _nulls(array) -> np.ndarray:
    return np.asarray(array.is_null(), dtype=bool)


def _require_valid(array, where: RowLocator, field: str) -> None:
    if array.null_count:
        where.check(_nulls(array), field, "missing")


def _mdp_ids(array, where: RowLocator):
    import pyarrow as pa
    import pyarrow.compute as pc
    if _kind_of(array.type) not in ("string", "integer", "null"):
        raise where.fail(None, MDP_ID, f"must be strings or integers, the column is {array.type}")
    _require_valid(array, where, MDP_ID)
    array = pc.cast(array, pa.string())
    where.check(np.asarray(pc.equal(array, ""), dtype=bool), MDP_ID, "missing")
    return array


def _numbers(array, where: RowLocator, field: str) -> np.ndarray:
    """float64 values of a numeric (or numeric-string) column, nulls rejected."""
    import pyarrow as pa
    import pyarrow.compute as pc
    kind = _kind_of(array.type)
    _require_valid(array, where, field)
    if kind == "string":
        try:
            return np.asarray(pc.cast(array, pa.float64()))
        except pa.ArrowInvalid:
            texts = array.to_pylist()
            for index, text in enumerate(texts):
                try:
                    float(text)
                except ValueError:
                    raise where.fail(index, field, f"must be a number, got {text!r}") from None
            raise
    if kind not in ("integer", "floating"):
        raise where.fail(None, field, f"must be numeric, the column is {array.type}")
    return np.asarray(pc.cast(array, pa.float64()).to_numpy(zero_copy_only=False), dtype=np.float64)


def _sequence_numbers(array, where: RowLocator) -> np.ndarray:
    import pyarrow as pa
    import pyarrow.compute as pc
    kind = _kind_of(array.type)
    _require_valid(array, where, SEQUENCE_NUMBER)
    if kind == "integer":
        try:
            return np.asarray(pc.cast(array, pa.int64()))
        except pa.ArrowInvalid:
            raise where.fail(None, SEQUENCE_NUMBER, "does not fit in 64 bits") from None
    if kind == "string":
        texts = array.to_pylist()
        from .records import FieldError, sequence_number_value
        values = np.empty(len(texts), np.int64)
        for index, text in enumerate(texts):
            try:
                values[index] = sequence_number_value(text)
            except FieldError as error:
                raise where.fail(index, SEQUENCE_NUMBER, error.message) from None
        return values
    if kind != "floating":
        raise where.fail(None, SEQUENCE_NUMBER, f"must be integers, the column is {array.type}")
    values = _numbers(array, where, SEQUENCE_NUMBER)
    bad = ~np.isfinite(values) | (values != np.round(values)) | (np.abs(values) > 2.0 ** 63)
    where.check(bad, SEQUENCE_NUMBER, lambda i: f"must be an integer, got {float(values[i])!r}")
    return values.astype(np.int64)


def _struct_to_map(array):
    import pyarrow as pa
    names = [array.type.field(i).name for i in range(array.type.num_fields)]
    children = array.flatten()
    n, k = len(array), len(names)
    valid = np.zeros((n, k), bool)
    values = np.zeros((n, k), np.float64)
    for j, child in enumerate(children):
        if not pa.types.is_null(child.type):
            valid[:, j] = ~_nulls(child)
            values[:, j] = np.asarray(child.cast(pa.float64()).fill_null(0.0))
    offsets = np.concatenate([[0], np.cumsum(valid.sum(axis=1))]).astype(np.int32)
    keys = np.broadcast_to(np.asarray(names, dtype=object), (n, k))[valid]
    return pa.MapArray.from_arrays(offsets, pa.array(keys, pa.string()), values[valid],
                                   mask=array.is_null())


def feature_maps(array, where: RowLocator, field: str, nullable: bool = False):
    """A cleaned ``map<string, double>``: string keys, null items dropped, finite values."""
    import pyarrow as pa
    import pyarrow.compute as pc
    if pa.types.is_struct(array.type):
        array = _struct_to_map(array)
    if not pa.types.is_map(array.type):
        raise where.fail(None, field, f"must be a map of feature id -> number, the column is "
                                      f"{array.type}")
    if not nullable:
        _require_valid(array, where, field)
    offsets, keys, items = flat_map(array)
    keys = pc.cast(keys, pa.string())
    try:
        items = pc.cast(items, pa.float64())
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        raise where.fail(None, field, f"values must be numbers, the map is {array.type}") from None
    present = ~_nulls(items)
    values = np.asarray(items.fill_null(0.0))
    bad = present & ~np.isfinite(values)
    if bad.any():
        item = int(np.argmax(bad))
        message = (f"feature {keys[item].as_py()!r} must be a finite number, "
                   f"got {float(values[item])!r}")
        raise where.elements(offsets).fail(item, field, message)
    if not present.all():
        kept = np.concatenate([[0], np.cumsum(present)])
        offsets = kept[offsets]
        keys, values = keys.filter(pa.array(present)), values[present]
    return pa.MapArray.from_arrays(offsets.astype(np.int32), keys, pa.array(values, pa.float64()),
                                   mask=array.is_null() if array.null_count else None)


def _actions(array, where: RowLocator, field: str = ACTION, nullable: bool = False):
    """``(kind, array)``: discrete names (string) or parametric feature maps."""
    import pyarrow as pa
    import pyarrow.compute as pc
    kind = _kind_of(array.type)
    if kind == "map":
        return PARAMETRIC, feature_maps(array, where, field, nullable)
    if kind not in ("string", "integer"):
        raise where.fail(None, field, f"must be strings (discrete) or maps (parametric), the "
                                      f"column is {array.type}")
    if not nullable:
        _require_valid(array, where, field)
    array = pc.cast(array, pa.string())
    where.check(np.asarray(pc.fill_null(pc.equal(array, ""), False), dtype=bool), field, "missing")
    return DISCRETE, array


def _possible_actions(array, where: RowLocator, kind: str):
    import pyarrow as pa
    if not (pa.types.is_list(array.type) or pa.types.is_large_list(array.type)):
        raise where.fail(None, POSSIBLE_ACTIONS, f"must be lists of actions, the column is "
                                                 f"{array.type}")
    offsets, values, _ = flat_map(array)
    item_kind, values = _actions(values, where.elements(offsets), POSSIBLE_ACTIONS)
    if item_kind != kind:
        raise where.fail(None, POSSIBLE_ACTIONS, f"holds {item_kind} actions but the action is "
                                                 f"{kind}")
    return pa.ListArray.from_arrays(pa.array(offsets, pa.int32()), values,
                                    mask=array.is_null() if array.null_count else None)


def canonical_from_arrow(table, path: str, file_index: int, first_row: int = 0,
                         reward_metric: Optional[str] = None):
    """Validate an Arrow table of logged rows and return the canonical table.

    ``first_row`` is the number of rows of the file before ``table`` (for error
    messages and input positions); raises :class:`LoggedDataError`.
    """
    import pyarrow as pa
    import pyarrow.compute as pc
    where = RowLocator(str(path), first_row)
    for field in REQUIRED_FIELDS:
        if field not in table.column_names:
            raise where.fail(None, field, f"missing column (columns: {table.column_names})")
    column = {name: table.column(name).combine_chunks() for name in table.column_names}
    n = table.num_rows
    mdp = _mdp_ids(column[MDP_ID], where)
    seq = _sequence_numbers(column[SEQUENCE_NUMBER], where)
    state = feature_maps(column[STATE_FEATURES], where, STATE_FEATURES)
    kind, action = _actions(column[ACTION], where)
    probability = _numbers(column[ACTION_PROBABILITY], where, ACTION_PROBABILITY)
    where.check(~((probability > 0.0) & (probability <= 1.0)), ACTION_PROBABILITY,
                lambda i: f"must be in (0, 1], got {float(probability[i])!r}")
    reward_column = column[REWARD]
    metrics = pa.nulls(n, canonical_schema(kind).field(METRICS).type)
    if _kind_of(reward_column.type) == "map":
        if reward_metric is None:
            raise where.fail(0, REWARD, "is a map of metrics; choose the reward with a reward "
                                        "metric")
        metrics = feature_maps(reward_column, where, REWARD)
        chosen = pc.map_lookup(metrics, pa.scalar(reward_metric), "first")
        where.check(_nulls(chosen), REWARD, f"has no metric {reward_metric!r}")
        reward = np.asarray(chosen, dtype=np.float64)
    else:
        if reward_metric is not None:
            raise where.fail(0, REWARD, f"is a number, but reward metric {reward_metric!r} was "
                                        "chosen (rewards must be maps of metrics)")
        reward = _numbers(reward_column, where, REWARD)
        where.check(~np.isfinite(reward), REWARD,
                    lambda i: f"must be a finite number, got {float(reward[i])!r}")
    schema = canonical_schema(kind)
    if POSSIBLE_ACTIONS in column:
        possible = _possible_actions(column[POSSIBLE_ACTIONS], where, kind)
    else:
        possible = pa.nulls(n, schema.field(POSSIBLE_ACTIONS).type)
    order = (np.int64(file_index) << ORDER_SHIFT) + first_row + np.arange(n, dtype=np.int64)
    possible = possible.cast(schema.field(POSSIBLE_ACTIONS).type)
    return pa.Table.from_arrays(
        [mdp, pa.array(seq, pa.int64()), pa.array(order), state, action,
         pa.array(probability), pa.array(reward), metrics, possible], schema=schema)
