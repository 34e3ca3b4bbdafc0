"""The steps of a :class:`~rl.envs.ProcessVectorEnv` as raw bytes: arrays, no pickles.

An array travels as a header (its dtype as numpy spells it, ``"<f4"``; the number of
dimensions; each dimension as a little-endian u32) followed by its buffer. A request
is the actions of one process's members, shape ``(count, *action_shape)``. An answer
is::

    [observations (count, *obs_shape)] [rewards: count float64] [flags: count u8]
    [the final observation of every member whose flag is set, in member order]

with flag bits :data:`TERMINATED` and :data:`TRUNCATED`. The encoders return None
for what does not fit (dict or tuple observations, object or string arrays, final
observations of another shape): the caller then pickles.

A step's arrays keep their dtype and shape from one step to the next, so a header is
built, and read, once per dtype and shape (cached), not once per step. The learner
encodes the requests of all processes from one buffer (:func:`encode_requests`) and
decodes all their answers into one set of arrays (:func:`decode_answers`): a numpy call
costs more than the Python that slices bytes, so it makes three per step, not three
per process.
"""
from __future__ import annotations

import functools
import math
import struct
from typing import Any, List, Optional, Sequence, Tuple

import numpy as np

TERMINATED, TRUNCATED = 1, 2

_NUMERIC = frozenset("biuf")
_BYTE = struct.Struct("<B")


@functools.lru_cache(maxsize=256)
def _header(dtype: str, shape: Tuple[int, ...]) -> bytes:
    """The header of an array of ``dtype`` (numpy's spelling) and ``shape``."""
    code = dtype.encode()
    return b"".join((_BYTE.pack(len(code)), code, _BYTE.pack(len(shape)),
                     struct.pack(f"<{len(shape)}I", *shape)))


@functools.lru_cache(maxsize=256)
def _layout(header: bytes) -> Tuple[np.dtype, Tuple[int, ...], int, int]:
    """``(dtype, shape, count, buffer size)`` that a header describes."""
    size = header[0]
    dtype = np.dtype(header[1:1 + size].decode())
    shape = struct.unpack_from(f"<{header[1 + size]}I", header, 2 + size)
    count = math.prod(shape)
    return dtype, shape, count, count * dtype.itemsize


@functools.lru_cache(maxsize=64)
def _request_heads(prefix: bytes, dtype: str, shape: Tuple[int, ...],
                   bounds: Tuple[Tuple[int, int], ...]) -> Tuple[Tuple[bytes, int, int], ...]:
    """For each part ``(start, stop)`` of the members: its request's first bytes
    (``prefix`` and header) and where its actions are in the whole buffer."""
    row = np.dtype(dtype).itemsize * math.prod(shape[1:])
    return tuple((prefix + _header(dtype, (stop - start, *shape[1:])), start * row, stop * row)
                 for start, stop in bounds)


def encode_array(array: np.ndarray) -> bytes:
    """An array of numbers as header and buffer."""
    return _header(array.dtype.str, array.shape) + array.tobytes()


def _array_at(data: bytes, offset: int) -> Tuple[np.dtype, Tuple[int, ...], int, int, int]:
    """``(dtype, shape, count, buffer size, buffer start)`` of the array whose header
    is at ``offset``."""
    ndim_at = offset + 1 + data[offset]
    start = ndim_at + 1 + 4 * data[ndim_at]
    return (*_layout(data[offset:start]), start)


def _final_observations(data: bytes, offset: int, flags: np.ndarray, dtype: np.dtype,
                        shape: Tuple[int, ...]) -> List[Any]:
    """The final observations that follow ``offset``: a copy for each member whose flag
    is set, None for the others."""
    final_obs: List[Any] = [None] * len(flags)
    per_obs = math.prod(shape)
    for member in np.flatnonzero(flags):
        final_obs[member] = np.frombuffer(data, dtype, per_obs, offset).reshape(shape).copy()
        offset += per_obs * dtype.itemsize
    return final_obs


def decode_array(data: bytes, offset: int) -> Tuple[np.ndarray, int]:
    """The array at ``offset`` (a read-only view of ``data``) and the offset after it."""
    dtype, shape, count, size, start = _array_at(data, offset)
    return np.frombuffer(data, dtype, count, start).reshape(shape), start + size


def encode_requests(actions: np.ndarray, bounds: Tuple[Tuple[int, int], ...],
                    prefix: bytes) -> Optional[List[bytes]]:
    """The requests of several processes at once, each ``prefix`` and the actions of its
    members ``[start, stop)`` (``bounds``), or None if the actions are not numbers."""
    if actions.dtype.kind not in _NUMERIC:
        return None
    raw = actions.tobytes()
    return [head + raw[start:stop]
            for head, start, stop in _request_heads(prefix, actions.dtype.str, actions.shape, bounds)]


def decode_actions(data: bytes, offset: int) -> np.ndarray:
    """The actions of a request (after its ``offset`` bytes of request code), a copy
    the caller owns."""
    return decode_array(data, offset)[0].copy()


def encode_answer(observations: Sequence[Any], rewards: Sequence[Any], flags: bytearray,
                  finals: Sequence[Any]) -> Optional[bytes]:
    """An answer's bytes, or None if the observations are not same-shaped numbers."""
    try:
        obs = np.asarray(observations)
        returns = np.asarray(rewards, np.float64)
    except (ValueError, TypeError):   # ragged, or rewards that are not numbers
        return None
    if obs.dtype.kind not in _NUMERIC or returns.shape != (len(flags),):
        return None
    last = []
    for final in finals:
        final = np.asarray(final)
        if final.dtype != obs.dtype or final.shape != obs.shape[1:]:
            return None
        last.append(final.tobytes())
    return b"".join((encode_array(obs), returns.tobytes(), flags, *last))


def decode_answer(data: bytes, offset: int) -> Tuple[np.ndarray, np.ndarray, np.ndarray,
                                                       Optional[List[Any]]]:
    """``(observations, rewards, flags, final_obs)`` of an answer. The first three are
    read-only views of ``data`` (the caller copies what it keeps); ``final_obs`` is
    None when no member's episode ended, else a list with a copy of the final
    observation of each member whose episode ended and None for the others."""
    obs, offset = decode_array(data, offset)
    count = len(obs)
    rewards = np.frombuffer(data, np.float64, count, offset)
    offset += 8 * count
    flags = np.frombuffer(data, np.uint8, count, offset)
    if data.count(0, offset, offset + count) == count:
        return obs, rewards, flags, None
    return obs, rewards, flags, _final_observations(data, offset + count, flags, obs.dtype,
                                                    obs.shape[1:])


def decode_answers(answers: Sequence[bytes], code: int) -> Optional[Tuple[
        np.ndarray, np.ndarray, np.ndarray, Optional[List[Any]]]]:
    """``(observations, rewards, flags, final_obs)`` of all members from the answers of
    several processes in member order (each answer is the byte ``code`` and an answer
    as :func:`encode_answer` makes it): arrays the caller owns, and ``final_obs`` as
    :func:`decode_answer` gives it. None when an answer does not start with ``code``
    or the observations of two answers differ in dtype or shape (the caller decodes
    them one by one)."""
    obs_parts, reward_parts, flag_parts = [], [], []
    finals: Optional[List[Any]] = None
    first = None
    total = 0
    for data in answers:
        if data[0] != code:
            return None
        ndim_at = 2 + data[1]   # _array_at(data, 1), inline: this runs for every process
        start = ndim_at + 1 + 4 * data[ndim_at]   # at every step
        dtype, shape, _, size = _layout(data[1:start])
        if first is None:
            first = dtype, shape
        elif dtype != first[0] or shape[1:] != first[1][1:]:
            return None
        members = shape[0]
        total += members
        rewards_at = start + size
        flags_at = rewards_at + 8 * members
        end = flags_at + members
        obs_parts.append(data[start:rewards_at])
        reward_parts.append(data[rewards_at:flags_at])
        flag_parts.append(data[flags_at:end])
        ended = data.count(0, flags_at, end) != members
        if ended and finals is None:   # the first episode end: None for the members before
            finals = [None] * (total - members)
        if ended:
            finals += _final_observations(data, end, np.frombuffer(data, np.uint8, members,
                                                                    flags_at), dtype, shape[1:])
        elif finals is not None:
            finals += [None] * members
    if first is None:
        raise ValueError("no answers to decode")
    dtype, shape = first[0], first[1][1:]
    obs = np.frombuffer(bytearray().join(obs_parts), dtype).reshape(total, *shape)
    rewards = np.frombuffer(bytearray().join(reward_parts), np.float64)
    return obs, rewards, np.frombuffer(bytearray().join(flag_parts), np.uint8), finals
