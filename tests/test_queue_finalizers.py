"""A queue put from a finalizer that the garbage collector runs inside one of the
queue's own critical sections (torch's ``DataLoader`` iterator puts ``None`` on its
index queues from ``__del__``). The collector runs finalizers on whichever thread
allocates, so the put can come from the thread that already holds the queue's lock:
the I/O thread serving a worker's ``get``, or a thread inside the owner's ``get``.

Each scenario runs in its own interpreter: before the fix the thread deadlocked on
its own lock, which took every later test of the process with it (CI, stop 47).
"""
import subprocess
import sys
import textwrap

import pytest

SCENARIO = textwrap.dedent('''
    import gc, sys
    import fiberrl
    from fiberrl._services import queue_broker

    class PutsWhenCollected:
        """Garbage in a reference cycle: only the cyclic collector frees it."""
        def __init__(self, q):
            self.q, self.cycle = q, self

        def __del__(self):
            self.q.put("from a finalizer")

    def take_three(q, out):
        out.put([q.get(timeout=30) for _ in range(3)])

    def collect_then(original):
        def wrapped(*args, **kwargs):
            gc.collect()   # a collection inside the critical section, as an allocation there may start
            return original(*args, **kwargs)
        return wrapped

    if __name__ == "__main__":
        where = sys.argv[1]
        q, out = fiberrl.Queue(), fiberrl.Queue()
        q.put("a"); q.put("b")
        gc.disable()   # the cycle stays until the patched section collects it
        PutsWhenCollected(q)
        if where == "io-thread":    # serving a worker's get
            queue_broker.Broker._reply_item = collect_then(queue_broker.Broker._reply_item)
            proc = fiberrl.Process(target=take_three, args=(q, out))
            proc.start()
            got = out.get(timeout=30)
            proc.join(30)
        else:                       # inside this thread's own get
            queue_broker.Broker.take = collect_then(queue_broker.Broker.take)
            got = [q.get(timeout=30) for _ in range(3)]
        print(got)
''')


@pytest.mark.parametrize("where", ["io-thread", "own-get"])
def test_a_put_from_a_finalizer_inside_the_queues_own_lock_is_delivered(tmp_path, where):
    script = tmp_path / "scenario.py"
    script.write_text(SCENARIO)
    try:
        done = subprocess.run([sys.executable, str(script), where], capture_output=True,
                              text=True, timeout=90, cwd=tmp_path)
    except subprocess.TimeoutExpired:
        pytest.fail("the put deadlocked on the lock its own thread held")
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().splitlines()[-1] == "['a', 'b', 'from a finalizer']"
