"""Validate logged rows given as Python dicts (JSON lines, decoded CSV) and collect
them into the canonical Arrow columns of :mod:`rl.data.schema`.

Accepted values, field by field (anything else is a :class:`FieldError`, which the
reader turns into a :class:`~rl.data.schema.LoggedDataError` naming file and line):

- ``mdp_id``: a non-empty string, or an integer (kept as its decimal string);
- ``sequence_number``: an integer, an integral float or a string holding one;
- ``state_features``: an object ``{feature id: number}``; ids become strings; a
  ``null`` value means the feature is missing (the key is dropped); NaN and
  infinities are rejected; booleans count as 0/1;
- ``action``: a non-empty string (discrete), an integer (kept as its decimal
  string) or a feature object (parametric); all rows of a dataset have one kind;
- ``action_probability``: a number in (0, 1];
- ``reward``: a finite number, or an object of named metrics when a reward metric
  is chosen (the chosen metric becomes ``reward``, the object is kept as ``metrics``);
- ``possible_actions``: optional; a list of actions of the dataset's kind.

Other fields are ignored.
"""
from __future__ import annotations

import logging
import math
from typing import Any, List, Optional, Tuple

from .schema import (ACTION, ACTION_PROBABILITY, DISCRETE, MDP_ID, PARAMETRIC, POSSIBLE_ACTIONS,
                     REWARD, SEQUENCE_NUMBER, STATE_FEATURES, canonical_schema)

logger = logging.getLogger(__name__)

_INT64_MAX = 2 ** 63 - 1


class FieldError(ValueError):
    """One field of one record is invalid; the reader adds the file and line."""

    def __init__(self, field: Optional[str], message: str) -> None:
        self.field, self.message = field, message
        super().__init__(f"{field}: {message}" if field else message)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def mdp_id_value(value: Any) -> str:
    """A validated ``mdp_id``."""
    if value is None or value == "":
        raise FieldError(MDP_ID, "missing")
    if isinstance(value, str):
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    raise FieldError(MDP_ID, f"must be a string or an integer, got {value!r}")


def sequence_number_value(value: Any) -> int:
    """A validated ``sequence_number`` (an int64)."""
    if value is None or value == "":
        raise FieldError(SEQUENCE_NUMBER, "missing")
    number: Any = value
    if isinstance(value, str):
        text = value.strip()
        try:
            number = int(text)
        except ValueError:
            try:
                number = float(text)
            except ValueError:
                raise FieldError(SEQUENCE_NUMBER,
                                 f"must be an integer, got non-numeric {value!r}") from None
    if isinstance(number, float) and math.isfinite(number) and number.is_integer():
        number = int(number)
    if not isinstance(number, int) or isinstance(number, bool):
        raise FieldError(SEQUENCE_NUMBER, f"must be an integer, got {value!r}")
    if abs(number) > _INT64_MAX:
        raise FieldError(SEQUENCE_NUMBER, f"does not fit in 64 bits: {value!r}")
    return number


def real_value(value: Any, field: str) -> float:
    """A finite number (numeric strings accepted)."""
    if value is None or value == "":
        raise FieldError(field, "missing")
    number: Any = value
    if isinstance(value, str):
        try:
            number = float(value)
        except ValueError:
            raise FieldError(field, f"must be a number, got {value!r}") from None
    if not _is_number(number) or not math.isfinite(number):
        raise FieldError(field, f"must be a finite number, got {value!r}")
    return float(number)


def probability_value(value: Any) -> float:
    """A validated ``action_probability`` in (0, 1]."""
    probability = real_value(value, ACTION_PROBABILITY)
    if not 0.0 < probability <= 1.0:
        raise FieldError(ACTION_PROBABILITY, f"must be in (0, 1], got {value!r}")
    return probability


def feature_items(value: Any, field: str) -> Tuple[List[str], List[float]]:
    """Keys and values of a feature object; ``null`` values (missing features) dropped."""
    if value is None:
        raise FieldError(field, "missing")
    if not isinstance(value, dict):
        raise FieldError(field, f"must be an object of feature id -> number, got {value!r}")
    keys, values = [], []
    for key, item in value.items():
        if item is None:
            continue
        if not isinstance(item, (int, float)) or not math.isfinite(item):
            raise FieldError(field, f"feature {key!r} must be a finite number, got {item!r}")
        keys.append(str(key))
        values.append(float(item))
    return keys, values


def action_value(value: Any, field: str = ACTION) -> Tuple[str, Any]:
    """``(kind, action)``: a discrete name or parametric ``(keys, values)``."""
    if isinstance(value, dict):
        return PARAMETRIC, feature_items(value, field)
    if value is None or value == "":
        raise FieldError(field, "missing")
    if isinstance(value, str):
        return DISCRETE, value
    if isinstance(value, int) and not isinstance(value, bool):
        return DISCRETE, str(value)
    raise FieldError(field, f"must be a string (discrete) or an object (parametric), got {value!r}")


class RecordBuilder:
    """Validates records one at a time and builds the canonical Arrow table.

    ``reward_metric`` names the metric used as the reward when rewards are metric
    objects; ``add`` raises :class:`FieldError` on the first invalid field.
    """

    def __init__(self, reward_metric: Optional[str] = None) -> None:
        self.reward_metric = reward_metric
        self.kind: Optional[str] = None
        self.rows = 0
        self._mdp: List[str] = []
        self._seq: List[int] = []
        self._order: List[int] = []
        self._state = _MapColumn()
        self._discrete: List[str] = []
        self._parametric = _MapColumn()
        self._probability: List[float] = []
        self._reward: List[float] = []
        self._metrics = _MapColumn(nullable=True)
        self._possible_offsets = [0]
        self._possible_valid: List[bool] = []
        self._possible_names: List[str] = []
        self._possible_maps = _MapColumn()

    def add(self, record: Any, order: int) -> None:
        """Validate ``record`` and append it; ``order`` is its input position."""
        if not isinstance(record, dict):
            raise FieldError(None, f"expected an object per row, got {type(record).__name__}")
        mdp = mdp_id_value(record.get(MDP_ID))
        seq = sequence_number_value(record.get(SEQUENCE_NUMBER))
        state = feature_items(record.get(STATE_FEATURES), STATE_FEATURES)
        kind, action = action_value(record.get(ACTION))
        if self.kind is not None and kind != self.kind:
            raise FieldError(ACTION, f"a {kind} action, but earlier rows have {self.kind} actions")
        probability = probability_value(record.get(ACTION_PROBABILITY))
        reward, metrics = self._reward_value(record.get(REWARD))
        possible = self._possible_value(record.get(POSSIBLE_ACTIONS), kind)
        self.kind = kind
        self._mdp.append(mdp)
        self._seq.append(seq)
        self._order.append(order)
        self._state.append(*state)
        if kind == DISCRETE:
            self._discrete.append(action)
        else:
            self._parametric.append(*action)
        self._probability.append(probability)
        self._reward.append(reward)
        if metrics is None:
            self._metrics.append_null()
        else:
            self._metrics.append(*metrics)
        self._possible_valid.append(possible is not None)
        for item in possible or ():
            if kind == DISCRETE:
                self._possible_names.append(item)
            else:
                self._possible_maps.append(*item)
        self._possible_offsets.append(self._possible_offsets[-1] + len(possible or ()))
        self.rows += 1

    def _reward_value(self, value: Any) -> Tuple[float, Optional[Tuple[list, list]]]:
        if isinstance(value, dict):
            if self.reward_metric is None:
                raise FieldError(REWARD, f"is an object of metrics {sorted(map(str, value))}; "
                                         "choose the reward with a reward metric")
            metrics = feature_items(value, REWARD)
            if self.reward_metric not in metrics[0]:
                raise FieldError(REWARD, f"has no metric {self.reward_metric!r} "
                                         f"(metrics: {sorted(metrics[0])})")
            return metrics[1][metrics[0].index(self.reward_metric)], metrics
        if self.reward_metric is not None:
            raise FieldError(REWARD, f"is a number, but reward metric {self.reward_metric!r} was "
                                     "chosen (rewards must be objects of metrics)")
        return real_value(value, REWARD), None

    @staticmethod
    def _possible_value(value: Any, kind: str) -> Optional[list]:
        if value is None:
            return None
        if not isinstance(value, list):
            raise FieldError(POSSIBLE_ACTIONS, f"must be a list of actions, got {value!r}")
        items = []
        for item in value:
            item_kind, action = action_value(item, POSSIBLE_ACTIONS)
            if item_kind != kind:
                raise FieldError(POSSIBLE_ACTIONS, f"holds a {item_kind} action but the action "
                                                   f"is {kind}")
            items.append(action)
        return items

    def table(self):
        """The canonical table of the rows added so far (None when there are none)."""
        import pyarrow as pa
        if self.kind is None:
            return None
        schema = canonical_schema(self.kind)
        action = (pa.array(self._discrete, pa.string()) if self.kind == DISCRETE
                  else self._parametric.array())
        values = self._possible_names if self.kind == DISCRETE else self._possible_maps.array()
        possible = pa.ListArray.from_arrays(
            pa.array(self._possible_offsets, pa.int32()),
            pa.array(values, pa.string()) if self.kind == DISCRETE else values,
            type=schema.field(POSSIBLE_ACTIONS).type,
            mask=pa.array([not valid for valid in self._possible_valid], pa.bool_()))
        columns = [pa.array(self._mdp, pa.string()), pa.array(self._seq, pa.int64()),
                   pa.array(self._order, pa.int64()), self._state.array(), action,
                   pa.array(self._probability, pa.float64()), pa.array(self._reward, pa.float64()),
                   self._metrics.array(), possible]
        return pa.Table.from_arrays(columns, schema=schema)


class _MapColumn:
    """Offsets, keys and values of a ``map<string, double>`` column being built."""

    def __init__(self, nullable: bool = False) -> None:
        self.offsets = [0]
        self.keys: List[str] = []
        self.values: List[float] = []
        self.valid: Optional[List[bool]] = [] if nullable else None

    def append(self, keys: List[str], values: List[float]) -> None:
        """Append one map."""
        self.keys.extend(keys)
        self.values.extend(values)
        self.offsets.append(len(self.keys))
        if self.valid is not None:
            self.valid.append(True)

    def append_null(self) -> None:
        """Append a null (absent) map."""
        self.offsets.append(len(self.keys))
        self.valid.append(False)

    def array(self):
        """The ``map<string, double>`` array built so far."""
        import pyarrow as pa
        mask = None if self.valid is None else pa.array([not v for v in self.valid], pa.bool_())
        return pa.MapArray.from_arrays(pa.array(self.offsets, pa.int32()),
                                       pa.array(self.keys, pa.string()),
                                       pa.array(self.values, pa.float64()), mask=mask)
