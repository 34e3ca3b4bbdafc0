"""Task functions and helpers shared by test_pool.py and test_pool_crash.py.

Pool workers import this module by name (the tests directory is on their
``sys.path``), so module-level functions travel by reference and a worker does not
have to import pytest or the test modules. Keep the imports here light.
"""
import contextlib
import ctypes
import os
import socket
import signal
import threading
import time
import uuid
import weakref

#: Set by the initializers below in a worker; read back by ``read_state``.
STATE = None

#: ``Tracked`` objects rebuilt in this process (weakly held, see ``Tracked``).
LIVE = weakref.WeakSet()


class Boom(Exception):
    """The ordinary exception a task raises on purpose."""


class RefusesPickling(Exception):
    """Raised by ``RefusesToPickle.__reduce__`` in the caller."""


# -- waiting without fixed sleeps ------------------------------------------------------
def wait_until(predicate, timeout, interval=0.05):
    """Poll ``predicate`` until it is true (return True) or ``timeout`` passed (False)."""
    deadline = time.monotonic() + timeout
    while True:
        if predicate():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(interval)


@contextlib.contextmanager
def pool_with_workers_up(size):
    """A ``fiberrl.Pool(size)`` with every worker up, terminated when the block ends."""
    import fiberrl
    pool = fiberrl.Pool(size)
    try:
        assert wait_until(lambda: pool.stats().alive == size, 120), pool.stats()
        yield pool
    finally:
        pool.terminate()
        pool.join()


def wait_for_path(path, timeout=60.0):
    """Block until ``path`` exists; raise ``TimeoutError`` after ``timeout`` seconds."""
    if not wait_until(lambda: os.path.exists(path), timeout, 0.02):
        raise TimeoutError(f"{path} did not appear within {timeout} s")


def touch(path):
    with open(path, "a"):
        pass


def first_time(path):
    """True for exactly one caller across all processes: the one that created ``path``."""
    try:
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        return False
    os.write(fd, str(os.getpid()).encode())
    os.close(fd)
    return True


def count_attempt(attempt_dir):
    """Record one attempt of a task as a new file in ``attempt_dir``."""
    touch(os.path.join(attempt_dir, f"attempt-{os.getpid()}-{uuid.uuid4().hex}"))


def process_gone(pid):
    """The process ``pid`` has exited (a zombie waiting to be reaped counts as gone)."""
    import psutil
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def live_worker_pids(pool):
    return {w.pid for w in pool.workers() if w.pid is not None and w.is_alive()}


def live_workers(pool):
    """``"host:pid"`` of the pool's live workers (pids alone repeat across containers)."""
    live = set()
    for worker in pool.workers():
        try:
            if worker.pid is not None and worker.is_alive():
                live.add(f"{worker._popen.job.host}:{worker.pid}")
        except ValueError:  # closed by the supervisor since the list was taken: not live
            continue
    return live


def worker_name(_=None):
    """``"host:pid"`` of the worker running this."""
    return f"{socket.gethostname()}:{os.getpid()}"


def sleep_then_worker_name(seconds):
    time.sleep(seconds)
    return worker_name()


# -- plain tasks ------------------------------------------------------------------------
def square(x):
    return x * x


def type_and_value(x):
    """``(type name, x)``: what a map's function received."""
    return type(x).__name__, x


def identity(x):
    return x


def add(a, b):
    return a + b


def power(base, exp=2, offset=0):
    return base ** exp + offset


def pid_of(_=None):
    return os.getpid()


def square_with_pid(x):
    return x * x, os.getpid()


def square_with_worker_name(x):
    """``(x * x, "host:pid")``: which worker ran it, unique across containers and nodes."""
    return x * x, f"{socket.gethostname()}:{os.getpid()}"


def sleep_then_pid(seconds):
    time.sleep(seconds)
    return os.getpid()


def sleep_then_square_pid(x, seconds):
    time.sleep(seconds)
    return x * x, os.getpid()


def sleep_then_return(pair):
    seconds, value = pair
    time.sleep(seconds)
    return value


def sleep_touch_return(seconds, path, value):
    time.sleep(seconds)
    touch(path)
    return value


def mark_then_wait(started_dir, release_path, value):
    """Say "started" with a file, then block until ``release_path`` exists."""
    touch(os.path.join(started_dir, f"started-{value}"))
    wait_for_path(release_path, 120)
    return value


def mark_then_sleep(started_dir, value, seconds):
    touch(os.path.join(started_dir, f"started-{value}"))
    time.sleep(seconds)
    return value


def fail_on(x, bad=None):
    """Raise ``Boom`` for ``x == bad`` (for every ``x`` when ``bad`` is None)."""
    if bad is None or x == bad:
        raise Boom(f"bad value {x}")
    return x * x


def count_attempt_then_fail(attempt_dir):
    count_attempt(attempt_dir)
    raise Boom("fails every time")


# -- tasks that raise, for pools with error_handling ------------------------------------
def random_error_worker(i):
    """Uber Fiber's test task: raises ValueError in 5% of calls, else returns ``i``."""
    import random
    random.seed(time.time())
    time.sleep(0.01)
    if random.random() < 0.05:
        raise ValueError
    return i


def runs_of(attempt_dir, x):
    """How many runs of item ``x`` ``raise_first_runs`` recorded in ``attempt_dir``."""
    return sum(1 for name in os.listdir(attempt_dir) if name.startswith(f"item-{x}-"))


def raise_first_runs(attempt_dir, failing, x):
    """Record a run of item ``x``; raise ``ValueError`` on its first ``failing[x]`` runs
    (``failing``: item -> runs; -1 for every run), else return ``x * x``."""
    touch(os.path.join(attempt_dir, f"item-{x}-{uuid.uuid4().hex}"))
    runs = failing.get(x, 0)
    if runs < 0 or runs_of(attempt_dir, x) <= runs:
        raise ValueError(f"item {x} raised on run {runs_of(attempt_dir, x)}")
    return x * x


def die_then_raise(attempt_dir, x):
    """First run: SIGKILL the worker; second run: raise ValueError; then ``x * x``."""
    touch(os.path.join(attempt_dir, f"item-{x}-{uuid.uuid4().hex}"))
    runs = runs_of(attempt_dir, x)
    if runs == 1:
        die("sigkill")
    if runs == 2:
        raise ValueError(f"item {x} raised on run 2")
    return x * x


# -- initializers -------------------------------------------------------------------------
def set_state(value):
    global STATE
    STATE = value


def read_state(_=None):
    return STATE


def first_worker_only(lock_path, release_path):
    """Initializer: the first worker proceeds, every other one blocks until released."""
    if not first_time(lock_path):
        wait_for_path(release_path, 120)


# -- results that are tracked in the caller ---------------------------------------------
def _rebuild_tracked(payload):
    obj = Tracked(payload)
    LIVE.add(obj)
    return obj


class Tracked:
    """A result that registers itself (weakly) in ``LIVE`` when it is unpickled."""

    def __init__(self, payload):
        self.payload = payload

    def __reduce__(self):
        return _rebuild_tracked, (self.payload,)


def make_tracked(size):
    return Tracked(b"x" * size)


def make_bytes(size):
    return os.urandom(16) + bytes(size - 16)


# -- pickling trouble -----------------------------------------------------------------------
def _rebuild_poison(parent_pid):
    if os.getpid() != parent_pid:
        raise RuntimeError("a Poison argument cannot be rebuilt outside the caller")
    return Poison(parent_pid)


class Poison:
    """Pickles fine in the caller; unpickling it anywhere else raises."""

    def __init__(self, parent_pid):
        self.parent_pid = parent_pid

    def __reduce__(self):
        return _rebuild_poison, (self.parent_pid,)


class RefusesToPickle:
    def __reduce__(self):
        raise RefusesPickling("this object refuses to be pickled")


def return_unpicklable(_=None):
    """A result that neither pickle nor cloudpickle can serialize."""
    return {"function": lambda: 1, "lock": threading.Lock()}


# -- ways for a worker to die -------------------------------------------------------------------
def die(how):
    if how == "sigkill":
        os.kill(os.getpid(), signal.SIGKILL)
    elif how == "exit":
        os._exit(3)
    elif how == "segfault":
        ctypes.string_at(0)
    time.sleep(30)
    raise AssertionError(f"the worker survived {how!r}")


def die_first_time(how, marker_dir, bad, x):
    """Kill the worker on the first attempt of item ``bad``; otherwise return x*x."""
    if x == bad and first_time(os.path.join(marker_dir, f"died-{x}")):
        die(how)
    return x * x


def always_die(how, attempt_dir):
    count_attempt(attempt_dir)
    die(how)


def dies_on(bad, attempt_dir, x):
    """Kill the worker on every attempt of item ``bad``; otherwise return x*x."""
    if x == bad:
        count_attempt(attempt_dir)
        die("sigkill")
    return x * x


def stop_first_time(marker_dir, x):
    """SIGSTOP this worker on the first attempt (its pid goes into the marker file)."""
    if first_time(os.path.join(marker_dir, "stopped")):
        os.kill(os.getpid(), signal.SIGSTOP)
    return x * x


def sleep_then_square(pair):
    """``(seconds, x)`` -> ``x * x`` after sleeping ``seconds``."""
    seconds, x = pair
    time.sleep(seconds)
    return x * x


def fails_on(bad, x):
    """Raise ValueError for item ``bad``; otherwise return x*x."""
    if x == bad:
        raise ValueError(f"bad item {x}")
    return x * x


def report_pid_and_wait(queue, release):
    """A job that puts its ``os.getpid()`` on ``queue`` and lives until ``release``."""
    queue.put(os.getpid())
    release.wait(120)


def live_pids(count, while_alive=None):
    """(sorted ``Process.pid``, sorted ``os.getpid()`` reported by the jobs) of ``count``
    fiberrl jobs alive together; ``while_alive(procs)`` is called before they end."""
    import fiberrl
    queue, release = fiberrl.Queue(), fiberrl.Event()
    procs = [fiberrl.Process(target=report_pid_and_wait, args=(queue, release))
             for _ in range(count)]
    for proc in procs:
        proc.start()
    try:
        seen = sorted(queue.get(timeout=120) for _ in procs)
        if while_alive is not None:
            while_alive(procs)
        return sorted(proc.pid for proc in procs), seen
    finally:
        release.set()
        for proc in procs:
            proc.join(60)
