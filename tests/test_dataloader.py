"""torch's DataLoader with ``multiprocessing_context=fiberrl.get_context()``: its
workers are fiberrl jobs, and every batch equals what ``num_workers=0`` gives."""
import pytest

import fiberrl

torch = pytest.importorskip("torch")
from torch.utils.data import DataLoader, Dataset, IterableDataset, get_worker_info  # noqa: E402

pytestmark = pytest.mark.timeout(300)


class Squares(Dataset):
    """Item i: a dict of a tensor and an int (collated by the default collate)."""

    def __init__(self, n=40):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return {"x": torch.full((3,), float(i)), "y": i * i}


class Counting(IterableDataset):
    """0..n-1, split between workers by the worker info, as torch's docs show."""

    def __init__(self, n=30):
        self.n = n

    def __iter__(self):
        info = get_worker_info()
        start, step = (0, 1) if info is None else (info.id, info.num_workers)
        return iter(range(start, self.n, step))


class FailsAt(Dataset):
    def __len__(self):
        return 10

    def __getitem__(self, i):
        if i == 7:
            raise ValueError("item 7 is broken")
        return i


class Slow(Dataset):
    def __len__(self):
        return 4

    def __getitem__(self, i):
        import time
        time.sleep(8)
        return i


def _seed_worker(worker_id):
    import torch
    torch.manual_seed(1000 + worker_id)


class WorkerSeeds(Dataset):
    def __len__(self):
        return 4

    def __getitem__(self, i):
        import torch
        return torch.initial_seed(), get_worker_info().id


def _batches(loader):
    return [batch for batch in loader]


def _assert_same(left, right):
    assert len(left) == len(right)
    for a, b in zip(left, right):
        if isinstance(a, dict):
            assert a.keys() == b.keys()
            for key in a:
                assert torch.equal(a[key], b[key])
        else:
            assert torch.equal(a, b)


def _loader(dataset, **kwargs):
    return DataLoader(dataset, num_workers=2, multiprocessing_context=fiberrl.get_context(),
                      **kwargs)


def test_map_style_parity():
    expected = _batches(DataLoader(Squares(), batch_size=4))
    loader = _loader(Squares(), batch_size=4)
    _assert_same(_batches(loader), expected)


def test_workers_are_fiberrl_jobs():
    iterator = iter(_loader(Squares(), batch_size=4))
    try:
        assert all(type(w).__module__ == "fiberrl.process" and w.job_id for w in iterator._workers)
        next(iterator)
    finally:
        iterator._shutdown_workers()


def test_iterable_parity():
    expected = sorted(int(x) for batch in DataLoader(Counting(), batch_size=5) for x in batch)
    got = sorted(int(x) for batch in _loader(Counting(), batch_size=5) for x in batch)
    assert got == expected == list(range(30))


def test_persistent_workers_keep_their_jobs():
    loader = _loader(Squares(), batch_size=8, persistent_workers=True)
    expected = _batches(DataLoader(Squares(), batch_size=8))
    _assert_same(_batches(loader), expected)
    jobs = [w.job_id for w in loader._iterator._workers]
    _assert_same(_batches(loader), expected)
    assert [w.job_id for w in loader._iterator._workers] == jobs
    loader._iterator._shutdown_workers()


def test_worker_init_fn_runs_in_each_worker():
    loader = _loader(WorkerSeeds(), batch_size=None, worker_init_fn=_seed_worker)
    seen = {int(worker): int(seed) for seed, worker in loader}
    assert seen == {0: 1000, 1: 1001}


def test_worker_exception_reaches_the_caller():
    with pytest.raises(ValueError, match="item 7 is broken"):
        _batches(_loader(FailsAt(), batch_size=1))


def test_timeout():
    with pytest.raises(RuntimeError, match="timed out"):
        _batches(_loader(Slow(), batch_size=1, timeout=2))


def test_an_iterator_freed_on_the_io_thread_does_not_stall_it():
    """The collector may free an abandoned iterator (one in a reference cycle, say a
    traceback's) on fiberrl's I/O thread. Its ``__del__`` puts ``None`` for each
    worker and joins it for up to 5 s; a worker still needs that very thread to get
    its ``None``, so the joins used to stall every stream of the process 5 s per worker
    (10 s here, past a job's 10 s set-up limit). A join there now only looks, and the
    iterator terminates what is still running, as it does after its joins' timeout."""
    import threading
    import time

    from fiberrl._runtime.runtime import runtime

    loader = DataLoader(Squares(400), batch_size=4, num_workers=2,
                        multiprocessing_context=fiberrl.get_context())
    iterator = iter(loader)
    next(iterator)
    workers = list(iterator._workers)
    holder = [iterator]
    del iterator
    took = []
    done = threading.Event()

    def free_it():
        started = time.monotonic()
        holder.clear()   # the iterator's last reference: its __del__ runs here
        took.append(time.monotonic() - started)
        done.set()

    runtime().reactor.call_soon(free_it)
    assert done.wait(60)
    assert took[0] < 4.0, f"the I/O thread was held {took[0]:.1f} s"
    for worker in workers:
        worker.join(30)
        assert not worker.is_alive()
    assert [b["y"].tolist() for b in DataLoader(Squares(8), batch_size=4, num_workers=2,
            multiprocessing_context=fiberrl.get_context())] == [[0, 1, 4, 9], [16, 25, 36, 49]]
