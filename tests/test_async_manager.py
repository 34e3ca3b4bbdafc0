"""Asynchronous managers (``fiberrl.managers.AsyncManager``, Uber Fiber's name): each
call returns a handle that is a ``concurrent.futures.Future`` and has
``multiprocessing``'s ``AsyncResult`` API; a program using them exits with nothing on
stderr, whatever it drops first (``tests/async_manager_exit.py``, in subprocesses)."""
import concurrent.futures
import gc
import multiprocessing
import os
import queue
import subprocess
import sys
import time
import weakref

import pytest

import fiberrl
import pool_helpers
from fiberrl.managers import AsyncManager, AsyncProxyResult, BaseManager, dispatch, open_connection
from fiberrl._sync.connections import GOODBYE

HERE = os.path.dirname(os.path.abspath(__file__))
pytestmark = pytest.mark.timeout(300)


class Calculator:
    def add(self, a, b):
        return a + b

    def slow_add(self, a, b, delay):
        time.sleep(delay)
        return a + b

    def fail(self):
        raise KeyError("no such key")


class CalculatorManager(AsyncManager):
    pass


CalculatorManager.register("Calculator", Calculator)


class PlainManager(BaseManager):
    pass


PlainManager.register("Calculator", Calculator)


def test_the_handle_is_a_future_and_an_async_result():
    with CalculatorManager() as manager:
        calc = manager.Calculator()
        handle = calc.add(10, 32)
        assert isinstance(handle, AsyncProxyResult)
        assert isinstance(handle, concurrent.futures.Future)
        assert handle.get() == 42 and handle.get(timeout=5) == 42
        assert handle.ready() and handle.successful() and handle.result() == 42
        handle.wait()

        slow = calc.slow_add(1, 2, 1.5)
        assert not slow.ready()
        with pytest.raises(ValueError, match="not ready"):
            slow.successful()
        started = time.monotonic()
        slow.wait(0.2)
        assert 0.15 < time.monotonic() - started < 1.0 and not slow.ready()
        with pytest.raises(multiprocessing.TimeoutError, match="no reply within 0.1 s"):
            slow.get(timeout=0.1)
        assert slow.get(timeout=30) == 3 and slow.successful()

        failed = calc.fail()
        with pytest.raises(KeyError, match="no such key"):
            failed.get(timeout=30)
        assert failed.ready() and not failed.successful()
        assert not failed.cancel()   # a sent call cannot be taken back


def test_fibers_async_manager_basic_body():
    """Uber Fiber's ``test_async_manager_basic`` (its 1 s delay made 0.5 s)."""
    manager = CalculatorManager()
    manager.start()
    calc = manager.Calculator()
    res = calc.add(10, 32)
    assert res.get() == 42
    total = 4
    managers = [CalculatorManager() for i in range(total)]
    [m.start() for m in managers]
    calculators = [m.Calculator() for m in managers]
    start_ts = time.time()
    handles = [c.slow_add(10, 32, 0.5) for c in calculators]
    results = [handle.get() for handle in handles]
    duration = time.time() - start_ts
    assert duration < 1.0
    assert results == [42 for i in range(total)]
    for m in [manager, *managers]:
        m.shutdown()


def _use_and_drop_a_manager():
    manager = CalculatorManager()
    manager.start()
    calc = manager.Calculator()
    assert calc.add(1, 2).get(timeout=60) == 3
    return weakref.ref(manager), manager._process


def test_a_dropped_manager_and_its_async_proxies_are_collected_and_its_server_stops():
    """Fiber's tests drop their managers without shutting them down, and check that no
    child is left. The reply thread's loop kept the last channel it served, so that
    channel's proxy and manager (and the manager's server job) lived on."""
    manager, server = _use_and_drop_a_manager()
    assert pool_helpers.wait_until(lambda: gc.collect() >= 0 and manager() is None, 10)
    server.join(30)
    assert server.exitcode is not None and fiberrl.active_children() == []


def test_a_served_connection_that_says_goodbye_gets_no_reply():
    """The server answered a client's goodbye with a stray ``('#RETURN', None)`` (its
    thread's end was taken for accept_connection's return): an async channel read it
    as a reply with no call in flight (``IndexError: pop from an empty deque``)."""
    with PlainManager() as manager:
        conn = open_connection(manager.address, manager._authkey)
        try:
            dispatch(conn, None, "accept_connection", ("goodbye-test",))
            conn.send(GOODBYE)
            with pytest.raises(fiberrl.ManagerConnectionError):
                print("got a reply to a goodbye:", conn.recv())
        finally:
            conn.close()


def _run_program(order):
    try:
        done = subprocess.run([sys.executable, os.path.join(HERE, "async_manager_exit.py"),
                               order], capture_output=True, text=True, timeout=120, cwd=HERE)
    except subprocess.TimeoutExpired as exc:   # all it wrote, with its stacks (see the program)
        pytest.fail(f"the program ({order}) did not end within 120 s; its stderr:\n"
                    f"{(exc.stderr or b'').decode(errors='replace')}")
    return done.returncode, done.stdout, done.stderr


def test_fibers_program_exits_with_nothing_on_stderr_in_20_runs():
    """Four managers, a call on each, ``.get()`` on every handle, then exit: 20 runs."""
    for run in range(20):
        code, out, err = _run_program("fiber")
        assert (code, out.strip(), err) == (0, "ok", ""), f"run {run}"


@pytest.mark.parametrize("order", ["managers_first", "proxies_first", "handles_kept",
                                   "in_flight", "shutdown_in_flight"])
def test_any_drop_order_exits_with_nothing_on_stderr(order):
    for run in range(3):
        code, out, err = _run_program(order)
        assert (code, out.strip(), err) == (0, "ok", ""), f"run {run}"


class ListManager(AsyncManager):
    pass


ListManager.register("List", list, fiberrl.managers.ListProxy)
ListManager.register("Queue", queue.Queue)


def test_a_blocking_call_is_not_held_up_by_an_asynchronous_one_that_waits():
    """``.sync`` has its own connection: a ``put`` through it reaches the queue while an
    asynchronous ``get`` on the same proxy waits for an item (docs/managers.md)."""
    with ListManager() as manager:
        items = manager.Queue()
        waiting = items.get()
        assert not waiting.ready()
        items.sync.put("item")
        assert waiting.get(timeout=30) == "item"


def test_exposed_dunders_and_subscripts_are_forwarded_as_fibers_async_proxies_were(caplog):
    # Fiber's async proxy types defined a method for every exposed name, dunders too
    with ListManager() as manager:
        items = manager.List([10, 20, 30])
        assert items[1].get(timeout=30) == 20
        assert items.__len__().get(timeout=30) == 3
        assert items.__contains__(30).get(timeout=30) is True
        items[0] = 11                       # calls on one proxy run in order
        del items[2]
        assert items[:].get(timeout=30) == [11, 20]
        with pytest.raises(IndexError):
            items[7].get(timeout=30)
        items[9] = 1                        # no handle to raise from: logged
        assert items.append(5).get(timeout=30) is None
        assert "assignment or deletion failed" in caplog.text
        with pytest.raises(AttributeError, match="exposes no method '__iter__'"):
            items.__iter__
        with pytest.raises(TypeError):
            len(items)                      # never a wrong int from a handle
    with CalculatorManager() as manager:
        calc = manager.Calculator()
        with pytest.raises(TypeError, match="does not expose __getitem__"):
            calc[0]
