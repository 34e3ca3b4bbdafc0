"""The pool's fast paths for many small tasks: scalars that travel inside the message
header, runs of one-item map tasks, and the bounded window of a blocking ``map``."""
import functools
import threading

import pytest

import pool_helpers
from pool_helpers import Boom, fail_on, identity, square_with_pid

pytestmark = pytest.mark.timeout(180)

GET = 120
SCALARS = [0, -1, 2**100, True, False, 1.5, -0.0, 2j, None, "é", "", b"\x00b", b""]


@pytest.fixture(scope="module")
def pool():
    with pool_helpers.pool_with_workers_up(2) as shared:
        yield shared


@pytest.mark.parametrize("chunksize", [1, 3, 40])
def test_scalars_come_back_with_their_values_and_exact_types(pool, chunksize):
    data = SCALARS * 20
    got = pool.map(identity, data, chunksize=chunksize)
    assert got == data
    assert [type(x) for x in got] == [type(x) for x in data]  # True stays a bool, not 1
    got = list(pool.imap(identity, data, chunksize))
    assert got == data and [type(x) for x in got] == [type(x) for x in data]
    assert pool.apply(identity, (2**100,)) == 2**100
    assert type(pool.apply(identity, (True,))) is bool


def test_scalars_mixed_with_other_items_and_results(pool):
    data = [1, (2, 3), "a", [4], None, {"k": 5}, 6.5] * 30
    assert pool.map(identity, data, chunksize=1) == data
    # scalar items whose results are no scalars (tuples): sent back one by one
    got = pool.map(square_with_pid, range(200), chunksize=1)
    assert [square for square, _ in got] == [x * x for x in range(200)]
    assert isinstance(got[0], tuple)


def test_a_failure_inside_a_run_of_one_item_tasks_names_its_item(pool):
    data = [x + 0.5 for x in range(40)] + [37] + list(range(40, 80))
    with pytest.raises(Boom) as info:
        pool.map(functools.partial(fail_on, bad=37), data, chunksize=1)
    assert "partial(fail_on), item 40 of the input" in " | ".join(info.value.__notes__), info.value.__notes__


def _max_outstanding(pool, run):
    """The most tasks queued or pending at once while ``run()`` runs."""
    most, stop = [0], threading.Event()

    def sample():
        while not stop.is_set():
            stats = pool.stats()
            most[0] = max(most[0], stats.queued + stats.pending)
            stop.wait(0.001)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        run()
    finally:
        stop.set()
        sampler.join(10)
    return most[0]


def test_a_blocking_map_keeps_a_bounded_window_of_tasks(pool):
    window = pool._map_window()
    n = 8 * window
    most = _max_outstanding(pool, lambda: pool.map(identity, range(n), chunksize=1))
    # a batch of 256 past it at most, and a sample may count tasks moving from the queue
    # to the pending table twice: well under what an unbounded map keeps (about n / 2)
    assert most < 1.5 * window, (most, window)
    assert pool.map(identity, range(n), chunksize=1) == list(range(n))


def test_every_task_of_a_failed_blocking_map_still_runs(pool):
    """As with the stdlib, which queues a map's tasks all at once: the window only
    paces submission, it does not drop the input after a failure."""
    before = pool.stats().completed
    n = 3 * pool._map_window()
    with pytest.raises(Boom):
        pool.map(fail_on, range(n), chunksize=1)   # every item fails
    assert pool_helpers.wait_until(lambda: pool.stats().completed - before >= n, GET), \
        pool.stats()
    assert pool.stats().completed - before == n
