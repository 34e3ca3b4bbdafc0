"""The Timeline operator: logged rows of whole MDPs -> training transitions.

:func:`compute_timeline` takes canonical rows (:mod:`rl.data.schema`) holding every
row of each of their MDPs, in any order, and returns one output row per input row:

==============================  ==============================================================
column                          meaning
==============================  ==============================================================
``mdp_id``                      the MDP (episode) the row belongs to
``sequence_number``             the logged sequence number (a timestamp, not necessarily
                                consecutive)
``sequence_number_ordinal``     1, 2, ... : the row's rank within its MDP
``time_diff``                   next row's sequence number minus this one's; 0 on the
                                terminal row (as in Horizon) and between duplicates
``time_since_first``            sequence number minus the MDP's first sequence number
``state_features``              as logged (missing features are absent keys, never NaN)
``action``                      as logged: a string (discrete) or a feature map (parametric)
``action_probability``          as logged, in (0, 1]
``reward``                      the reward (the chosen metric when rewards are metric maps)
``metrics``                     (only with metric rewards) every logged metric of the row
``possible_actions``            (only when given) as logged; null on rows that had none
``next_state_features``         the next row's state; ``{}`` on the terminal row
``next_action``                 the next row's action; ``""`` (discrete) or ``{}``
                                (parametric) on the terminal row
``next_action_probability``     the next row's action probability; 0.0 on the terminal row
``possible_next_actions``       (only when possible actions were given) the next row's
                                possible actions; ``[]`` on the terminal row, null when the
                                next row had none
``reward_timeline``             map: steps ahead (ordinal difference, 0 = this row) ->
                                reward, for 0..``reward_horizon`` steps within the MDP
``episode_value``               sum over rows k at or after this one of
                                ``gamma ** (seq_k - seq_i) * reward_k`` (``0 ** 0 == 1``)
``terminal``                    True on the last row of its MDP, which is kept
==============================  ==============================================================

Edge cases:

- *Order*: rows are ordered by sequence number within their MDP, wherever they came
  from; input shards and row order do not matter.
- *Duplicate sequence numbers* within an MDP are all kept, ordered by input position
  (file order, then position in the file); between them ``time_diff`` is 0 and the
  discount is ``gamma ** 0 = 1``; the run's metadata counts them.
- *A one-row MDP* gives one terminal row: empty next state, ``time_diff`` 0,
  ``episode_value == reward``, ``reward_timeline == {0: reward}``.
- *Missing features* stay absent: a feature missing from the next row is missing from
  ``next_state_features`` too.
- The last logged row of an MDP is always terminal: an episode cut by a time limit
  looks like one that ended.

``episode_value`` is computed with a parallel (doubling) scan of the linear recurrence
``V_i = r_i + a_i * V_{i+1}`` (``a_i = gamma ** time_diff``, 0 on terminal rows): about
``log2(longest MDP)`` vectorized passes instead of a Python loop over rows.
"""
from __future__ import annotations

import logging
from typing import Dict, Tuple

import numpy as np

from .schema import (ACTION, ACTION_PROBABILITY, MDP_ID, METRICS, ORDER, POSSIBLE_ACTIONS,
                     REWARD, SEQUENCE_NUMBER, STATE_FEATURES)

logger = logging.getLogger(__name__)

DEFAULT_REWARD_HORIZON = 10


def sort_rows(table):
    """``table`` ordered by MDP, sequence number and input position."""
    import pyarrow.compute as pc
    encoded = pc.dictionary_encode(table.column(MDP_ID))
    if hasattr(encoded, "combine_chunks"):
        encoded = encoded.combine_chunks()
    # rank the distinct ids (few) instead of comparing strings row by row
    rank = np.asarray(pc.rank(encoded.dictionary, sort_keys="ascending"), dtype=np.int64)
    order = np.lexsort((np.asarray(table.column(ORDER)), np.asarray(table.column(SEQUENCE_NUMBER)),
                        rank[np.asarray(encoded.indices, dtype=np.int64)]))
    return table.take(order)


def mdp_layout(mdp_ids) -> Tuple[np.ndarray, np.ndarray]:
    """``(first, last)``: for every row of MDP-sorted ``mdp_ids``, the index of the
    first and of the last row of its MDP."""
    import pyarrow.compute as pc
    encoded = pc.dictionary_encode(mdp_ids)
    if hasattr(encoded, "combine_chunks"):
        encoded = encoded.combine_chunks()
    codes = np.asarray(encoded.indices, dtype=np.int64)
    n = len(codes)
    index = np.arange(n)
    starts = np.ones(n, bool)
    starts[1:] = codes[1:] != codes[:-1]
    first = np.maximum.accumulate(np.where(starts, index, 0))
    ends = np.ones(n, bool)
    ends[:-1] = starts[1:]
    last = np.minimum.accumulate(np.where(ends, index, n)[::-1])[::-1]
    return first, last


def discounted_values(rewards: np.ndarray, discounts: np.ndarray) -> np.ndarray:
    """``V_i = rewards_i + discounts_i * V_{i+1}`` (``V_n = 0``) by a doubling scan.

    ``discounts`` is 0 where a chain ends, so separate MDPs never mix.
    """
    value = rewards.astype(np.float64).copy()
    factor = discounts.astype(np.float64).copy()
    n, shift = len(value), 1
    while shift < n and factor.any():
        # value_i covers rows i .. i+shift-1; add the next block scaled by factor_i
        value[:n - shift] += factor[:n - shift] * value[shift:]
        factor[:n - shift] *= factor[shift:]
        factor[n - shift:] = 0.0
        shift *= 2
    return value


def _timeline_of_rewards(rewards: np.ndarray, last: np.ndarray, horizon: int):
    """``map<int64, double>``: steps ahead -> reward, up to ``horizon`` steps (-1: all)."""
    import pyarrow as pa
    index = np.arange(len(rewards))
    lengths = last - index + 1
    if horizon >= 0:
        lengths = np.minimum(lengths, horizon + 1)
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    steps = np.arange(offsets[-1], dtype=np.int64) - np.repeat(offsets[:-1], lengths)
    values = rewards[np.repeat(index, lengths) + steps]
    return pa.MapArray.from_arrays(offsets.astype(np.int32), pa.array(steps), pa.array(values))


def _next(array, next_index):
    """``array`` shifted to the next row; ``next_index`` points terminal rows past the
    end, at the empty value appended here (``""``, ``0.0``, ``{}`` or ``[]``)."""
    import pyarrow as pa
    type_ = array.type
    if pa.types.is_string(type_):
        empty = ""
    elif pa.types.is_floating(type_):
        empty = 0.0
    else:  # map and list types
        empty = []
    return pa.concat_arrays([array, pa.array([empty], type_)]).take(next_index)


def compute_timeline(table, gamma: float, reward_horizon: int = DEFAULT_REWARD_HORIZON,
                     with_possible_actions: bool = True, with_metrics: bool = True):
    """The Timeline of ``table`` (canonical rows holding whole MDPs).

    ``gamma`` in [0, 1] discounts ``episode_value`` per unit of sequence number;
    ``reward_horizon`` bounds ``reward_timeline`` (-1: to the end of the MDP).
    ``with_possible_actions``/``with_metrics`` keep the optional columns. Returns
    the output table (sorted by MDP and sequence number); see the module docstring.
    """
    import pyarrow as pa
    if not 0.0 <= gamma <= 1.0:
        raise ValueError(f"gamma must be in [0, 1], got {gamma}")
    if reward_horizon < -1:
        raise ValueError(f"reward_horizon must be >= 0, or -1 for no limit, got {reward_horizon}")
    rows = sort_rows(table)
    n = rows.num_rows
    mdp = rows.column(MDP_ID).combine_chunks()
    seq = np.asarray(rows.column(SEQUENCE_NUMBER), dtype=np.int64)
    rewards = np.asarray(rows.column(REWARD), dtype=np.float64)
    first, last = mdp_layout(mdp)
    index = np.arange(n)
    is_last = index == last
    next_index = pa.array(np.where(is_last, n, index + 1))
    time_diff = np.where(is_last, 0, seq[np.minimum(index + 1, max(n - 1, 0))] - seq)
    with np.errstate(over="ignore", under="ignore"):
        discounts = np.where(is_last, 0.0, np.power(float(gamma), time_diff.astype(np.float64)))
    column = {name: rows.column(name).combine_chunks() for name in rows.column_names}
    out: Dict[str, object] = {
        MDP_ID: mdp,
        SEQUENCE_NUMBER: pa.array(seq),
        "sequence_number_ordinal": pa.array(index - first + 1, pa.int64()),
        "time_diff": pa.array(time_diff, pa.int64()),
        "time_since_first": pa.array(seq - seq[first] if n else seq, pa.int64()),
        STATE_FEATURES: column[STATE_FEATURES],
        ACTION: column[ACTION],
        ACTION_PROBABILITY: column[ACTION_PROBABILITY],
        REWARD: column[REWARD],
    }
    if with_metrics:
        out[METRICS] = column[METRICS]
    if with_possible_actions:
        out[POSSIBLE_ACTIONS] = column[POSSIBLE_ACTIONS]
    out["next_state_features"] = _next(column[STATE_FEATURES], next_index)
    out["next_action"] = _next(column[ACTION], next_index)
    out["next_action_probability"] = _next(column[ACTION_PROBABILITY], next_index)
    if with_possible_actions:
        out["possible_next_actions"] = _next(column[POSSIBLE_ACTIONS], next_index)
    out["reward_timeline"] = _timeline_of_rewards(rewards, last, reward_horizon)
    out["episode_value"] = pa.array(discounted_values(rewards, discounts))
    out["terminal"] = pa.array(is_last)
    return pa.table(out)

