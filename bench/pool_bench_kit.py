"""What bench_pool.py's measures share: the time limits, and a warmed-up pool that is
always shut down (its task functions live here so that the stdlib's spawn can import
them in its workers)."""
import contextlib
import signal
import time

WAIT_S = 120.0       # longest wait for any one result
SHUTDOWN_S = 30.0    # longest terminate() + join()


def nap(seconds):
    """Sleeps for ``seconds``."""
    time.sleep(seconds)


class BenchTimeout(Exception):
    """A measure ran past its time budget."""


@contextlib.contextmanager
def deadline(seconds, what):
    """Raise BenchTimeout in the main thread if the block runs over ``seconds``; nests."""
    def expire(signum, frame):
        raise BenchTimeout(f"{what} took over {seconds:.0f} s")

    outer_left, _ = signal.getitimer(signal.ITIMER_REAL)
    previous = signal.signal(signal.SIGALRM, expire)
    started = time.monotonic()
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        if outer_left:
            left = outer_left - (time.monotonic() - started)
            signal.setitimer(signal.ITIMER_REAL, max(left, 0.001))


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
