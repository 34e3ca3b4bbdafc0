"""CPython's own multiprocessing conformance tests, run against fiberrl's objects.

``test._test_multiprocessing`` binds each test class to a "mixin" that names the
objects under test (``self.Process``, ``self.Queue``, ``self.Pipe``...). Here the
mixin names fiberrl's, so every ``self.Process(...)`` in those tests starts a job
through fiberrl's backend. ``test_mixin_really_uses_fiberrl`` proves it.

Locks, events, barriers and values are fiberrl's coordination-service objects
(``fiberrl.Lock()``...). The manager flavour, and every other class of the suite, run
with ``multiprocessing`` mapped to fiberrl in ``test_cpython_suite.py``. Tests that
cannot apply to job-backed processes are skipped with the reason (``UNSUPPORTED``).
"""
import multiprocessing
import os
import unittest

import pytest

import fiberrl
import fiberrl.pool

cpython = pytest.importorskip("test._test_multiprocessing")

# jobs start as fresh interpreters: test_many_processes starts 200 of them on 2 cores
pytestmark = [pytest.mark.conformance, pytest.mark.timeout(300)]


class FiberrlMixin(cpython.BaseMixin):
    TYPE = "processes"
    Process = fiberrl.Process
    connection = multiprocessing.connection
    current_process = staticmethod(fiberrl.current_process)
    parent_process = staticmethod(fiberrl.parent_process)
    active_children = staticmethod(fiberrl.active_children)
    set_executable = staticmethod(fiberrl.set_executable)
    Pipe = staticmethod(fiberrl.Pipe)
    Queue = staticmethod(fiberrl.Queue)
    JoinableQueue = staticmethod(fiberrl.JoinableQueue)
    Pool = staticmethod(fiberrl.Pool)
    Lock = staticmethod(fiberrl.Lock)
    RLock = staticmethod(fiberrl.RLock)
    Semaphore = staticmethod(fiberrl.Semaphore)
    BoundedSemaphore = staticmethod(fiberrl.BoundedSemaphore)
    Condition = staticmethod(fiberrl.Condition)
    Event = staticmethod(fiberrl.Event)
    Barrier = staticmethod(fiberrl.Barrier)
    Value = staticmethod(fiberrl.Value)
    Array = staticmethod(fiberrl.Array)
    RawValue = staticmethod(fiberrl.RawValue)
    RawArray = staticmethod(fiberrl.RawArray)

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        multiprocessing.util.get_temp_dir()


# Tests of things that cannot exist for job-backed processes, with the reason.
UNSUPPORTED = {
    "test_fd_transfer": "file descriptors cannot travel between jobs on different machines",
    "test_large_fd_transfer": "file descriptors cannot travel between jobs on different machines",
    "test_missing_fd_transfer": "file descriptors cannot travel between jobs on different machines",
    "test_thousand": "it needs sends from different processes to one pipe end to arrive in "
                     "the order they were made, which a kernel pipe gives and jobs on "
                     "different machines cannot: each sender's messages keep their order",
}


def _skipped(reason):
    @unittest.skip(reason)
    def test(self):
        pass
    return test


class CountingList:
    """Stands in for the tests' ``_DummyList`` (a counter in shared memory, which jobs
    on other machines cannot map): the same ``append``/``len`` over a fiberrl.Value."""

    def __init__(self):
        self._length = fiberrl.Value("i", 0)

    def append(self, _item):
        with self._length.get_lock():
            self._length.value += 1

    def __len__(self):
        return self._length.value


class _ConditionInvariant:
    """``check_invariant`` reads ``multiprocessing.Condition``'s private semaphores; the
    same invariant (nobody is left waiting) is checked on fiberrl's condition, which
    lives in this process's coordination service."""

    def check_invariant(self, cond):
        from fiberrl.managers import local_referent
        self.assertEqual(len(local_referent(cond)._waiters), 0)


class _CountingDummyList:
    def DummyList(self):
        return CountingList()


class _StdlibPoolIsFiberrl:
    """For test classes that call ``multiprocessing.Pool(...)`` directly rather than
    ``self.Pool``: while the class runs, that name is fiberrl's pool."""

    @classmethod
    def setUpClass(cls):
        cls._stdlib_pool = multiprocessing.Pool
        multiprocessing.Pool = fiberrl.Pool
        super().setUpClass()

    @classmethod
    def tearDownClass(cls):
        super().tearDownClass()
        multiprocessing.Pool = cls._stdlib_pool


class _ClassPoolStarted:
    """For test classes that share one pool: its workers are started before the
    first test's leak check takes its snapshot."""

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.pool._pool  # waits until the supervisor has started the workers


def _bind(base, *extra_bases, mixin=None, prefix="WithFiberrl", module=__name__):
    """A TestCase running ``base``'s tests with ``mixin``'s objects (fiberrl's by
    default); the name must match the module global it is assigned to, so that jobs
    can import the class by name."""
    name = prefix + base.__name__[len("_Test"):]
    overrides = {attr: _skipped(reason) for attr, reason in UNSUPPORTED.items()
                 if hasattr(base, attr)}
    cls = type(name, (*extra_bases, base, mixin or FiberrlMixin, unittest.TestCase),
               {"__module__": module, **overrides})
    cls.__qualname__ = name
    return cls


WithFiberrlProcess = _bind(cpython._TestProcess)
WithFiberrlSubclassingProcess = _bind(cpython._TestSubclassingProcess)
WithFiberrlQueue = _bind(cpython._TestQueue)
WithFiberrlConnection = _bind(cpython._TestConnection)
WithFiberrlPoll = _bind(cpython._TestPoll)
WithFiberrlPool = _bind(cpython._TestPool, _ClassPoolStarted)
WithFiberrlPoolWorkerErrors = _bind(cpython._TestPoolWorkerErrors, _StdlibPoolIsFiberrl)
WithFiberrlPoolWorkerLifetime = _bind(cpython._TestPoolWorkerLifetime, _StdlibPoolIsFiberrl)
WithFiberrlLock = _bind(cpython._TestLock)
WithFiberrlSemaphore = _bind(cpython._TestSemaphore)
WithFiberrlCondition = _bind(cpython._TestCondition, _ConditionInvariant)
WithFiberrlEvent = _bind(cpython._TestEvent)
WithFiberrlBarrier = _bind(cpython._TestBarrier, _CountingDummyList)
WithFiberrlValue = _bind(cpython._TestValue)
WithFiberrlArray = _bind(cpython._TestArray)


def _report_job_name(queue):
    queue.put((os.environ.get("FIBERRL_JOB_NAME"), os.getpid()))


def test_mixin_really_uses_fiberrl():
    """The conformance tests above start fiberrl jobs, not stdlib processes."""
    assert FiberrlMixin.Process is fiberrl.Process
    assert not issubclass(fiberrl.Process, multiprocessing.Process)
    queue = FiberrlMixin.Queue()
    assert type(queue).__module__ == "fiberrl.queues"
    first, second = FiberrlMixin.Pipe()
    assert type(first).__module__ == "fiberrl.connection"
    proc = FiberrlMixin.Process(target=_report_job_name, args=(queue,), name="proof")
    proc.start()
    job_name, pid = queue.get(timeout=60)
    proc.join(10)
    assert job_name == "proof" and pid == proc.pid
    assert proc.job_id.startswith("local-")


def _pool_worker_job():
    return os.environ.get("FIBERRL_JOB_NAME")


def test_pool_tests_really_use_fiberrl():
    """The Pool conformance classes get fiberrl's pool, whose workers are fiberrl jobs."""
    assert FiberrlMixin.Pool == fiberrl.Pool
    for cls in (WithFiberrlPoolWorkerErrors, WithFiberrlPoolWorkerLifetime):
        cls.setUpClass()
        try:
            assert multiprocessing.Pool == fiberrl.Pool
        finally:
            cls.tearDownClass()
    assert multiprocessing.Pool != fiberrl.Pool
    with FiberrlMixin.Pool(1) as pool:
        assert type(pool).__module__ == "fiberrl.pool.pool"
        job_name = pool.apply(_pool_worker_job)
        assert job_name.startswith("Pool-") and "-worker-" in job_name
        assert all(worker.job_id.startswith("local-") for worker in pool.workers())
    pool.join()
