"""fiberrl.Pool's ``progress=`` argument: a callable, an object with ``update``, ``True``
for a bar on stderr, across every mapping method (split from test_pool.py)."""
import pytest

import pool_helpers
from pool_helpers import power, square, wait_until

pytestmark = pytest.mark.timeout(180)

GET = 60  # seconds any single result may take
SQUARES = [i * i for i in range(50)]


@pytest.fixture(scope="module", autouse=True)
def pool():
    """One local pool shared by this file's tests. Autouse, so its workers exist before
    each test's leak check takes its snapshot."""
    with pool_helpers.pool_with_workers_up(2) as shared:
        yield shared


METHODS = ["map", "map_async", "imap", "imap_unordered", "starmap", "starmap_async"]


def _run(p, method, progress, n=25, chunksize=None, inputs=None):
    items = range(n) if inputs is None else inputs
    kwargs = {"progress": progress}
    if chunksize is not None:
        kwargs["chunksize"] = chunksize
    if method == "map":
        return p.map(square, items, **kwargs)
    if method == "map_async":
        return p.map_async(square, items, **kwargs).get(timeout=GET)
    if method == "imap":
        return list(p.imap(square, items, **kwargs))
    if method == "imap_unordered":
        return sorted(p.imap_unordered(square, items, **kwargs))
    pairs = [(i, 2) for i in items]
    if method == "starmap":
        return p.starmap(power, pairs, **kwargs)
    return p.starmap_async(power, pairs, **kwargs).get(timeout=GET)


@pytest.mark.parametrize("method", METHODS)
def test_progress_callable(pool, method):
    calls = []
    assert _run(pool, method, lambda done, total: calls.append((done, total)),
                chunksize=4) == SQUARES[:25]
    assert wait_until(lambda: calls and calls[-1] == (25, 25), 5), calls[-3:]
    dones = [done for done, _ in calls]
    assert dones == sorted(dones) and all(total == 25 for _, total in calls)


@pytest.mark.parametrize("method", ["imap", "imap_unordered"])
def test_progress_total_is_none_without_len(pool, method):
    calls = []
    got = _run(pool, method, lambda done, total: calls.append((done, total)),
               inputs=(i for i in range(10)))
    assert got == SQUARES[:10]
    assert wait_until(lambda: calls and calls[-1][0] == 10, 5), calls[-3:]
    assert all(total is None for _, total in calls)


class _Bar:
    def __init__(self):
        self.steps = []

    def update(self, n=1):
        self.steps.append(n)


@pytest.mark.parametrize("method", METHODS)
def test_progress_object_with_update(pool, method):
    bar = _Bar()
    assert _run(pool, method, bar, chunksize=4) == SQUARES[:25]
    assert wait_until(lambda: sum(bar.steps) >= 25, 5), bar.steps
    assert sum(bar.steps) == 25 and all(step > 0 for step in bar.steps), bar.steps


def test_progress_true_draws_on_stderr_and_default_draws_nothing(pool, capfd):
    capfd.readouterr()
    assert pool.map(square, range(30)) == SQUARES[:30]
    assert capfd.readouterr().err == ""
    assert pool.map(square, range(30), progress=True) == SQUARES[:30]
    err = capfd.readouterr().err
    assert err.strip() and ("30" in err or "100%" in err), err
