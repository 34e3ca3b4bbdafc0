"""The stdlib's own classes on a fiberrl context: the context type check, ``_semlock``
answers, and ``multiprocessing.queues.Queue``/``SimpleQueue`` built with ``ctx=``."""
import multiprocessing.context
import multiprocessing.queues

import pytest

import fiberrl


def test_context_is_a_stdlib_context():
    ctx = fiberrl.get_context()
    assert isinstance(ctx, multiprocessing.context.BaseContext)
    assert isinstance(fiberrl.get_context("spawn"), multiprocessing.context.BaseContext)
    assert issubclass(ctx.Process, fiberrl.Process)  # SpawnProcess, as the stdlib's
    assert fiberrl.reducer is ctx.reducer
    assert fiberrl.reducer.__name__ == "fiberrl.reduction"


def test_every_stdlib_top_level_name_exists():
    missing = [name for name in multiprocessing.__all__ if not hasattr(fiberrl, name)]
    assert missing == []


def test_stdlib_top_level_signatures_match():
    """The stdlib's parameters, in order; fiberrl may add keyword-only extras (Pool's
    resource hints) after them."""
    import inspect
    different = []
    for name in multiprocessing.__all__:
        ours, theirs = getattr(fiberrl, name), getattr(multiprocessing, name)
        if name in ("Process", "reducer") or isinstance(theirs, type):
            continue  # classes are checked by the conformance suite; reducer is a module
        ours_params = list(inspect.signature(ours).parameters.values())
        theirs_names = [p.name for p in inspect.signature(theirs).parameters.values()]
        extras = ours_params[len(theirs_names):]
        if ([p.name for p in ours_params[:len(theirs_names)]] != theirs_names
                or any(p.kind not in (p.KEYWORD_ONLY, p.VAR_KEYWORD) for p in extras)):
            different.append(name)
    assert different == []


def _hold_semaphore(sem, held, release):
    sem.acquire()
    held.set()
    release.wait(30)
    sem.release()


@pytest.mark.parametrize("factory,value", [("BoundedSemaphore", 2), ("Semaphore", 3),
                                           ("Lock", 1), ("RLock", 1)])
def test_semlock_answers(factory, value):
    ctx = fiberrl.get_context()
    obj = getattr(ctx, factory)(value) if "Semaphore" in factory else getattr(ctx, factory)()
    semlock = obj._semlock
    assert (semlock._get_value(), semlock._is_zero(), semlock._count()) == (value, False, 0)
    for taken in range(1, value + 1):
        assert obj.acquire(timeout=5)
        assert semlock._get_value() == value - taken
        assert semlock._count() == taken
    assert semlock._is_zero() and semlock._is_mine()
    for _ in range(value):
        obj.release()
    assert semlock._get_value() == value and not semlock._is_mine()


def test_semlock_answers_reflect_another_process():
    ctx = fiberrl.get_context()
    sem, held, release = ctx.BoundedSemaphore(1), ctx.Event(), ctx.Event()
    proc = ctx.Process(target=_hold_semaphore, args=(sem, held, release))
    proc.start()
    try:
        assert held.wait(60)
        assert sem._semlock._is_zero()
        assert not sem._semlock._is_mine()  # the child holds it, not this process
        release.set()
        proc.join(30)
        assert proc.exitcode == 0
        assert sem._semlock._get_value() == 1
    finally:
        release.set()
        proc.join(10)


def test_bounded_semaphore_maxvalue():
    ctx = fiberrl.get_context()
    assert ctx.BoundedSemaphore(4)._semlock.maxvalue == 4
    assert ctx.Lock()._semlock.maxvalue == 1


def test_stdlib_queue_on_fiberrl_context_in_one_process():
    """Construction and put/get in one process; between processes the stdlib's queue
    also needs ``connection.wait`` and connection pickling (the new wire)."""
    ctx = fiberrl.get_context()
    queue = multiprocessing.queues.Queue(2, ctx=ctx)
    try:
        assert queue.empty() and not queue.full() and queue.qsize() == 0
        queue.put("a")
        queue.put("b")
        assert queue.full() and queue.qsize() == 2
        with pytest.raises(Exception) as info:
            queue.put("c", timeout=0.2)
        assert type(info.value).__name__ == "Full"
        assert queue.get(timeout=10) == "a"
        assert queue.qsize() == 1 and not queue.full()
        assert queue.get(timeout=10) == "b"
    finally:
        queue.close()
        queue.join_thread()


def test_stdlib_simple_queue_on_fiberrl_context_in_one_process():
    ctx = fiberrl.get_context()
    queue = multiprocessing.queues.SimpleQueue(ctx=ctx)
    assert queue.empty()
    queue.put({"x": 1})
    assert not queue.empty()
    assert queue.get() == {"x": 1}
    assert type(queue._rlock).__module__ == "fiberrl._sync.semlock"
    queue.close()
