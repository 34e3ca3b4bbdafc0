"""Nonparametric bootstrap over rows (bandit logs) or whole episodes (trajectories).

Every replicate resamples the ``n`` units with replacement at full size, i.e. its
count vector ``c`` is ``Multinomial(n, (1/n, ..., 1/n))`` (Efron 1979).  A
statistic sees the resample only through ``c``: per-unit *features* ``F``
(``(n, p)``) are reduced to ``sums = c @ F`` and the statistic turns those sums
(and, when it needs them, the counts themselves) into estimator values.  The
point estimate is the same computation with ``c = 1``, so replicates and point
estimate always run the identical procedure.

Drawing counts fast: the units are split into blocks of ``2**16``; the number of
draws falling in each block is multinomial, and within a full block the indices
are raw 16-bit words of the generator, which are exactly uniform over the block.
Counting with :func:`numpy.bincount` then stays inside a cache-sized array.

Each replicate has its own random stream (``SeedSequence.spawn``), so the result
depends only on the seed -- not on how replicates are chunked or whether they
run on a pool.  With a pool (anything with a ``multiprocessing.Pool``-like
``map``) chunks of replicates are mapped with the module-level, picklable
:func:`run_chunk`.

Shipping the features: a pool sends each worker the ``(n, p)`` features with its
first chunk (32 MB at a million rows and four estimators), and on a free machine that
transfer, not the arithmetic, is what kept two workers from beating one.  When the
caller says the workers share this host (``same_host``), the features go to a file
in ``/dev/shm`` instead, each chunk carries its name, and every worker maps the same
pages read-only (:class:`_MappedFeatures`); the file is removed once the map returns.
"""

from __future__ import annotations

import contextlib
import copy
import logging
import os
import tempfile
from typing import Any, Iterable, Iterator, Protocol, Sequence

import numpy as np

logger = logging.getLogger(__name__)

_BLOCK_BITS = 16
_BLOCK = 1 << _BLOCK_BITS
_BATCH_BYTES = 48 * 2**20
_MAX_BATCH = 16


class Statistic(Protocol):
    """What the bootstrap needs from an estimator bundle."""

    names: tuple[str, ...]
    features: np.ndarray
    needs_counts: bool

    def finish(self, sums: np.ndarray, counts: np.ndarray | None) -> np.ndarray:
        """Map ``(b, p)`` feature sums (and ``(b, n)`` counts if needed) to ``(b, m)`` values."""
        ...


class PoolLike(Protocol):
    """Anything with a ``multiprocessing.Pool``-style ``map``."""

    def map(self, fn: Any, iterable: Iterable[Any]) -> Any:
        """Apply ``fn`` to each item, returning results in order."""
        ...


def _blocks(n: int) -> list[tuple[int, int]]:
    """Split ``range(n)`` into consecutive blocks of at most ``2**16`` units."""
    return [(lo, min(lo + _BLOCK, n)) for lo in range(0, n, _BLOCK)]


def draw_block_indices(rng: np.random.Generator, n: int) -> list[np.ndarray]:
    """Draw one full-size resample of ``range(n)`` as block-local index arrays.

    Returns one array per block of :func:`_blocks`; entry ``j`` holds the
    resampled positions that fell in block ``j``, relative to the block start
    (``uint16`` for full blocks, to keep a batch of draws small).
    """
    blocks = _blocks(n)
    if len(blocks) == 1:
        return [rng.integers(0, n, n)]
    sizes = np.array([hi - lo for lo, hi in blocks], dtype=np.float64)
    per_block = rng.multinomial(n, sizes / n)
    n_full = n // _BLOCK
    k_full = int(per_block[:n_full].sum())
    raw = rng.bit_generator.random_raw(-(-k_full // 4)).view(np.uint16)
    out = []
    pos = 0
    for j in range(n_full):
        k = int(per_block[j])
        out.append(raw[pos:pos + k])
        pos += k
    if n_full < len(blocks):
        rest = int(sizes[-1])
        out.append(rng.integers(0, rest, int(per_block[-1])))
    return out


def resample_counts(rng: np.random.Generator, n: int) -> np.ndarray:
    """Multinomial(n, uniform) count vector of one full-size resample (int64)."""
    counts = np.empty(n, dtype=np.int64)
    for (lo, hi), idx in zip(_blocks(n), draw_block_indices(rng, n)):
        counts[lo:hi] = np.bincount(idx.astype(np.intp, copy=False), minlength=hi - lo)
    return counts


def _batch_size(n: int, needs_counts: bool) -> int:
    """Replicates processed together, bounded so a batch uses about ``_BATCH_BYTES``."""
    per_replicate = n * (2 + (8 if needs_counts else 0)) + 8 * min(n, _BLOCK)
    return int(max(1, min(_MAX_BATCH, _BATCH_BYTES // per_replicate)))


def _run_batch(statistic: Statistic, n: int, seeds: Sequence[np.random.SeedSequence]) -> np.ndarray:
    """Evaluate ``statistic`` on the resamples drawn from ``seeds``."""
    b = len(seeds)
    draws = [draw_block_indices(np.random.Generator(np.random.PCG64(s)), n) for s in seeds]
    features = statistic.features
    sums = np.zeros((b, features.shape[1]))
    counts = np.empty((b, n)) if statistic.needs_counts else None
    for j, (lo, hi) in enumerate(_blocks(n)):
        block = np.empty((b, hi - lo))
        for r in range(b):
            block[r] = np.bincount(draws[r][j].astype(np.intp, copy=False), minlength=hi - lo)
        sums += block @ features[lo:hi]
        if counts is not None:
            counts[:, lo:hi] = block
    return statistic.finish(sums, counts)


def run_chunk(task: tuple[Statistic, int, Sequence[np.random.SeedSequence], int]) -> np.ndarray:
    """Compute the ``(len(seeds), m)`` replicates of one chunk (picklable pool task)."""
    statistic, n, seeds, batch = task
    parts = [_run_batch(statistic, n, seeds[i:i + batch]) for i in range(0, len(seeds), batch)]
    return np.concatenate(parts, axis=0)


class _MappedFeatures:
    """Features saved to a file: pickles as its path, unpickles as a read-only
    memory map of it (same values, same memory order, no copy)."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self) -> tuple:
        return (_map_features, (self.path,))


def _map_features(path: str) -> np.ndarray:
    return np.load(path, mmap_mode="r")


@contextlib.contextmanager
def _features_by_file(statistic: Statistic) -> Iterator[Statistic]:
    """A copy of ``statistic`` whose features travel as a file name (see the module
    docstring); the file is removed on exit (workers' maps stay valid)."""
    where = "/dev/shm" if os.path.isdir("/dev/shm") else None
    with tempfile.TemporaryDirectory(prefix="cpe-features-", dir=where) as folder:
        path = os.path.join(folder, "features.npy")
        np.save(path, statistic.features)
        shipped = copy.copy(statistic)
        shipped.features = _MappedFeatures(path)  # type: ignore[assignment]
        yield shipped


def point_estimate(statistic: Statistic) -> np.ndarray:
    """Statistic values on the original data (every count equal to one)."""
    n = statistic.features.shape[0]
    sums = statistic.features.sum(axis=0, keepdims=True)
    counts = np.ones((1, n)) if statistic.needs_counts else None
    return statistic.finish(sums, counts)[0]


def _n_tasks(pool: PoolLike | None, n_bootstrap: int) -> int:
    """How many chunks to split the replicates into."""
    if pool is None:
        return 1
    workers = getattr(pool, "_processes", None) or getattr(pool, "processes", None) or 4
    return max(1, min(n_bootstrap, 2 * int(workers)))


def bootstrap(
    statistic: Statistic,
    n_bootstrap: int,
    seed: np.random.SeedSequence,
    pool: PoolLike | None = None,
    same_host: bool = False,
) -> np.ndarray:
    """Return the ``(n_bootstrap, m)`` bootstrap replicates of ``statistic``.

    Replicate ``r`` uses the ``r``-th child of ``seed``, and replicates are always
    processed in the same fixed batches (tasks hold whole batches), so the result is
    bit-for-bit the same serially and on any pool. ``same_host``: the pool's workers
    run on this machine, so the features reach them through a shared file instead of
    the pool's messages (ignored without a pool).
    """
    n = statistic.features.shape[0]
    children = seed.spawn(n_bootstrap)
    batch = _batch_size(n, statistic.needs_counts)
    n_batches = -(-n_bootstrap // batch)
    n_tasks = min(_n_tasks(pool, n_bootstrap), n_batches)
    edges = np.linspace(0, n_batches, n_tasks + 1).astype(int) * batch
    ranges = [(lo, hi) for lo, hi in zip(edges[:-1], np.minimum(edges[1:], n_bootstrap))
              if hi > lo]
    if pool is None:
        results = [run_chunk((statistic, n, children[lo:hi], batch)) for lo, hi in ranges]
        return np.concatenate(results, axis=0)
    with (_features_by_file(statistic) if same_host else contextlib.nullcontext(statistic)) \
            as shipped:
        logger.debug("mapping %d bootstrap chunks over %r", len(ranges), pool)
        results = list(pool.map(run_chunk, [(shipped, n, children[lo:hi], batch)
                                            for lo, hi in ranges]))
    return np.concatenate(results, axis=0)


def summarize(
    replicates: np.ndarray, confidence: float
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Standard error (``ddof=1``) and percentile interval of each replicate column."""
    alpha = (1.0 - confidence) / 2.0
    finite = np.isfinite(replicates)
    if not finite.all():
        logger.warning(
            "%d of %d bootstrap replicates are not finite and were ignored",
            int((~finite).sum()), replicates.size,
        )
        stderr = np.nanstd(replicates, axis=0, ddof=1)
        low, high = np.nanquantile(replicates, [alpha, 1.0 - alpha], axis=0)
    else:
        stderr = replicates.std(axis=0, ddof=1)
        low, high = np.quantile(replicates, [alpha, 1.0 - alpha], axis=0)
    return stderr, low, high
