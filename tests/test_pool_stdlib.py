"""fiberrl.pool against the stdlib's own expectations: the names it re-exports, what a
task error and an unpicklable result arrive as, the initializer with no task, and
the ResourceWarning of a pool collected while running."""
import gc
import multiprocessing.pool
import warnings

import pytest

import fiberrl
import fiberrl.pool

pytestmark = pytest.mark.timeout(180)


def _count_start(counter):
    with counter.get_lock():
        counter.value += 1


def _raise_runtime_error():
    raise RuntimeError(123)  # the line the remote traceback must show


def _return_lambda():
    return lambda: 1


def test_stdlib_names_are_the_stdlibs():
    for name in ("RemoteTraceback", "MaybeEncodingError", "ThreadPool", "RUN", "CLOSE",
                 "TERMINATE", "ExceptionWithTraceback"):
        assert getattr(fiberrl.pool, name) is getattr(multiprocessing.pool, name), name


@pytest.mark.parametrize("processes", [1, 2])
def test_initializer_runs_on_every_worker_without_tasks(processes):
    counter = fiberrl.Value("i", 0)
    pool = fiberrl.Pool(processes, _count_start, (counter,))
    pool.close()
    pool.join(60)
    assert counter.value == processes


def test_constructor_does_not_wait_for_workers():
    pool = fiberrl.Pool(1)
    try:
        assert pool.stats().alive == 0  # nothing has said hello yet
    finally:
        pool.terminate()
        pool.join()


def test_task_error_cause_is_remote_traceback():
    with fiberrl.Pool(1) as pool:
        with pytest.raises(RuntimeError) as info:
            pool.apply(_raise_runtime_error)
    pool.join()
    assert info.value.args == (123,)
    cause = info.value.__cause__
    assert type(cause) is fiberrl.pool.RemoteTraceback
    assert "raise RuntimeError(123)  # the line the remote traceback must show" in cause.tb


def test_unpicklable_result_is_maybe_encoding_error():
    with fiberrl.Pool(1) as pool:
        with pytest.raises(fiberrl.pool.MaybeEncodingError) as info:
            pool.apply_async(_return_lambda).get(60)
        assert pool.apply(abs, (-3,)) == 3  # the worker survives it
    pool.join()
    assert "lambda" in repr(info.value.value)


def test_resource_warning_for_running_pool_collected():
    pool = fiberrl.Pool(1)
    pool.terminate()
    pool.join()
    pool._state = fiberrl.pool.RUN  # as CPython's test_resource_warning does
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        pool = None
        gc.collect()
    assert any(issubclass(w.category, ResourceWarning)
               and "unclosed running multiprocessing pool" in str(w.message) for w in caught)


def test_thread_pool():
    with fiberrl.pool.ThreadPool(2) as pool:
        assert pool.map(abs, [-1, -2, 3]) == [1, 2, 3]


def _square(x):
    return x * x


def test_a_replaced_workers_object_stays_usable():
    # the stdlib's pool never closes its workers: code holding ``pool._pool`` (CPython's
    # test_pool_worker_lifetime) asks is_alive() of one that has ended meanwhile
    import time
    with fiberrl.Pool(1, maxtasksperchild=1) as pool:
        first = pool._pool[0]
        assert pool.apply(_square, (3,)) == 9   # its one task: it exits, and is replaced
        deadline = time.monotonic() + 60
        while first in pool._pool and time.monotonic() < deadline:
            time.sleep(0.05)
        assert first not in pool._pool
        time.sleep(0.5)   # (the supervisor's clean-up after a worker's end)
        assert not first.is_alive()
        assert first.exitcode == 0
        assert pool.apply(_square, (4,)) == 16


def test_a_pool_nobody_holds_lives_until_its_results_are_in():
    """``Pool(2).map_async(...)`` with the pool dropped at once: the stdlib's results
    keep their pool running until they are ready, so they arrive (fiberrl's pool was
    terminated by the collector: "the pool was terminated before this result was
    ready"). A fire-and-forget ``apply_async`` with a callback gets its callback too."""
    import threading
    result = fiberrl.Pool(2).map_async(_square, range(8))
    gc.collect()
    assert result.get(timeout=60) == [x * x for x in range(8)]
    one = fiberrl.Pool(1).apply_async(_square, (7,))
    gc.collect()
    assert one.get(timeout=60) == 49
    items = fiberrl.Pool(1).imap(_square, range(5))
    gc.collect()
    assert list(items) == [0, 1, 4, 9, 16]
    called = threading.Event()
    fiberrl.Pool(1).apply_async(_square, (3,), callback=lambda value: called.set())
    gc.collect()
    assert called.wait(60)
    del result, one, items
    gc.collect()
