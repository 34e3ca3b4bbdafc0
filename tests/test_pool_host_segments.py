"""Large shared arguments on one host (fiberrl.pool.segments): written once into memory
that every worker of the host maps, instead of one copy per worker through its stream;
freed when no task uses them; sent again when changed; correct when workers die
mid-broadcast, and when a worker cannot map them (it asks for the bytes)."""
import os
import signal

import numpy as np
import pytest

from arg_cache_tasks import held_segments, receipt, refuse_mapping
from pool_helpers import wait_until

from fiberrl.pool import segments

MIB = 1024 * 1024

pytestmark = pytest.mark.skipif(not segments.AVAILABLE, reason="needs Linux memfd and /proc")


def up(pool, n):
    assert wait_until(lambda: pool.stats().alive == n, 120), pool.stats()
    return pool


def master_segments():
    """Host segments this process holds open."""
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            count += "memfd:fiberrl-arg" in os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
    return count


def test_workers_of_one_host_map_the_same_buffer_and_copy_no_bytes(make_pool):
    pool = up(make_pool(2), 2)
    array = np.full(4 * MIB // 8, 0.5)   # 4 MiB
    before = pool.stats()
    results = pool.starmap(receipt, [(array, 0.01)] * 32, chunksize=1)
    after = pool.stats()
    assert [r[0] for r in results] == [array.sum()] * 32
    assert (array == 0.5).all()            # each task changed its own copy only
    by_worker = {pid: (counters, inodes) for _, pid, counters, inodes in results}
    assert len(by_worker) == 2, "both workers ran tasks"
    inodes = set()
    for counters, held in by_worker.values():
        assert counters["received_bytes"] == 0   # no worker copied the bytes in
        assert counters["mapped"] >= 1
        assert len(held) == 1
        inodes.update(held)
    assert len(inodes) == 1                       # one buffer, mapped by both
    assert after.shared_arg_maps - before.shared_arg_maps == 2
    assert after.payload_bytes_sent - before.payload_bytes_sent < MIB // 4   # no 4 MiB copy


def test_the_buffer_is_freed_when_no_task_uses_it(make_pool):
    pool = up(make_pool(2), 2)
    array = np.ones(2 * MIB // 8)
    baseline = master_segments()
    pending = pool.starmap_async(receipt, [(array, 0.1)] * 8, chunksize=1)
    assert wait_until(lambda: master_segments() == baseline + 1, 60)   # while tasks use it
    pending.get(60)
    assert pool.stats().cached_args == 0
    assert master_segments() == baseline
    # the workers are told within a tick (~0.1 s) to drop it
    assert wait_until(lambda: all(not inodes for _, inodes in
                                  pool.map(held_segments, [0.05] * 4, chunksize=1)), 10)


def test_a_changed_object_is_mapped_anew(make_pool):
    pool = up(make_pool(2), 2)
    array = np.zeros(MIB // 8)
    first = pool.starmap(receipt, [(array,)] * 8, chunksize=1)
    maps = pool.stats().shared_arg_maps
    array[:10] = 1.0
    second = pool.starmap(receipt, [(array,)] * 8, chunksize=1)
    assert {r[0] for r in first} == {0.0}
    assert {r[0] for r in second} == {10.0}
    assert pool.stats().shared_arg_maps > maps


def test_workers_killed_mid_broadcast_lose_nothing(make_pool):
    pool = up(make_pool(3), 3)
    victims = [w.pid for w in pool.workers()][:2]
    array = np.arange(2 * MIB // 8, dtype=np.float64)
    result = pool.starmap_async(receipt, [(array, 0.05)] * 60, chunksize=1)
    assert wait_until(lambda: pool.stats().shared_arg_maps >= 2, 60), pool.stats()
    for pid in victims:
        os.kill(pid, signal.SIGKILL)
    results = result.get(120)
    assert [r[0] for r in results] == [array.sum()] * 60
    assert pool.stats().worker_deaths == 2
    assert up(pool, 3) and pool.stats().cached_args == 0


def test_a_worker_that_cannot_map_asks_for_the_bytes(make_pool):
    pool = up(make_pool(1, initializer=refuse_mapping), 1)
    array = np.full(2 * MIB // 8, 3.0)
    before = pool.stats()
    results = pool.starmap(receipt, [(array,)] * 6, chunksize=1)
    after = pool.stats()
    assert [r[0] for r in results] == [array.sum()] * 6
    counters = results[-1][2]
    assert counters["mapped"] == 0 and counters["received_bytes"] == 2 * MIB
    assert after.payload_bytes_sent - before.payload_bytes_sent >= 2 * MIB
    # from then on it gets bytes at once (no second refusal and request)
    again = pool.starmap(receipt, [(array + 1,)] * 6, chunksize=1)
    assert [r[0] for r in again] == [(array + 1).sum()] * 6
    assert pool.stats().shared_arg_maps == after.shared_arg_maps


def test_another_host_receives_the_bytes_once_and_its_workers_map_them(make_pool, tmp_path):
    """Workers that say they run on two other hosts (two each): one worker of each host
    receives the bytes, keeps them in a segment and is its host's relay; the other maps
    that segment. One copy per host leaves the pool's process, not one per worker."""
    from arg_cache_tasks import pretend_host, receipt_on_host
    pool = up(make_pool(4, initializer=pretend_host, initargs=(str(tmp_path / "hosts"),)), 4)
    array = np.full(2 * MIB // 8, 1.5)   # 2 MiB
    before = pool.stats()
    results = pool.starmap(receipt_on_host, [(array, 0.02)] * 48, chunksize=1)
    after = pool.stats()
    assert [r[0] for r in results] == [array.sum()] * 48
    sent = after.payload_bytes_sent - before.payload_bytes_sent
    assert 2 * 2 * MIB <= sent < 2.5 * 2 * MIB, sent   # two hosts: two copies
    by_worker = {pid: (host, counters, inodes) for _, pid, counters, inodes, host in results}
    hosts = {}
    for host, counters, inodes in by_worker.values():
        hosts.setdefault(host, []).append((counters, inodes))
    assert sorted(hosts) == ["pretend-0", "pretend-1"]
    for host, workers in hosts.items():
        receivers = [c for c, _ in workers if c["received_bytes"] == 2 * MIB]
        mappers = [c for c, _ in workers if c["received_bytes"] == 0 and c["mapped"] >= 1]
        assert len(receivers) == 1 and len(receivers) + len(mappers) == len(workers), workers
        assert len({i for _, inodes in workers for i in inodes}) == 1   # one buffer a host
    assert after.shared_arg_maps - before.shared_arg_maps == len(by_worker) - 2


def test_relays_killed_mid_broadcast_lose_nothing(make_pool, tmp_path):
    from arg_cache_tasks import pretend_host, receipt_on_host
    pool = up(make_pool(4, initializer=pretend_host, initargs=(str(tmp_path / "hosts"),)), 4)
    array = np.arange(2 * MIB // 8, dtype=np.float64)
    result = pool.starmap_async(receipt_on_host, [(array, 0.05)] * 80, chunksize=1)
    assert wait_until(lambda: pool.stats().shared_arg_maps >= 2, 60), pool.stats()
    dispatcher = pool._core.dispatcher
    with dispatcher.lock:   # the workers that are their host's relay now
        relays = {relay[0] for entry in dispatcher.buffers._by_object.values()
                  for relay in entry.relays.values() if type(relay) is tuple}
        victims = [dispatcher.links[i].pid for i in relays if i in dispatcher.links]
    assert victims
    for pid in victims:
        os.kill(pid, signal.SIGKILL)
    results = result.get(120)
    assert [r[0] for r in results] == [array.sum()] * 80
    assert pool.stats().worker_deaths == len(victims)
    assert up(pool, 4) and pool.stats().cached_args == 0


def test_a_mapping_is_lent_again_only_if_no_task_wrote_it(make_pool):
    """A task that only reads its large argument leaves its mapping to the next (pages
    mapped already); one that writes (any page) does not: the next task still gets the
    argument as it was sent."""
    from arg_cache_tasks import read_or_write
    pool = up(make_pool(1), 1)
    array = np.arange(2 * MIB // 8, dtype=np.float64)
    writes = [False, False, False, True, False, True, True, False, False]
    results = pool.starmap(read_or_write, [(array, w) for w in writes] * 3, chunksize=1)
    assert [r[0] for r in results] == [array.sum()] * len(results)
    made, reused = results[-1][2]["made"], results[-1][2]["reused"]
    assert made + reused == len(results)
    # a task after a reading task reuses its mapping; after a writing one it cannot
    after_reads = sum(1 for i in range(1, len(results)) if not (writes * 3)[i - 1])
    assert reused >= after_reads - 2 and reused <= after_reads, (made, reused, after_reads)
