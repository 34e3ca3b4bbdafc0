"""``Pool.start_workers()`` and ``Pool.wait_until_workers_up(timeout=None)`` (Uber
Fiber's names): start every worker now, and block until all are connected.

The first test body runs on the local backend and as Slurm jobs on the one-node test
cluster (scripts/slurm-up.sh; run it under ``flock /tmp/fiberrl-cluster.lock``).
"""
import multiprocessing
import os
import threading
import time

import pytest

import fiberrl
import pool_helpers
from pool_helpers import wait_until


@pytest.mark.parametrize("fiberrl_backend", ["local", pytest.param("slurm", marks=pytest.mark.slurm)],
                         indirect=True)
def test_wait_until_workers_up_returns_with_every_worker_connected(fiberrl_backend, make_pool):
    assert fiberrl.config.get_config().backend == fiberrl_backend
    pool = make_pool(4)
    pool.start_workers()
    pool.wait_until_workers_up(timeout=120)
    print("worker jobs:", [worker.job_id for worker in pool.workers()])
    stats = pool.stats()
    assert stats.alive == 4 and stats.starting == 0, stats
    assert pool.map(pool_helpers.square, range(1000)) == [i * i for i in range(1000)]
    pool.wait_until_workers_up()   # still all up: returns at once


def test_start_workers_starts_a_pool_with_idle_timeout_without_work(make_pool):
    pool = make_pool(2, idle_timeout=30)
    time.sleep(0.5)
    assert pool.stats().alive + pool.stats().starting == 0   # such a pool waits for work
    pool.start_workers()
    assert wait_until(lambda: pool.stats().alive == 2, 60), pool.stats()


def test_start_workers_lets_idle_workers_go_again_once_all_were_up(make_pool):
    pool = make_pool(2, idle_timeout=0.5)
    pool.wait_until_workers_up(timeout=60)   # starts them, as start_workers() does
    assert wait_until(lambda: pool.stats().alive + pool.stats().starting == 0, 30), pool.stats()


def test_timeout_expiry_raises_timeout_error_with_the_count(make_pool, tmp_path):
    release = tmp_path / "release"
    pool = make_pool(2, initializer=pool_helpers.first_worker_only,
                     initargs=(str(tmp_path / "first"), str(release)))
    started = time.monotonic()
    with pytest.raises(multiprocessing.TimeoutError, match=r"of the pool's 2 workers are up "
                                                           r"after 1\.5 s") as caught:
        pool.wait_until_workers_up(timeout=1.5)
    assert time.monotonic() - started < 10
    assert isinstance(caught.value, fiberrl.TimeoutError)
    pool_helpers.touch(release)
    pool.wait_until_workers_up(timeout=60)
    assert pool.stats().alive == 2


def test_workers_that_keep_failing_to_start_raise_the_backends_error(make_pool):
    pool = make_pool(1, initializer=pool_helpers.fail_on, initargs=(0,), max_task_retries=2)
    with pytest.raises(fiberrl.JobFailedError, match="keep failing to start"):
        pool.wait_until_workers_up(timeout=120)


def test_a_pool_terminated_while_waiting_raises(make_pool, tmp_path):
    pool = make_pool(1, initializer=pool_helpers.first_worker_only,
                     initargs=(str(tmp_path / "first"), str(tmp_path / "release")))
    pool_helpers.touch(tmp_path / "first")   # so that even the first worker blocks
    stopper = threading.Timer(1.0, pool.terminate)
    stopper.start()
    try:
        with pytest.raises(fiberrl.PoolTerminatedError):
            pool.wait_until_workers_up(timeout=120)
    finally:
        stopper.join()


def test_a_closed_pool_refuses(make_pool):
    pool = make_pool(1)
    pool.close()
    with pytest.raises(ValueError, match="Pool not running"):
        pool.start_workers()
    with pytest.raises(ValueError, match="Pool not running"):
        pool.wait_until_workers_up()
    pool.join()


def test_fibers_own_pool_more_body(make_pool):
    """Uber Fiber's ``test_pool_more``: start eagerly, map, then wait (all already up)."""
    pool = make_pool(4)
    pool.start_workers()
    res = pool.map(pool_helpers.square, [i for i in range(1000)])
    pool.wait_until_workers_up()
    assert res == [i ** 2 for i in range(1000)]
    assert os.getpid() not in pool_helpers.live_worker_pids(pool)
