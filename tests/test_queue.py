"""Queue, JoinableQueue, SimpleQueue across processes."""
import os
import queue as pyqueue
import time

import numpy as np
import pytest

import fiberrl


def _produce(q, start, count):
    for i in range(start, start + count):
        q.put(i)


def _consume(q, out, count):
    got = [q.get(timeout=60) for _ in range(count)]
    out.put(got)


def _worker(q):
    for item in iter(q.get, None):
        q.task_done()
    q.task_done()


def _die_before_ack(q):
    from fiberrl._runtime.rpc import RpcClient
    RpcClient.cast = lambda *args, **kwargs: os._exit(7)  # dies before the ack
    q.get()


@pytest.mark.any_backend
def test_each_item_goes_to_exactly_one_get():
    q, out = fiberrl.Queue(), fiberrl.Queue()
    producers = [fiberrl.Process(target=_produce, args=(q, 1000 * k, 300)) for k in range(3)]
    consumers = [fiberrl.Process(target=_consume, args=(q, out, 300)) for _ in range(3)]
    for proc in producers + consumers:
        proc.start()
    results = [out.get(timeout=120) for _ in consumers]
    for proc in producers + consumers:
        proc.join(30)
    everything = sorted(x for chunk in results for x in chunk)
    assert everything == sorted(i for k in range(3) for i in range(1000 * k, 1000 * k + 300))
    for chunk in results:  # order from one producer is kept
        for k in range(3):
            mine = [x for x in chunk if 1000 * k <= x < 1000 * (k + 1)]
            assert mine == sorted(mine)


def test_get_timeout_raises_empty_in_time():
    q = fiberrl.Queue()
    started = time.monotonic()
    with pytest.raises(pyqueue.Empty):
        q.get(timeout=0.2)
    assert 0.15 < time.monotonic() - started < 2
    with pytest.raises(pyqueue.Empty):
        q.get_nowait()
    with pytest.raises(pyqueue.Empty):   # as the stdlib's: a negative timeout waits no time
        q.get(timeout=-1)


def test_maxsize_full_and_qsize():
    q = fiberrl.Queue(maxsize=2)
    q.put(1)
    q.put(2)
    assert q.full() and q.qsize() == 2
    with pytest.raises(pyqueue.Full):
        q.put(3, timeout=0.1)
    with pytest.raises(pyqueue.Full):
        q.put_nowait(3)
    with pytest.raises(pyqueue.Full):
        q.put(3, timeout=-1)
    assert q.get() == 1 and q.qsize() == 1 and not q.full()


def test_closed_queue_raises_value_error():
    q = fiberrl.Queue()
    q.close()
    q.join_thread()
    with pytest.raises(ValueError, match="is closed"):
        q.put(1)
    with pytest.raises(ValueError, match="is closed"):
        q.get()


def test_numpy_arrays_round_trip_and_are_copied_at_put():
    q = fiberrl.Queue()
    arr = np.arange(1_000_000, dtype=np.float64)
    q.put(arr)
    arr[:] = -1  # the queued item must not change
    got = q.get(timeout=10)
    assert got[0] == 0 and got[-1] == 999_999 and got.flags.writeable


@pytest.mark.any_backend
def test_remote_consumer_gets_large_arrays():
    q, out = fiberrl.Queue(), fiberrl.Queue()
    proc = fiberrl.Process(target=_consume, args=(q, out, 2))
    proc.start()
    q.put(np.ones((512, 512)))
    q.put(b"x" * (1 << 20))
    arr, blob = out.get(timeout=60)
    proc.join(30)
    assert arr.sum() == 512 * 512 and blob == b"x" * (1 << 20)


@pytest.mark.any_backend
def test_joinable_queue_join_waits_for_task_done():
    q = fiberrl.JoinableQueue()
    workers = [fiberrl.Process(target=_worker, args=(q,)) for _ in range(2)]
    for proc in workers:
        proc.start()
    for i in range(20):
        q.put(i)
    q.join()
    for _ in workers:
        q.put(None)
    for proc in workers:
        proc.join(30)
        assert proc.exitcode == 0
    with pytest.raises(ValueError, match="too many"):
        q.task_done()


def test_simple_queue():
    q = fiberrl.SimpleQueue()
    assert q.empty()
    q.put("a")
    assert not q.empty() and q.get() == "a"


def test_simple_queue_get_nowait_takes_an_item_or_raises_empty():
    """The stdlib's SimpleQueue has no ``get_nowait``; fiberrl's inherits one from
    Queue, so it works as ``queue.SimpleQueue``'s does instead of failing on the call."""
    q = fiberrl.SimpleQueue()
    with pytest.raises(pyqueue.Empty):
        q.get_nowait()
    q.put("a")
    deadline = time.monotonic() + 10
    while True:   # a put reaches the queue's server shortly after it returns
        try:
            assert q.get_nowait() == "a"
            break
        except pyqueue.Empty:
            assert time.monotonic() < deadline
            time.sleep(0.01)


def test_simple_queue_closed_ends_as_cpython_tests_them():
    """CPython's TestSimpleQueue.test_closed reads the private ends after close()."""
    queue = fiberrl.SimpleQueue()
    assert not queue._reader.closed and not queue._writer.closed
    queue.close()
    assert queue._reader.closed
    assert queue._writer.closed


def _relay_with_fibers_ends(q_in, q_out, n):
    """Uber Fiber's test_queue ``get_queue``, which names the queue's ends."""
    assert q_in.reader is not None and q_in.writer is not None
    for _ in range(n):
        q_out.writer.send(q_in.reader.recv())


def test_simple_queue_reader_and_writer_as_fiber_names_them():
    q_in, q_out = fiberrl.SimpleQueue(), fiberrl.SimpleQueue()
    proc = fiberrl.Process(target=_relay_with_fibers_ends, args=(q_in, q_out, 3))
    proc.start()
    for i in range(3):
        q_in.writer.send(i)
    assert [q_out.get() for _ in range(3)] == [0, 1, 2]
    proc.join(60)
    assert proc.exitcode == 0
    assert q_in.reader == q_in._reader and q_in.writer == q_in._writer
    q_in.writer.close()
    assert q_in.reader.closed
    with pytest.raises(ValueError):
        q_in.put(1)


@pytest.mark.any_backend
def test_item_in_flight_to_a_consumer_that_dies_is_not_lost():
    q = fiberrl.Queue()
    proc = fiberrl.Process(target=_die_before_ack, args=(q,))
    proc.start()
    q_put_after = time.monotonic()
    q.put("precious")
    proc.join(60)
    assert proc.exitcode == 7
    assert q.get(timeout=10) == "precious"
    assert time.monotonic() - q_put_after < 15


def test_unpicklable_item_is_reported_and_dropped(caplog):
    q = fiberrl.Queue()
    q.put(lambda_free := __import__("threading").Lock())
    q.put("after")
    assert q.get(timeout=5) == "after"
    assert "cannot pickle" in caplog.text and lambda_free is not None


def _put_then_join(q, n):
    for i in range(n):
        q.put(i)
    q.join()  # must not overtake this process's own batched puts


@pytest.mark.any_backend
def test_batched_puts_are_all_delivered_before_the_job_exits():
    q = fiberrl.Queue()
    proc = fiberrl.Process(target=_produce, args=(q, 0, 5000))
    proc.start()
    proc.join(60)  # the producer is gone before anything is read
    assert proc.exitcode == 0
    assert [q.get(timeout=10) for _ in range(5000)] == list(range(5000))


def test_remote_join_waits_for_its_own_earlier_puts():
    q = fiberrl.JoinableQueue()
    proc = fiberrl.Process(target=_put_then_join, args=(q, 50))
    proc.start()
    got = [q.get(timeout=30) for _ in range(50)]
    assert proc.is_alive()  # still waiting in join()
    for _ in got:
        q.task_done()
    proc.join(30)
    assert proc.exitcode == 0 and got == list(range(50))


def _own_a_queue(out):
    q = fiberrl.Queue()
    out.put(q)
    import time
    time.sleep(60)


def test_a_queue_whose_owner_died_raises_owner_gone_not_a_hang():
    """The owner's process is gone: get() raises fiberrl.OwnerGoneError (a ProcessError
    and a ConnectionError, importable from fiberrl), at once, instead of hanging."""
    import time
    out = fiberrl.Queue()
    owner = fiberrl.Process(target=_own_a_queue, args=(out,))
    owner.start()
    q = out.get(timeout=60)
    owner.kill()
    owner.join(30)
    started = time.monotonic()
    with pytest.raises(fiberrl.OwnerGoneError) as caught:
        q.get(timeout=5)
    assert isinstance(caught.value, fiberrl.ProcessError)
    assert isinstance(caught.value, ConnectionError)
    assert time.monotonic() - started < 5


def test_simple_queue_put_raises_for_an_unpicklable_item():
    """As the stdlib's SimpleQueue (ProcessPoolExecutor relies on it to report a result
    that cannot be pickled); Queue reports and drops it from its feeder, as the stdlib."""
    import threading
    q = fiberrl.SimpleQueue()
    with pytest.raises(TypeError):
        q.put(threading.Lock())
    assert q.empty()
    q2 = fiberrl.Queue()
    q2.put(threading.Lock())   # logged and dropped
    q2.put("next")
    assert q2.get(timeout=10) == "next"
