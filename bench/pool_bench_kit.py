"""What bench_pool.py's measures share: their time limits, and a warmed-up pool that is
always shut down (its task functions live here so that the stdlib's spawn can import
them in its workers)."""
import contextlib
import time

from time_limits import deadline

WAIT_S = 120.0       # longest wait for any one result
SHUTDOWN_S = 30.0    # longest terminate() + join()


def nap(seconds):
    """Sleeps for ``seconds``."""
    time.sleep(seconds)


def shutdown(pool):
    """terminate() and join() a pool, within SHUTDOWN_S."""
    with deadline(SHUTDOWN_S, "terminate + join"):
        pool.terminate()
        pool.join()


@contextlib.contextmanager
def open_pool(lib, workers):
    """A pool of ``workers`` warmed up with one small map, always terminated on exit."""
    pool = lib.Pool(workers)
    try:
        pool.map_async(nap, [0.02] * (4 * workers), chunksize=1).get(timeout=WAIT_S)
        yield pool
    finally:
        shutdown(pool)
