"""The steps of a :class:`~rl.envs.ProcessVectorEnv` as raw bytes: arrays, no pickles.

An array travels as a header (its dtype as numpy spells it, ``"<f4"``; the number of
dimensions; each dimension as a little-endian u32) followed by its buffer. A request
is the actions of one process's members, shape ``(count, *action_shape)``. An answer
is::

    [observations (count, *obs_shape)] [rewards: count float64] [flags: count u8]
    [the final observation of every member whose flag is set, in member order]

with flag bits :data:`TERMINATED` and :data:`TRUNCATED`. The encoders return None
for what does not fit (dict or tuple observations, object or string arrays, final
observations of another shape): the caller then pickles. The decoders return arrays
that the caller owns (writable copies).
"""
from __future__ import annotations

import math
import struct
from typing import Any, List, Optional, Sequence, Tuple

import numpy as np

TERMINATED, TRUNCATED = 1, 2

_NUMERIC = frozenset("biuf")
_BYTE = struct.Struct("<B")


def encode_array(array: np.ndarray) -> bytes:
    """An array of numbers as header and buffer."""
    dtype = array.dtype.str.encode()
    return b"".join((_BYTE.pack(len(dtype)), dtype, _BYTE.pack(array.ndim),
                     struct.pack(f"<{array.ndim}I", *array.shape),
                     np.ascontiguousarray(array).tobytes()))


def decode_array(data: bytes, offset: int) -> Tuple[np.ndarray, int]:
    """The array at ``offset`` (a read-only view of ``data``) and the offset after it."""
    size = data[offset]
    dtype = np.dtype(data[offset + 1:offset + 1 + size].decode())
    offset += 1 + size
    ndim = data[offset]
    shape = struct.unpack_from(f"<{ndim}I", data, offset + 1)
    offset += 1 + 4 * ndim
    count = math.prod(shape)
    array = np.frombuffer(data, dtype, count, offset).reshape(shape)
    return array, offset + count * dtype.itemsize


def encode_actions(actions: np.ndarray) -> Optional[bytes]:
    """A request's bytes, or None if the actions are not numbers."""
    return encode_array(actions) if actions.dtype.kind in _NUMERIC else None


def decode_actions(data: bytes, offset: int) -> np.ndarray:
    """The actions of a request (after its ``offset`` bytes of request code)."""
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
    return b"".join((encode_array(obs), returns.tobytes(), bytes(flags), *last))


def decode_answer(data: bytes, offset: int) -> Tuple[np.ndarray, np.ndarray, np.ndarray,
                                                       np.ndarray, List[Any]]:
    """``(observations, rewards, terminated, truncated, final_obs)`` of an answer;
    ``final_obs`` has None for the members whose episode goes on."""
    obs, offset = decode_array(data, offset)
    count = obs.shape[0]
    rewards = np.frombuffer(data, np.float64, count, offset).copy()
    offset += 8 * count
    flag_bytes = data[offset:offset + count]
    offset += count
    flags = np.frombuffer(flag_bytes, np.uint8)
    final_obs: List[Any] = [None] * count
    if flag_bytes.count(0) != count:   # an episode ended
        per_obs = math.prod(obs.shape[1:])
        for member in np.flatnonzero(flags):
            final_obs[member] = np.frombuffer(data, obs.dtype, per_obs, offset).reshape(
                obs.shape[1:]).copy()
            offset += per_obs * obs.dtype.itemsize
    # each flag bit is 0 or 1 after the mask and shift: a bool array's bytes as they are
    return (obs.copy(), rewards, (flags & TERMINATED).view(bool),
            ((flags & TRUNCATED) >> 1).view(bool), final_obs)
