"""The I/O loop (fiberrl._runtime.reactor): callbacks queued from other threads run."""
import os
import threading

from fiberrl._runtime.reactor import Reactor


def test_a_call_queued_while_the_loop_drains_its_wake_pipe_is_not_left_asleep(monkeypatch):
    """A call_soon() that lands while the loop is draining its wake-up pipe must not
    leave the "already woken" flag set with the pipe empty: every later call_soon()
    would then skip the wake-up and wait, with no other I/O, forever (this hung a
    master's exit on a job end reported through call_soon)."""
    reactor = Reactor(name="test-reactor")
    try:
        real_read, landed = os.read, threading.Event()

        def read(fd, n):
            if fd == reactor._wake_r and not landed.is_set():
                landed.set()   # as if another thread queued a call at this very moment
                reactor.call_soon(lambda: None)
            return real_read(fd, n)

        monkeypatch.setattr(os, "read", read)
        first = threading.Event()
        reactor.call_soon(first.set)
        assert first.wait(5) and landed.is_set()
        later = threading.Event()
        reactor.call_soon(later.set)
        assert later.wait(5), "a call queued after the race never ran"
    finally:
        reactor.stop()
        reactor.thread.join(5)
