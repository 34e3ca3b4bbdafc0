"""Shared fixtures: every test must leave no child process behind; pools made by a
test are terminated when it ends."""
import time

import psutil
import pytest

import fiberrl


def _children():
    return {p.pid: p for p in psutil.Process().children(recursive=True)}


@pytest.fixture(autouse=True)
def no_leaked_processes():
    """Fail a test that leaves processes behind (after a short grace to exit)."""
    before = set(_children())
    yield
    deadline = time.monotonic() + 10.0
    leaked = {}
    while time.monotonic() < deadline:
        leaked = {pid: p for pid, p in _children().items()
                  if pid not in before and p.is_running() and p.status() != psutil.STATUS_ZOMBIE}
        if not leaked:
            return
        time.sleep(0.1)
    for proc in leaked.values():
        try:
            proc.kill()
        except psutil.Error:
            pass
    pytest.fail(f"test leaked processes: {[_describe(p) for p in leaked.values()]}")


def _describe(proc):
    try:
        return proc.cmdline()
    except psutil.Error as exc:
        return f"pid {proc.pid} ({type(exc).__name__})"


@pytest.fixture
def make_pool():
    """Pools made by a test, terminated and joined when it ends (pass or fail)."""
    made = []

    def make(*args, **kwargs):
        made.append(fiberrl.Pool(*args, **kwargs))
        return made[-1]

    yield make
    for p in made:
        p.terminate()
    for p in made:
        p.join()
