"""The row / episode bootstrap: resampling, reproducibility, pools, standard errors."""

import multiprocessing

import numpy as np
import pytest

import cpe
from cpe.bootstrap import draw_block_indices, resample_counts
from cpe_problems import ContextualBandit, SmallMDP


@pytest.mark.parametrize("n", [1, 7, 1000, 65_536, 150_001])
def test_counts_are_full_size_resamples(n):
    rng = np.random.default_rng(0)
    counts = np.array([resample_counts(rng, n) for _ in range(40)])
    assert counts.shape == (40, n)
    assert counts.min() >= 0
    np.testing.assert_array_equal(counts.sum(axis=1), n)


def test_multi_block_counts_are_uniform_multinomial():
    n, reps = 150_001, 60  # two full 2**16 blocks and a partial one
    rng = np.random.default_rng(1)
    counts = np.array([resample_counts(rng, n) for _ in range(reps)], dtype=float)
    # Each count is Binomial(n, 1/n): mean 1, variance 1 - 1/n.
    assert counts.mean() == pytest.approx(1.0, abs=1e-12)
    assert counts.var() == pytest.approx(1.0 - 1.0 / n, rel=0.01)
    # Block totals are unbiased: share of draws per block matches its size.
    edges = [0, 65_536, 131_072, n]
    for lo, hi in zip(edges[:-1], edges[1:]):
        share = counts[:, lo:hi].sum() / (reps * n)
        assert share == pytest.approx((hi - lo) / n, abs=4 * np.sqrt((hi - lo) / n / (reps * n)))
    # Positions inside a block are uniform (first vs second half of block 0 and of the tail).
    for lo, hi in [(0, 65_536), (131_072, n)]:
        mid = (lo + hi) // 2
        a, b = counts[:, lo:mid].sum(), counts[:, mid:hi].sum()
        expected_ratio = (mid - lo) / (hi - mid)
        assert a / b == pytest.approx(expected_ratio, rel=0.01)


def test_block_indices_cover_block_ranges():
    draws = draw_block_indices(np.random.default_rng(2), 140_000)
    assert [d.max() < size for d, size in zip(draws, [65_536, 65_536, 8_928])] == [True] * 3
    assert sum(len(d) for d in draws) == 140_000


@pytest.fixture(scope="module")
def bandit_log():
    return ContextualBandit.make(seed=1).sample(3000, np.random.default_rng(3))


@pytest.fixture(scope="module")
def trajectories():
    mdp = SmallMDP.make(seed=2)
    return mdp.sample(300, np.random.default_rng(4), mdp.q_tables() * 0.7)


def test_same_seed_same_result_different_seed_different(bandit_log):
    a = cpe.evaluate(bandit_log, n_bootstrap=50, seed=11)
    b = cpe.evaluate(bandit_log, n_bootstrap=50, seed=11)
    c = cpe.evaluate(bandit_log, n_bootstrap=50, seed=12)
    assert dict(a) == dict(b)
    assert a["ips"].stderr != c["ips"].stderr
    assert a["ips"].value == c["ips"].value
    seq = np.random.SeedSequence(99)
    assert dict(cpe.evaluate(bandit_log, n_bootstrap=20, seed=seq)) == \
        dict(cpe.evaluate(bandit_log, n_bootstrap=20, seed=seq))


def test_unseeded_run_records_its_seed(bandit_log):
    report = cpe.evaluate(bandit_log, ["ips"], n_bootstrap=20)
    again = cpe.evaluate(bandit_log, ["ips"], n_bootstrap=20, seed=report.seed)
    assert again["ips"] == report["ips"]


class _ListPool:
    """Minimal pool stand-in: records how many tasks were mapped."""

    def __init__(self):
        self.tasks = 0

    def map(self, fn, iterable):
        items = list(iterable)
        self.tasks += len(items)
        return [fn(item) for item in items]


def test_chunking_does_not_change_results(trajectories):
    serial = cpe.evaluate(trajectories, n_bootstrap=30, seed=5)
    pool = _ListPool()
    chunked = cpe.evaluate(trajectories, n_bootstrap=30, seed=5, pool=pool)
    assert pool.tasks > 1
    for name in serial:
        assert chunked[name] == serial[name]


@pytest.fixture(scope="module")
def resource_tracker():
    """Start multiprocessing's long-lived resource tracker before the test runs.

    Spawn pools start it on first use and it lives as long as the interpreter; starting it
    up front keeps it out of the per-test leaked-process check in tests/conftest.py.
    """
    from multiprocessing import resource_tracker as tracker

    tracker.ensure_running()


def test_spawn_pool_matches_serial(resource_tracker, bandit_log, trajectories):
    pool = multiprocessing.get_context("spawn").Pool(2)
    try:
        pooled_bandit = cpe.evaluate(bandit_log, n_bootstrap=40, seed=7, pool=pool)
        pooled_traj = cpe.evaluate(trajectories, n_bootstrap=24, seed=7, pool=pool)
    finally:
        pool.close()
        pool.join()
    serial_bandit = cpe.evaluate(bandit_log, n_bootstrap=40, seed=7)
    serial_traj = cpe.evaluate(trajectories, n_bootstrap=24, seed=7)
    assert dict(pooled_bandit) == dict(serial_bandit)
    assert dict(pooled_traj) == dict(serial_traj)


class _RecordingPool:
    """Runs map in this process, recording how big each pickled task was."""

    def __init__(self):
        self.task_bytes = []

    def map(self, fn, tasks):
        import pickle
        tasks = list(tasks)
        self.task_bytes += [len(pickle.dumps(task)) for task in tasks]
        return [fn(pickle.loads(pickle.dumps(task))) for task in tasks]


def test_same_host_ships_the_features_as_a_file_with_the_same_result(trajectories):
    """same_host: chunks carry the features' file name (a read-only map of the same
    values, Fortran order kept), not the features; results are bit-for-bit the same
    and the file is gone afterwards."""
    import glob
    import os
    by_message, by_file = _RecordingPool(), _RecordingPool()
    before = set(glob.glob("/dev/shm/cpe-features-*"))
    copied = cpe.evaluate(trajectories, n_bootstrap=24, seed=7, pool=by_message)
    mapped = cpe.evaluate(trajectories, n_bootstrap=24, seed=7, pool=by_file, same_host=True)
    assert dict(mapped) == dict(copied) == dict(cpe.evaluate(trajectories, n_bootstrap=24,
                                                            seed=7))
    assert max(by_file.task_bytes) < 3000 < min(by_message.task_bytes)
    if os.path.isdir("/dev/shm"):
        assert set(glob.glob("/dev/shm/cpe-features-*")) == before


def test_bootstrap_stderr_matches_analytic_for_means(bandit_log):
    report = cpe.evaluate(bandit_log, ["ips", "dm", "dr"], n_bootstrap=400, seed=0)
    w = bandit_log.importance_weights()
    n = bandit_log.n
    analytic = {
        "ips": np.std(w * bandit_log.rewards) / np.sqrt(n),
        "dm": np.std(np.sum(bandit_log.target_probs * bandit_log.reward_estimates, axis=1)) / np.sqrt(n),
    }
    for name, se in analytic.items():
        assert report[name].stderr == pytest.approx(se, rel=0.15)
    for est in report.values():
        assert est.ci_low < est.value < est.ci_high
        # percentile interval width close to 2 * 1.96 standard errors
        assert est.ci_high - est.ci_low == pytest.approx(2 * 1.96 * est.stderr, rel=0.2)


def test_episode_bootstrap_resamples_whole_episodes(trajectories):
    # With one episode duplicated many times, resampling rows would mix steps from
    # different episodes; resampling episodes keeps every replicate a valid log.
    report = cpe.evaluate(trajectories, ["is"], n_bootstrap=300, seed=1)
    contributions = trajectories.episodes().weights * trajectories.episodes().rewards
    per_episode = contributions @ trajectories.episodes().discounts
    analytic = per_episode.std() / np.sqrt(per_episode.size)
    assert report["is"].stderr == pytest.approx(analytic, rel=0.15)


def test_confidence_level_and_no_bootstrap(bandit_log):
    wide = cpe.evaluate(bandit_log, ["ips"], n_bootstrap=200, seed=0, confidence=0.99)
    narrow = cpe.evaluate(bandit_log, ["ips"], n_bootstrap=200, seed=0, confidence=0.5)
    assert wide["ips"].ci_high - wide["ips"].ci_low > narrow["ips"].ci_high - narrow["ips"].ci_low
    none = cpe.evaluate(bandit_log, ["ips"], n_bootstrap=0)
    assert np.isnan(none["ips"].stderr) and np.isnan(none["ips"].ci_low)
    for bad in (1, -3, 2.5, True):
        with pytest.raises(ValueError, match="n_bootstrap"):
            cpe.evaluate(bandit_log, n_bootstrap=bad)
    with pytest.raises(ValueError, match="confidence"):
        cpe.evaluate(bandit_log, confidence=1.0)
    with pytest.raises(ValueError, match="seed"):
        cpe.evaluate(bandit_log, seed=-1)
