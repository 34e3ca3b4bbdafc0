"""CPython's manager conformance tests, run against ``fiberrl.Manager()`` and
``fiberrl.managers.BaseManager``.

The ``manager`` flavour of ``test._test_multiprocessing``'s classes takes every
shared object from ``cls.manager``; here that is ``fiberrl.Manager()``, whose server
is a fiberrl job, and ``self.Process`` is ``fiberrl.Process``. The module-level
managers those tests use (``MyManager``, ``QueueManager``, ``QueueManager2``) are
replaced by fiberrl ones with the same registrations, in the test module and in
every job that imports this file. ``TestSyncManagerTypes`` runs with fiberrl's
``SyncManager`` and ``fiberrl.Process`` as ``multiprocessing.Process``.
"""
import multiprocessing
import time

import pytest

import fiberrl
import fiberrl.managers

cpython = pytest.importorskip("test._test_multiprocessing")

from test_conformance import _bind as bind_to_fiberrl  # noqa: E402

pytestmark = [pytest.mark.conformance, pytest.mark.timeout(300)]


class MyManager(fiberrl.managers.BaseManager):
    """The tests' ``MyManager``, on fiberrl."""


MyManager.register("Foo", callable=cpython.FooBar)
MyManager.register("Bar", callable=cpython.FooBar, exposed=("f", "_h"))
MyManager.register("baz", callable=cpython.baz, proxytype=cpython.IteratorProxy)


class QueueManager(fiberrl.managers.BaseManager):
    """The tests' ``QueueManager`` (the server side), on fiberrl."""


QueueManager.register("get_queue", callable=cpython.get_queue)


class QueueManager2(fiberrl.managers.BaseManager):
    """The tests' ``QueueManager2`` (the client side), on fiberrl."""


QueueManager2.register("get_queue")

cpython.MyManager = MyManager
cpython.QueueManager = QueueManager
cpython.QueueManager2 = QueueManager2


class FiberrlManagerMixin(cpython.ManagerMixin):
    """``ManagerMixin`` whose manager is ``fiberrl.Manager()`` and processes are jobs."""

    Process = fiberrl.Process
    Pipe = staticmethod(fiberrl.Pipe)
    connection = multiprocessing.connection
    current_process = staticmethod(fiberrl.current_process)
    active_children = staticmethod(fiberrl.active_children)

    @classmethod
    def setUpClass(cls):
        cpython.BaseMixin.setUpClass.__func__(cls)
        cls.manager = fiberrl.Manager()


class _ManagerPoolStarted:
    """For the class-wide pool (in the manager's job): its workers are started before
    the first test's leak check takes its snapshot."""

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            stats = cls.pool.stats()
            if stats.alive + stats.starting >= stats.target:
                break
            time.sleep(0.05)


def _bind(base, *extra_bases):
    return bind_to_fiberrl(base, *extra_bases, mixin=FiberrlManagerMixin,
                           prefix="WithFiberrlManager", module=__name__)


WithFiberrlManagerQueue = _bind(cpython._TestQueue)
WithFiberrlManagerLock = _bind(cpython._TestLock)
WithFiberrlManagerSemaphore = _bind(cpython._TestSemaphore)
WithFiberrlManagerCondition = _bind(cpython._TestCondition)
WithFiberrlManagerEvent = _bind(cpython._TestEvent)
WithFiberrlManagerBarrier = _bind(cpython._TestBarrier)
WithFiberrlManagerContainers = _bind(cpython._TestContainers)
WithFiberrlManagerPool = _bind(cpython._TestPool, _ManagerPoolStarted)
WithFiberrlManagerMyManager = _bind(cpython._TestMyManager)
WithFiberrlManagerRemoteManager = _bind(cpython._TestRemoteManager)
WithFiberrlManagerManagerRestart = _bind(cpython._TestManagerRestart)


class FiberrlSyncManagerTypes(cpython.TestSyncManagerTypes):
    """Every SyncManager type shared between the parent and a fiberrl job."""

    manager_class = fiberrl.managers.SyncManager

    def setUp(self):
        self._stdlib_process = multiprocessing.Process
        multiprocessing.Process = fiberrl.Process
        super().setUp()

    def tearDown(self):
        try:
            super().tearDown()
        finally:
            multiprocessing.Process = self._stdlib_process


def _report_server_job(queue):
    queue.put(fiberrl.current_process().name)


def test_manager_tests_really_use_fiberrl():
    """The classes above get a fiberrl manager whose server is a fiberrl job."""
    FiberrlManagerMixin.setUpClass()
    try:
        manager = FiberrlManagerMixin.manager
        assert isinstance(manager, fiberrl.managers.SyncManager)
        assert manager._process.job_id.startswith("local-")
        assert type(manager.dict()).__module__ == "fiberrl.managers"
        assert cpython.MyManager is MyManager
    finally:
        FiberrlManagerMixin.manager.shutdown()
        FiberrlManagerMixin.manager.join()
