"""The pool's argument cache (fiberrl.pool.shared): a large argument used by many tasks
crosses the wire once per worker; a changed object is sent again; entries are freed when
no task uses them; each worker's cache stays within its bound; a replaced worker gets
the data again."""
import os
import signal
import time

import numpy as np
import pytest

from arg_cache_tasks import probe, total
from pool_helpers import wait_until

MIB = 1024 * 1024


def up(pool, n):
    assert wait_until(lambda: pool.stats().alive == n, 120), pool.stats()
    return pool


def test_shared_argument_crosses_the_wire_once_per_worker(make_pool):
    pool = up(make_pool(2), 2)
    array = np.full(MIB // 8, 0.5)  # 1 MiB
    before = pool.stats()
    results = pool.starmap(total, [(array,)] * 64, chunksize=1)
    after = pool.stats()
    assert [r[0] for r in results] == [array.sum()] * 64
    assert (array == 0.5).all()  # the tasks modified their own copies only
    sent = after.payload_bytes_sent - before.payload_bytes_sent
    workers = len({pid for _, pid, _ in results})
    assert after.cached_arg_sends - before.cached_arg_sends == workers
    assert sent < (workers + 0.5) * MIB  # not 64 MiB
    assert after.cached_arg_hits - before.cached_arg_hits == 64 - workers


def test_a_shared_torch_tensor_crosses_the_wire_once_per_worker(make_pool):
    torch = pytest.importorskip("torch")
    from arg_cache_tasks import tensor_total
    pool = up(make_pool(2), 2)
    tensor = torch.full((MIB // 4,), 0.5)  # 1 MiB of float32
    before = pool.stats()
    results = pool.map(tensor_total, [tensor] * 32, chunksize=1)
    after = pool.stats()
    assert [r[0] for r in results] == [float(tensor.double().sum())] * 32
    assert bool((tensor == 0.5).all())  # the tasks modified their own copies only
    workers = len({pid for _, pid in results})
    assert after.cached_arg_sends - before.cached_arg_sends == workers
    assert after.payload_bytes_sent - before.payload_bytes_sent < (workers + 0.5) * MIB
    tensor[:10] = 2.0   # changed in place: sent again, never served stale
    assert {r[0] for r in pool.map(tensor_total, [tensor] * 8, chunksize=1)} == \
        {float(tensor.double().sum())}


def test_a_changed_object_is_sent_again_and_never_served_stale(make_pool):
    pool = up(make_pool(2), 2)
    array = np.zeros(MIB // 8)
    first = pool.starmap(total, [(array,)] * 16, chunksize=1)
    sends = pool.stats().cached_arg_sends
    array[:10] = 1.0  # in place: the same object, other bytes
    second = pool.starmap(total, [(array,)] * 16, chunksize=1)
    assert {r[0] for r in first} == {0.0}
    assert {r[0] for r in second} == {10.0}
    assert pool.stats().cached_arg_sends > sends
    # a task's arguments are the bytes at submission, even while an entry for the same
    # object is alive and cached in the workers
    slow = pool.starmap_async(total, [(array, 0.3)] * 4, chunksize=1)
    array[:20] = 1.0
    fresh = pool.starmap_async(total, [(array,)] * 8, chunksize=1)
    assert {r[0] for r in slow.get(60)} == {10.0}
    assert {r[0] for r in fresh.get(60)} == {20.0}


def test_entries_are_freed_when_no_task_uses_them(make_pool):
    pool = up(make_pool(2), 2)
    array = np.ones(MIB // 8)
    during = pool.starmap(total, [(array, 0.05)] * 16, chunksize=1)
    assert all(cached >= MIB for _, _, cached in during)  # the workers held it
    assert pool.stats().cached_args == 0
    time.sleep(0.5)  # the pool tells idle workers within a tick
    after = pool.map(probe, [0.1] * 8, chunksize=1)
    assert len({pid for pid, _ in after}) == 2
    assert [cached for _, cached in after] == [0] * 8


def test_each_workers_cache_stays_within_its_bound(make_pool):
    # two live 1 MiB arrays, alternating, on one worker whose cache holds 1.5 MiB; tasks
    # of 60 ms go one at a time, so each array must evict the other and be sent again
    tasks = [(np.zeros(MIB // 8), 0.06), (np.ones(MIB // 8), 0.06)] * 5
    pool = up(make_pool(1, arg_cache_bytes=3 * MIB // 2), 1)
    results = pool.starmap(total, tasks, chunksize=1)
    assert [r[0] for r in results] == [0.0, MIB / 8] * 5
    assert max(cached for _, _, cached in results) <= 2 * MIB  # at most the held tasks'
    assert pool.stats().cached_arg_sends > 2  # evictions forced re-sends
    unbounded = up(make_pool(1), 1)
    unbounded.starmap(total, tasks, chunksize=1)
    assert unbounded.stats().cached_arg_sends == 2


def test_a_replaced_worker_gets_the_data_again(make_pool):
    pool = up(make_pool(2), 2)
    original = {w.pid for w in pool.workers()}
    array = np.full(MIB // 8, 2.0)
    result = pool.starmap_async(total, [(array, 0.15)] * 40, chunksize=1)
    assert wait_until(lambda: pool.stats().cached_arg_sends == 2, 60), pool.stats()
    os.kill(sorted(original)[0], signal.SIGKILL)
    results = result.get(120)
    assert [r[0] for r in results] == [array.sum()] * 40
    stats = pool.stats()
    assert stats.worker_deaths == 1
    newcomers = {pid for _, pid, _ in results} - original
    if not newcomers:
        pytest.skip("the replacement started after the map was over (machine too slow)")
    assert stats.cached_arg_sends >= 3


def test_the_bound_is_validated():
    import fiberrl
    with pytest.raises(ValueError, match="arg_cache_bytes"):
        fiberrl.Pool(1, arg_cache_bytes=-1)
