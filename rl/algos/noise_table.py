"""The shared noise table of Evolution Strategies (Salimans et al. 2017, section 2.1).

Every process that takes part in an ES run (the learner and each pool worker)
builds the same large block of standard-normal ``float32`` numbers from the same
seed. A perturbation of a ``dim``-parameter policy is then named by one integer,
the offset of its slice ``table[i : i + dim]``, so only offsets (and returns)
cross the network instead of parameter-sized noise vectors.

Building the table is the expensive part (about 0.02 s per million numbers
here): build it once per process. :func:`shared_table` keeps the tables a
process has built in a module-level cache keyed by ``(seed, size)``, so a pool
worker builds it on its first task and reuses it for the rest of its life.
"""
from __future__ import annotations

import logging
from collections import OrderedDict
from typing import Tuple

import numpy as np

logger = logging.getLogger(__name__)

DEFAULT_SIZE = 10_000_000  # 40 MB of float32: plenty of distinct slices for small policies
_CACHE_LIMIT = 2  # tables kept per process (one per concurrent ES run with its own seed)
_CACHE: "OrderedDict[Tuple[int, int], NoiseTable]" = OrderedDict()


class NoiseTable:
    """``size`` standard-normal ``float32`` numbers drawn from ``seed``.

    Two tables with the same ``(seed, size)`` are identical in every process and
    on every platform numpy supports (``PCG64`` and its normal sampler are
    fixed by numpy's stream-compatibility policy for ``Generator``).
    """

    def __init__(self, seed: int, size: int = DEFAULT_SIZE) -> None:
        if size < 1:
            raise ValueError(f"a noise table needs at least one number, got size={size}")
        self.seed = int(seed)
        self.size = int(size)
        rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence([self.seed, 0x4E4F4953])))
        self.noise = rng.standard_normal(self.size, dtype=np.float32)
        self.noise.setflags(write=False)
        logger.debug("built noise table seed=%d size=%d", self.seed, self.size)

    def get(self, index: int, dim: int) -> np.ndarray:
        """The ``dim`` numbers starting at ``index`` (a read-only view, no copy)."""
        if not 0 <= index <= self.size - dim:
            raise IndexError(f"noise slice [{index}, {index + dim}) is outside the table of {self.size}")
        return self.noise[index:index + dim]

    def sample_index(self, rng: np.random.Generator, dim: int, count: int) -> np.ndarray:
        """``count`` uniformly drawn offsets of ``dim``-long slices (int64)."""
        if dim > self.size:
            raise ValueError(f"a {dim}-parameter policy needs a noise table of at least {dim} "
                             f"numbers (got {self.size}); raise noise_table_size")
        return rng.integers(0, self.size - dim + 1, size=count, dtype=np.int64)

    def stack(self, indices: np.ndarray, dim: int) -> np.ndarray:
        """The slices at ``indices`` as one ``[len(indices), dim]`` array (a copy)."""
        indices = np.asarray(indices, dtype=np.int64)
        if indices.size and (indices.min() < 0 or indices.max() > self.size - dim):
            raise IndexError(f"noise offsets must lie in [0, {self.size - dim}]")
        return self.noise[indices[:, None] + np.arange(dim)]

    def weighted_sum(self, weights: np.ndarray, indices: np.ndarray, dim: int,
                     batch: int = 512) -> np.ndarray:
        """``sum_i weights[i] * get(indices[i], dim)`` in float64, ``batch`` slices at a time."""
        weights = np.asarray(weights, dtype=np.float64)
        total = np.zeros(dim, dtype=np.float64)
        for start in range(0, len(indices), batch):
            block = self.stack(indices[start:start + batch], dim)
            total += weights[start:start + batch] @ block.astype(np.float64)
        return total


def shared_table(seed: int, size: int) -> NoiseTable:
    """This process's table for ``(seed, size)``, built on first use and then cached."""
    key = (int(seed), int(size))
    table = _CACHE.get(key)
    if table is None:
        table = NoiseTable(*key)
        _CACHE[key] = table
        while len(_CACHE) > _CACHE_LIMIT:
            _CACHE.popitem(last=False)
    else:
        _CACHE.move_to_end(key)
    return table
