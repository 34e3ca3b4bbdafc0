"""``Pool(error_handling=...)``: a task that raises runs again (Uber Fiber's meaning).

The first tests are Fiber's own (its ``tests/test_pool.py``: 300 items, a task that
raises ``ValueError`` in 5% of its calls, every result back in order); the others pin
down what fiberrl decided where Fiber said nothing: how many runs, what the caller
gets when every run raised, that only the items of a chunk that raised run again, and
how it composes with the pending table's re-runs after a worker died.
"""
import os

import pytest

import fiberrl
import fiberrl.pool
import pool_helpers
from fiberrl.pool.rerun import DEFAULT_ERROR_RETRIES
from pool_helpers import runs_of

GET = 120


# -- Fiber's test bodies --------------------------------------------------------------
@pytest.mark.parametrize("fiberrl_backend", ["local", pytest.param("slurm", marks=pytest.mark.slurm)],
                         indirect=True)
def test_fibers_error_handling_map(fiberrl_backend, make_pool):
    pool = make_pool(3, error_handling=True)
    pool.start_workers()
    pool.wait_until_workers_up()
    res = pool.map(pool_helpers.random_error_worker, [i for i in range(300)], chunksize=1)
    assert res == [i for i in range(300)]


def test_fibers_error_handling_imap_unordered(make_pool):
    pool = make_pool(3, error_handling=True)
    pool.start_workers()
    pool.wait_until_workers_up()
    res = list(pool.imap_unordered(pool_helpers.random_error_worker, [i for i in range(300)],
                                   chunksize=1))
    res.sort()
    assert res == [i for i in range(300)]


def test_fibers_case_with_chunks_map_and_imap(make_pool):
    """Fiber's task with the default chunksize and with chunks of 7: a chunk's items
    that raised run again, the others keep their results."""
    pool = make_pool(3, error_handling=True)
    assert pool.map(pool_helpers.random_error_worker, range(300)) == list(range(300))
    assert list(pool.imap(pool_helpers.random_error_worker, range(300), 7)) == list(range(300))
    assert pool.stats().error_reruns > 0


# -- what fiberrl decided ----------------------------------------------------------------
def test_default_hands_the_exception_to_the_caller_at_once(make_pool, tmp_path):
    pool = make_pool(2)
    task = _bound(pool_helpers.raise_first_runs, str(tmp_path), {3: 1})
    with pytest.raises(ValueError, match="item 3 raised on run 1"):
        pool.map(task, range(6), chunksize=1)
    assert runs_of(tmp_path, 3) == 1
    assert pool.stats().error_reruns == 0


@pytest.mark.parametrize("chunksize", [1, 4])
def test_a_task_that_raised_runs_again_until_it_succeeds(make_pool, tmp_path, chunksize):
    pool = make_pool(2, error_handling=True)
    failing = {3: 2, 5: DEFAULT_ERROR_RETRIES}   # 5 succeeds on its last allowed run
    task = _bound(pool_helpers.raise_first_runs, str(tmp_path), failing)
    assert pool.map(task, range(10), chunksize) == [x * x for x in range(10)]
    assert runs_of(tmp_path, 3) == 3
    assert runs_of(tmp_path, 5) == DEFAULT_ERROR_RETRIES + 1
    # only the items that raised ran again; their chunk-mates kept their first result
    assert [runs_of(tmp_path, x) for x in range(10) if x not in failing] == [1] * 8
    assert pool.stats().error_reruns == 2 + DEFAULT_ERROR_RETRIES


def test_every_run_raised_gives_the_last_exception_naming_item_and_runs(make_pool, tmp_path):
    pool = make_pool(2, error_handling=True)
    task = _bound(pool_helpers.raise_first_runs, str(tmp_path), {6: -1})
    with pytest.raises(ValueError) as caught:
        pool.map(task, range(10), chunksize=4)
    runs = DEFAULT_ERROR_RETRIES + 1
    assert str(caught.value) == f"item 6 raised on run {runs}"   # the last run's
    notes = getattr(caught.value, "__notes__", [])
    assert f"error_handling: it raised on each of its {runs} runs; this is the last run's " \
           "exception" in notes
    assert "raised by map of partial(raise_first_runs), item 6 of the input (its chunk: items 4-7)" \
        in notes
    assert runs_of(tmp_path, 6) == runs


def test_an_int_sets_how_many_more_runs(make_pool, tmp_path):
    pool = make_pool(1, error_handling=2)
    result = pool.apply_async(pool_helpers.raise_first_runs, (str(tmp_path), {0: -1}, 0))
    with pytest.raises(ValueError, match="raised on run 3"):
        result.get(timeout=GET)
    assert runs_of(tmp_path, 0) == 3
    assert pool.apply(pool_helpers.raise_first_runs, (str(tmp_path), {1: 2}, 1)) == 1


def test_error_callback_gets_only_the_final_exception(make_pool, tmp_path):
    pool = make_pool(2, error_handling=1)
    errors, values = [], []
    ok = pool.apply_async(pool_helpers.raise_first_runs, (str(tmp_path), {1: 1}, 1),
                          callback=values.append, error_callback=errors.append)
    bad = pool.apply_async(pool_helpers.raise_first_runs, (str(tmp_path), {2: -1}, 2),
                           callback=values.append, error_callback=errors.append)
    assert ok.get(timeout=GET) == 1
    with pytest.raises(ValueError):
        bad.get(timeout=GET)
    assert values == [1]
    assert len(errors) == 1 and "raised on run 2" in str(errors[0])


def test_imap_yields_in_order_and_raises_at_the_item_that_kept_raising(make_pool, tmp_path):
    pool = make_pool(2, error_handling=1)
    task = _bound(pool_helpers.raise_first_runs, str(tmp_path), {2: 1, 4: -1})
    it = pool.imap(task, range(6))
    got = []
    for _ in range(6):
        try:
            got.append(it.next(timeout=GET))
        except ValueError:
            got.append("raised")
    assert got == [0, 1, 4, 9, "raised", 25]


def test_a_death_and_a_raise_are_counted_apart(make_pool, tmp_path):
    """The pending table re-runs the task its worker died with; the task then raises
    and error_handling runs it again: both budgets apply, neither uses up the other."""
    pool = make_pool(2, error_handling=1, max_task_retries=2)
    assert pool.apply(pool_helpers.die_then_raise, (str(tmp_path), 4)) == 16
    assert runs_of(tmp_path, 4) == 3
    stats = pool.stats()
    assert (stats.worker_deaths, stats.retried, stats.error_reruns) == (1, 1, 1), stats


@pytest.mark.parametrize("value, error", [("yes", TypeError), (1.5, TypeError), (-1, ValueError)])
def test_bad_error_handling_values(value, error):
    with pytest.raises(error, match="error_handling"):
        fiberrl.Pool(1, error_handling=value)


def test_fibers_positional_error_handling_is_refused_not_taken_for_a_context():
    with pytest.raises(TypeError, match="positional"):
        fiberrl.Pool(2, None, (), None, True)   # the context's Pool: no fifth argument
    with pytest.raises(TypeError, match="error_handling=True"):
        fiberrl.pool.Pool(2, None, (), None, True)   # the class: its fifth is context


def _bound(func, *args):
    import functools
    return functools.partial(func, *args)
