"""A time budget for a benchmark's measure, shared by the bench scripts: a measure that
runs past it raises :class:`BenchTimeout` in the main thread instead of hanging the run."""
import contextlib
import signal
import time


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
