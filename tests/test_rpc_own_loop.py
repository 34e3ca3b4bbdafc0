"""Calls that fiberrl's I/O thread makes to its own process's services (from a
finalizer the garbage collector ran there, or a callback): answered in-process,
because over a stream the loop would wait for itself to accept the connection."""
import threading
import time

import fiberrl
from fiberrl._runtime.rpc import client_for
from fiberrl._runtime.runtime import runtime


def _on_the_loop(fn, timeout=60):
    """``fn()``'s (result, exception, seconds) when run on this process's I/O thread."""
    outcome = {}
    done = threading.Event()

    def run():
        started = time.monotonic()
        try:
            outcome["result"] = fn()
        except BaseException as exc:   # reported to the test
            outcome["error"] = exc
        outcome["took"] = time.monotonic() - started
        done.set()

    runtime().reactor.call_soon(run)
    assert done.wait(timeout)
    return outcome.get("result"), outcome.get("error"), outcome["took"]


def test_a_pipe_end_first_used_on_the_io_thread_reaches_its_registry_here():
    """Its first use registers the end with the pipe's registry, this process: the
    call used to wait 10 s for a stream the loop itself had to accept, then raised
    OwnerGoneError, with every stream of the process held meanwhile."""
    a, b = fiberrl.Pipe()
    _, error, took = _on_the_loop(lambda: a.send("sent from the loop"))
    assert error is None and took < 4.0, (error, took)
    assert b.poll(30) and b.recv() == "sent from the loop"
    a.close()
    b.close()


def test_a_call_to_a_service_that_would_answer_later_raises_instead_of_waiting():
    q = fiberrl.JoinableQueue()
    q.put("unfinished")
    client = client_for(runtime().address)
    _, error, took = _on_the_loop(lambda: client.call("queue", "join", q._qid))
    assert isinstance(error, RuntimeError) and "cannot wait" in str(error), error
    assert took < 4.0
    (size, _), _ = client.call("queue", "size", q._qid, timeout=30)   # the service still serves
    assert size == 1
    q.get()
    q.task_done()
