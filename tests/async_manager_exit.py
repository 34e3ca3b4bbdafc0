"""A program with asynchronous managers that exits in one of several ways; run by
tests/test_async_manager.py, which checks that it prints nothing on stderr.

    python async_manager_exit.py ORDER

ORDER says what is dropped, and in which order, before the program exits:

- ``fiber``: Uber Fiber's own test (4 managers, a slow call on each at once, ``.get()``
  on every handle); nothing is dropped, the exit hooks do it all;
- ``managers_first``: every manager is shut down, then the proxies and handles dropped;
- ``proxies_first``: the proxies are dropped, then the handles, then the managers shut down;
- ``handles_kept``: the proxies are dropped, the handles live until the exit;
- ``in_flight``: a call is still running in its server when the program exits;
- ``shutdown_in_flight``: a manager is shut down while a call on it runs; its handle
  raises ``ManagerConnectionError``.
"""
import gc
import sys
import time

import fiberrl
from fiberrl.managers import AsyncManager


class Calculator:
    def add(self, a, b):
        return a + b

    def add_with_delay(self, a, b, delay=1.0):
        time.sleep(delay)
        return a + b


class MyManager(AsyncManager):
    pass


MyManager.register("Calculator", Calculator)
KEPT = []


def main(order):
    managers = [MyManager() for _ in range(4)]
    for manager in managers:
        manager.start()
    calculators = [manager.Calculator() for manager in managers]
    assert calculators[0].add(10, 32).get() == 42
    started = time.monotonic()
    handles = [calc.add_with_delay(10, 32, delay=0.3) for calc in calculators]
    assert [handle.get(timeout=60) for handle in handles] == [42] * 4
    assert time.monotonic() - started < 1.2   # the four calls ran at the same time
    if order == "fiber":
        pass
    elif order == "managers_first":
        for manager in managers:
            manager.shutdown()
        del calculators, handles
        gc.collect()
    elif order == "proxies_first":
        del calculators
        gc.collect()
        del handles
        for manager in managers:
            manager.shutdown()
    elif order == "handles_kept":
        KEPT.extend(handles)
        del calculators
        gc.collect()
    elif order == "in_flight":
        KEPT.append(calculators[0].add_with_delay(1, 2, delay=30))
    elif order == "shutdown_in_flight":
        handle = calculators[1].add_with_delay(1, 2, delay=30)
        managers[1].shutdown()
        try:
            handle.get(timeout=60)
        except fiberrl.ManagerConnectionError:
            pass
        else:
            raise AssertionError("the call outlived its manager")
    else:
        raise SystemExit(f"unknown order {order!r}")
    print("ok", flush=True)


if __name__ == "__main__":
    import faulthandler
    faulthandler.dump_traceback_later(100)   # every thread's stack before the test's 120 s
    main(sys.argv[1])
