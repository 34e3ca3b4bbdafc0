"""fiberrl.Pool: the multiprocessing.Pool API and fiberrl's extras (behaviour)."""
import collections
import ctypes
import dataclasses
import functools
import gc
import itertools
import multiprocessing
import os
import threading
import time
from multiprocessing.pool import RemoteTraceback

import psutil
import pytest

import fiberrl
import pool_helpers
from pool_helpers import (Boom, add, fail_on, mark_then_sleep, mark_then_wait,
                          power, process_gone, square, square_with_pid, touch,
                          type_and_value, wait_until)

pytestmark = pytest.mark.timeout(180)

GET = 60  # seconds any single result may take
SQUARES = [i * i for i in range(50)]
STATS_FIELDS = ("target", "alive", "starting", "idle", "queued", "pending", "completed",
                "worker_deaths", "retried")


@pytest.fixture(scope="module", autouse=True)
def _shared_local_pool():
    """One local pool shared by the plain API tests. Autouse, so its workers exist
    before each test's leak check takes its snapshot; tests using it must leave no
    task running behind them."""
    with pool_helpers.pool_with_workers_up(2) as shared:
        yield shared


@pytest.fixture
def pool(fiberrl_backend, _shared_local_pool):
    """The shared pool locally; elsewhere a fresh one, so that no job outlives its test."""
    if fiberrl_backend == "local":
        yield _shared_local_pool
        return
    with pool_helpers.pool_with_workers_up(2) as own:
        yield own


# -- the API, with known results ---------------------------------------------------------------
@pytest.mark.any_backend
def test_apply_with_args_and_kwds(pool):
    assert pool.apply(square, (7,)) == 49
    assert pool.apply(power, (2,), {"exp": 10, "offset": 1}) == 1025
    assert pool.apply(pool_helpers.worker_name) in pool_helpers.live_workers(pool)


def test_apply_async_result_protocol(pool):
    result = pool.apply_async(power, (3,), {"exp": 3})
    assert result.get(timeout=GET) == 27
    result.wait(timeout=GET)
    assert result.ready() and result.successful()


@pytest.mark.any_backend
@pytest.mark.parametrize("chunksize", [None, 1, 3, 7, 50, 1000])
def test_map_and_map_async(pool, chunksize):
    assert pool.map(square, range(50), chunksize) == SQUARES
    assert pool.map_async(square, range(50), chunksize).get(timeout=GET) == SQUARES


@pytest.mark.parametrize("kind", [range, tuple, list])
def test_map_cuts_ranges_tuples_and_lists_by_slicing(pool, kind):
    """Chunks of these are slices (a range travels as a range): the function still sees
    each item, of its own type, at its place."""
    items = kind(range(1000)) if kind is not range else range(3, 3003, 3)
    assert pool.map(type_and_value, items, 37) == [("int", i) for i in items]
    assert pool.map(type_and_value, items) == [("int", i) for i in items]
    pair = range(5, 7) if kind is range else kind([5, 6])   # short: in the header
    assert pool.map(type_and_value, pair) == [("int", 5), ("int", 6)]


def test_map_of_empty_and_of_a_generator(pool):
    assert pool.map(square, []) == []
    assert pool.map_async(square, []).get(timeout=GET) == []
    assert pool.map(square, (i for i in range(50))) == SQUARES


@pytest.mark.parametrize("chunksize", [None, 1, 4, 100])
def test_starmap_and_starmap_async(pool, chunksize):
    pairs = [(i, 100 + i) for i in range(30)]
    expected = [a + b for a, b in pairs]
    assert pool.starmap(add, pairs, chunksize) == expected
    assert pool.starmap_async(add, iter(pairs), chunksize).get(timeout=GET) == expected


@pytest.mark.any_backend
@pytest.mark.parametrize("chunksize", [1, 3, 64])
def test_imap_and_imap_unordered(pool, chunksize):
    assert list(pool.imap(square, range(50), chunksize)) == SQUARES
    assert list(pool.imap(square, (i for i in range(50)), chunksize=chunksize)) == SQUARES
    assert sorted(pool.imap_unordered(square, range(50), chunksize)) == SQUARES


def test_imap_next_with_timeout(pool, tmp_path):
    release = tmp_path / "release"
    started = tmp_path / "started"
    started.mkdir()
    it = pool.imap(functools.partial(mark_then_wait, str(started), str(release)), range(2))
    try:
        with pytest.raises(multiprocessing.TimeoutError):
            it.next(timeout=0.3)
    finally:
        touch(release)
    assert [it.next(timeout=GET), it.next(timeout=GET)] == [0, 1]
    with pytest.raises(StopIteration):
        it.next(timeout=GET)


def test_get_with_timeout_raises_timeout_error(pool, tmp_path):
    release = tmp_path / "release"
    result = pool.apply_async(mark_then_wait, (str(tmp_path), str(release), 5))
    try:
        started = time.monotonic()
        with pytest.raises(multiprocessing.TimeoutError):
            result.get(timeout=0.3)
        assert time.monotonic() - started < 5
        assert not result.ready()
    finally:
        touch(release)
    assert result.get(timeout=GET) == 5


def test_imap_keeps_order_with_uneven_task_durations(pool):
    durations = [0.4 if i % 3 == 0 else 0.02 for i in range(12)]
    got = list(pool.imap(pool_helpers.sleep_then_return, zip(durations, range(12)), 1))
    assert got == list(range(12))


def test_imap_unordered_yields_in_completion_order(pool):
    items = [(1.5, 0)] + [(0.02, i) for i in range(1, 8)]
    got = list(pool.imap_unordered(pool_helpers.sleep_then_return, items, 1))
    assert sorted(got) == list(range(8))
    assert got[0] != 0, "the slow first task must not hold back the others"


@pytest.mark.parametrize("method", ["imap", "imap_unordered"])
def test_imap_consumes_an_endless_iterable_lazily(make_pool, method):
    p = make_pool(2)
    pulled = [0]

    def numbers():
        for i in itertools.count():
            pulled[0] = i + 1
            yield i

    got = list(itertools.islice(getattr(p, method)(square, numbers()), 100))
    if method == "imap":
        assert got == [i * i for i in range(100)]
    else:
        assert len(got) == 100 and len(set(got)) == 100
    time.sleep(1.0)  # proving that nothing more happens needs time, not an event
    assert pulled[0] <= 100 + 5000, \
        f"{pulled[0]} items pulled from the input for 100 consumed: input is not read lazily"


# -- exceptions, callbacks, what travels --------------------------------------------------------
@pytest.mark.any_backend
def test_task_exception_keeps_type_and_remote_traceback(pool):
    result = pool.apply_async(fail_on, (7,))
    with pytest.raises(Boom, match="bad value 7") as info:
        result.get(timeout=GET)
    assert result.ready() and not result.successful()
    cause = info.value.__cause__
    assert isinstance(cause, RemoteTraceback)
    assert "fail_on" in cause.tb and "bad value 7" in cause.tb and "Boom" in cause.tb
    with pytest.raises(Boom, match="bad value 13"):
        pool.map(functools.partial(fail_on, bad=13), range(20), 3)
    with pytest.raises(Boom):
        pool.starmap_async(fail_on, [(1, 1)]).get(timeout=GET)
    assert pool.map(square, range(50)) == SQUARES  # still usable


def test_imap_exception_for_one_item_does_not_end_the_iteration(pool):
    it = pool.imap(functools.partial(fail_on, bad=2), range(5), 1)
    assert [it.next(timeout=GET), it.next(timeout=GET)] == [0, 1]
    with pytest.raises(Boom, match="bad value 2"):
        it.next(timeout=GET)
    assert [it.next(timeout=GET), it.next(timeout=GET)] == [9, 16]
    with pytest.raises(StopIteration):
        it.next(timeout=GET)


def test_callbacks_run_in_a_pool_thread_before_get_returns(pool):
    main = threading.main_thread()
    seen, errors, mapped = [], [], []

    def callback(value):
        time.sleep(0.2)  # a slow callback: get() must still wait for it
        seen.append((value, threading.current_thread() is main))

    def error_callback(exc):
        time.sleep(0.2)
        errors.append((type(exc), str(exc), threading.current_thread() is main))

    assert pool.apply_async(square, (4,), callback=callback).get(timeout=GET) == 16
    assert seen == [(16, False)]
    result = pool.apply_async(fail_on, (3,), error_callback=error_callback)
    with pytest.raises(Boom):
        result.get(timeout=GET)
    assert errors == [(Boom, "bad value 3", False)]
    assert pool.map_async(square, range(5), callback=mapped.append).get(timeout=GET) == \
        [0, 1, 4, 9, 16]
    assert pool.starmap_async(add, [(1, 2), (3, 4)], callback=mapped.append).get(GET) == [3, 7]
    assert mapped == [[0, 1, 4, 9, 16], [3, 7]]
    failed = []
    with pytest.raises(Boom):
        pool.map_async(functools.partial(fail_on, bad=1), range(3),
                       error_callback=failed.append).get(timeout=GET)
    assert len(failed) == 1 and isinstance(failed[0], Boom)


@pytest.mark.any_backend
def test_lambdas_closures_and_local_functions(pool):
    factor = 3

    def times_factor(x):
        return x * factor

    assert pool.map(lambda x: x + 1, range(5)) == [1, 2, 3, 4, 5]
    assert pool.map(times_factor, range(5)) == [0, 3, 6, 9, 12]
    assert pool.apply_async(lambda a, b=0: a - b, (10,), {"b": 4}).get(timeout=GET) == 6
    assert pool.starmap(lambda a, b: a * b, [(1, 2), (3, 4)]) == [2, 12]
    assert list(pool.imap(lambda x: -x, range(3))) == [0, -1, -2]
    assert pool.apply_async(lambda v: [v, {"twice": v * 2}], (21,)).get(GET) == [21, {"twice": 42}]


@pytest.mark.any_backend
def test_initializer_globals_are_seen_by_tasks(make_pool):
    p = make_pool(2, initializer=pool_helpers.set_state, initargs=("from-initializer",))
    assert p.map(pool_helpers.read_state, range(6), 1) == ["from-initializer"] * 6
    assert p.apply_async(lambda: pool_helpers.STATE).get(timeout=GET) == "from-initializer"


def test_closure_and_lambda_initializers(make_pool):
    secret = {"token": 42}

    def init(prefix):
        pool_helpers.STATE = (prefix, secret["token"])

    closure_pool = make_pool(1, initializer=init, initargs=("closure",))
    lambda_pool = make_pool(1, initializer=lambda v: pool_helpers.set_state(v),
                            initargs=("lambda",))
    assert closure_pool.map(pool_helpers.read_state, range(3)) == [("closure", 42)] * 3
    assert lambda_pool.map(pool_helpers.read_state, range(3)) == ["lambda"] * 3


# -- life cycle ------------------------------------------------------------------------------------
@pytest.mark.parametrize("processes", [0, -1])
def test_pool_of_no_workers_is_refused(processes):
    with pytest.raises(ValueError):
        fiberrl.Pool(processes)


@pytest.mark.parametrize("processes", ["4", 2.5, True])
def test_a_pool_size_that_is_no_int_is_a_type_error_as_with_the_stdlib(processes):
    with pytest.raises(TypeError, match="processes must be at least 1, an int"):
        fiberrl.Pool(processes)


def test_default_size_is_the_cpu_count(make_pool):
    p = make_pool()
    assert p.processes == os.cpu_count() == p.stats().target
    assert p.map(square, range(10)) == SQUARES[:10]


def test_constructor_does_not_wait_for_workers(make_pool, tmp_path):
    release = tmp_path / "release"
    started = time.monotonic()
    p = make_pool(2, initializer=pool_helpers.wait_for_path, initargs=(str(release), 30))
    assert time.monotonic() - started < 5
    result = p.map_async(square, range(6))
    touch(release)
    assert result.get(timeout=GET) == SQUARES[:6]


def test_tasks_run_as_soon_as_the_first_worker_is_up(make_pool, tmp_path):
    release = tmp_path / "release"
    p = make_pool(2, initializer=pool_helpers.first_worker_only,
                  initargs=(str(tmp_path / "first"), str(release)))
    try:
        out = p.map_async(square_with_pid, range(10)).get(timeout=GET)
    finally:
        touch(release)
    assert [v for v, _ in out] == SQUARES[:10]
    assert len({pid for _, pid in out}) == 1


def test_idle_workers_pull_tasks(make_pool):
    p = make_pool(4)
    started = time.monotonic()
    pids = p.map_async(pool_helpers.sleep_then_pid, [0.5] * 8).get(timeout=GET)
    took = time.monotonic() - started
    assert len(set(pids)) >= 3, f"8 tasks of 0.5 s ran on {len(set(pids))} of 4 workers"
    assert took < 3.5, f"8 tasks of 0.5 s on Pool(4) took {took:.1f} s"


@pytest.mark.any_backend
def test_maxtasksperchild_replaces_workers(make_pool):
    p = make_pool(2, maxtasksperchild=2)
    out = p.map_async(pool_helpers.square_with_worker_name, range(12), 1).get(timeout=120)
    assert [v for v, _ in out] == SQUARES[:12]
    per_worker = collections.Counter(worker for _, worker in out)
    assert max(per_worker.values()) <= 2 and len(per_worker) >= 6, per_worker
    assert wait_until(lambda: p.stats().alive == 2, 30), p.stats()


def test_close_then_join_waits_for_queued_tasks(make_pool, tmp_path):
    p = make_pool(2)
    results = [p.apply_async(pool_helpers.sleep_touch_return,
                             (0.2, str(tmp_path / f"done-{i}"), i)) for i in range(8)]
    p.close()
    p.join()
    assert sorted(os.listdir(tmp_path)) == sorted(f"done-{i}" for i in range(8))
    assert all(r.ready() for r in results)
    assert [r.get(timeout=1) for r in results] == list(range(8))
    assert p.stats().alive == 0


@pytest.mark.parametrize("how", ["close", "terminate"])
def test_methods_of_a_stopped_pool_raise_value_error(make_pool, how):
    p = make_pool(1)
    getattr(p, how)()
    calls = [lambda: p.apply(square, (1,)), lambda: p.apply_async(square, (1,)),
             lambda: p.map(square, [1]), lambda: p.map_async(square, [1]),
             lambda: p.imap(square, [1]), lambda: p.imap_unordered(square, [1]),
             lambda: p.starmap(add, [(1, 2)]), lambda: p.starmap_async(add, [(1, 2)])]
    for call in calls:
        with pytest.raises(ValueError):
            call()
    p.join()


@pytest.mark.any_backend
def test_terminate_while_tasks_run(make_pool, tmp_path, fiberrl_backend):
    p = make_pool(2)
    results = [p.apply_async(mark_then_sleep, (str(tmp_path), i, 120)) for i in range(100)]
    mapped = p.map_async(pool_helpers.sleep_then_pid, [120] * 4)
    it = p.imap(pool_helpers.sleep_then_pid, [120] * 4)
    assert wait_until(lambda: len(os.listdir(tmp_path)) >= 2, 60), "tasks did not start"
    workers = p.workers()
    pids = [w.pid for w in workers if w.pid is not None]
    assert len(pids) >= 2
    started = time.monotonic()
    p.terminate()
    assert time.monotonic() - started < 5, "terminate() must not wait for running tasks"
    started = time.monotonic()
    p.join()
    assert time.monotonic() - started < 5
    with pytest.raises(fiberrl.PoolTerminatedError):
        mapped.get(timeout=10)
    with pytest.raises(fiberrl.PoolTerminatedError):
        it.next(timeout=10)
    for result in results:
        with pytest.raises(fiberrl.PoolTerminatedError):
            result.get(timeout=10)
    # the jobs are over (the backend says so; a closed process object had ended)
    assert all(w._closed or w.exitcode is not None for w in workers)
    if fiberrl_backend == "local":  # and the OS agrees (pids elsewhere are not this host's)
        assert wait_until(lambda: all(process_gone(pid) for pid in pids), 5), \
            [pid for pid in pids if not process_gone(pid)]


def test_context_manager_exit_terminates(tmp_path):
    with fiberrl.Pool(2) as p:
        result = p.apply_async(mark_then_sleep, (str(tmp_path), 0, 120))
        assert wait_until(lambda: os.listdir(tmp_path), 60)
        pids = [w.pid for w in p.workers() if w.pid is not None]
        started = time.monotonic()
    assert time.monotonic() - started < 5
    p.join()
    with pytest.raises(fiberrl.PoolTerminatedError):
        result.get(timeout=10)
    assert wait_until(lambda: all(process_gone(pid) for pid in pids), 5)


# -- fiberrl's extras ------------------------------------------------------------------------
def test_stats(pool, tmp_path):
    stats = pool.stats()
    assert dataclasses.is_dataclass(stats) and type(stats).__name__ == "PoolStats"
    for name in STATS_FIELDS:
        assert isinstance(getattr(stats, name), int), name
    assert stats.target == pool.processes == 2 and stats.alive == 2
    assert stats.worker_deaths == 0 and stats.retried == 0
    before = stats.completed
    assert pool.map(square, range(10), 1) == SQUARES[:10]
    assert wait_until(lambda: pool.stats().completed - before >= 10, 5)
    assert pool.stats().completed - before == 10

    release, started = tmp_path / "release", tmp_path / "started"
    started.mkdir()
    results = [pool.apply_async(mark_then_wait, (str(started), str(release), i))
               for i in range(6)]
    try:
        assert wait_until(lambda: len(os.listdir(started)) == 2, 30)
        busy = pool.stats()
        assert busy.alive == 2 and busy.idle == 0, busy
        assert busy.queued + busy.pending >= 4, busy
    finally:
        touch(release)
    assert [r.get(timeout=GET) for r in results] == list(range(6))
    assert wait_until(lambda: pool.stats().idle == 2, 10), pool.stats()
    done = pool.stats()
    assert done.queued == 0 and done.pending == 0, done


def test_workers_are_process_objects(pool):
    workers = pool.workers()
    assert len(workers) == 2
    for worker in workers:
        assert isinstance(worker, fiberrl.Process)
        assert worker.is_alive() and worker.job_id
    pids = {w.pid for w in workers}
    assert set(pool.map(pool_helpers.sleep_then_pid, [0.3] * 8, 1)) <= pids


@pytest.mark.any_backend
def test_resize_up_and_down(make_pool):
    live = pool_helpers.live_workers
    p = make_pool(1)
    assert p.processes == 1
    assert wait_until(lambda: p.stats().alive == 1, 60)
    assert set(p.map(pool_helpers.sleep_then_worker_name, [0.1] * 4, 1)) == live(p)

    p.resize(4)
    assert p.processes == 4 and p.stats().target == 4
    assert wait_until(lambda: p.stats().alive == 4 and len(live(p)) == 4, 60), p.stats()
    workers = set(p.map_async(pool_helpers.sleep_then_worker_name, [0.5] * 8, 1).get(timeout=GET))
    assert len(workers) >= 3
    four = {w.job_id for w in p.workers()}

    result = p.map_async(functools.partial(pool_helpers.sleep_then_square_pid, seconds=0.1),
                         range(12), 1)
    p.resize(1)
    assert p.processes == 1 and p.stats().target == 1
    assert [v for v, _ in result.get(timeout=GET)] == SQUARES[:12]
    # retired workers hold no task once the map is done: they should stop at once (their
    # jobs end, and the pool forgets them)
    assert wait_until(lambda: p.stats().alive == 1 and len(live(p)) == 1, 5), p.stats()
    assert wait_until(lambda: len(four - {w.job_id for w in p.workers()}) == 3, 5)
    assert p.map(square, range(20)) == SQUARES[:20]


def test_idle_timeout_releases_workers_and_restarts_them(make_pool):
    p = make_pool(2, idle_timeout=1)
    assert p.map_async(square, range(10)).get(timeout=GET) == SQUARES[:10]
    pids = {w.pid for w in p.workers() if w.pid is not None}
    assert wait_until(lambda: p.stats().alive == 0, 15), p.stats()
    assert wait_until(lambda: all(process_gone(pid) for pid in pids), 10)
    assert p.map_async(square, range(10)).get(timeout=GET) == SQUARES[:10]


# -- resources -----------------------------------------------------------------------------
def test_abandoned_results_do_not_keep_their_values(pool):
    gc.collect()
    assert len(pool_helpers.LIVE) == 0
    results = [pool.apply_async(pool_helpers.make_tracked, (16,)) for _ in range(1000)]
    for result in results:
        result.wait(timeout=GET)
    assert all(r.ready() for r in results)
    del results, result
    gc.collect()
    assert wait_until(lambda: gc.collect() == 0 and len(pool_helpers.LIVE) == 0, 5), \
        f"{len(pool_helpers.LIVE)} results of dropped AsyncResults are still alive"


def _trimmed_rss():
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass
    return psutil.Process().memory_info().rss


def test_abandoned_large_results_release_their_memory(pool):
    size, count, mb = 1_000_000, 200, 1024 * 1024
    warm = [pool.apply_async(pool_helpers.make_bytes, (size,)) for _ in range(count)]
    assert all(len(r.get(timeout=GET)) == size for r in warm)
    del warm
    baseline = _trimmed_rss()
    results = [pool.apply_async(pool_helpers.make_bytes, (size,)) for _ in range(count)]
    for result in results:
        result.wait(timeout=GET)
    held = _trimmed_rss()
    assert held - baseline > 100 * mb, "results should be in this process once ready()"
    del results, result
    after = _trimmed_rss()
    assert after - baseline < 100 * mb, \
        f"RSS {(after - baseline) / mb:.0f} MB above baseline after dropping the results"


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_repeated_pools_do_not_leak_fds_or_threads():
    me = psutil.Process()
    baseline = None
    for i in range(100):
        with fiberrl.Pool(1) as p:
            assert p.map_async(square, [i, i + 1]).get(timeout=GET) == [i * i, (i + 1) ** 2]
            p.close()
            p.join()
        if i == 4:
            gc.collect()
            baseline = (me.num_fds(), me.num_threads())

    def settled():
        gc.collect()
        return me.num_fds() <= baseline[0] + 8 and me.num_threads() <= baseline[1] + 3

    assert wait_until(settled, 10), \
        f"fds {baseline[0]} -> {me.num_fds()}, threads {baseline[1]} -> {me.num_threads()}"


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_256_workers_map_10000_tasks():
    p = fiberrl.Pool(256)
    try:
        assert p.processes == 256
        assert wait_until(lambda: p.stats().alive == 256, 600, 0.5), p.stats()
        out = p.map_async(functools.partial(pool_helpers.sleep_then_square_pid, seconds=0.01),
                          range(10_000)).get(timeout=300)
        assert [v for v, _ in out] == [i * i for i in range(10_000)]
        assert len({pid for _, pid in out}) >= 128
    finally:
        p.terminate()
        p.join()
