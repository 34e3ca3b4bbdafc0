"""fiberrl._runtime.liveness: a job's watch over its parent sends heartbeats the parent
hears, rides out a dropped stream while the parent is still there, and stops when told;
the parent hears of a job's end once, from its backend or from its process."""
import os
import time


from fiberrl._runtime.liveness import ParentWatch, job_watch
from fiberrl._runtime.runtime import runtime


class _FakePopen:
    """What the job watch reads of a Popen: its backend (host sharing, end notices),
    ``poll`` and ``_job_ended``."""

    class backend:
        shares_host = True
        notices = []

        @classmethod
        def notify_end(cls, job, callback):
            if getattr(job, "notifies", False):
                cls.notices.append(callback)
                return True
            return False

    def __init__(self, process=None):
        self.process = process
        self.code = None
        self.told = 0

    def poll(self):
        if self.process is not None:
            return self.process.poll()
        return self.code

    def _job_ended(self):
        self.told += 1


class _Job:
    def __init__(self, pid, notifies=False):
        self.pid, self.notifies = pid, notifies


def _wait(predicate, seconds=10.0):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.01)
    return False


def test_watch_sends_heartbeats_reconnects_and_stops_when_told():
    jobs = job_watch()
    popen = _FakePopen()
    jobs.watch("t-reconnect", popen)
    sentinel_r, sentinel_w = os.pipe()
    address = runtime().address
    watch = ParentWatch(address, "t-reconnect", grace=5.0, interval=0.05, sentinel_write=sentinel_w)
    watch.start()
    assert _wait(lambda: jobs.jobs["t-reconnect"].link is not None), "never connected"
    first = jobs.jobs["t-reconnect"].link
    heard = jobs.silence("t-reconnect")
    assert heard is not None and _wait(lambda: jobs.silence("t-reconnect") < 0.04), \
        "no heartbeats heard"
    # the parent drops the job's stream (as if it had hiccuped): the job comes back
    jobs.reactor.call_soon(lambda: first.close("test"))
    assert _wait(lambda: jobs.jobs["t-reconnect"].link not in (None, first)), "no reconnect"
    watch.stop()
    assert not watch.thread.is_alive()
    os.set_blocking(sentinel_r, False)
    try:
        os.read(sentinel_r, 1)
        raise AssertionError("the parent sentinel fired although the parent is alive")
    except BlockingIOError:
        pass  # nothing to read and not closed: the parent still counts as alive


def test_job_end_is_heard_once_from_its_process():
    import subprocess
    jobs = job_watch()
    heard = []
    jobs.on_end(lambda token: heard.append(token) if token == "t-end" else None)
    child = subprocess.Popen(["sleep", "60"])
    popen = _FakePopen(child)
    jobs.watch("t-end", popen)
    jobs.launched("t-end", _Job(child.pid))   # no end notices: its pid is watched
    assert not jobs.ended("t-end")
    time.sleep(0.1)
    assert heard == []
    child.kill()
    assert _wait(lambda: heard == ["t-end"])
    assert jobs.ended("t-end") and popen.told == 1
    time.sleep(0.1)
    assert heard == ["t-end"]


def test_job_end_is_heard_once_from_its_backend():
    jobs = job_watch()
    heard = []
    jobs.on_end(lambda token: heard.append(token) if token == "t-told" else None)
    popen = _FakePopen()
    jobs.watch("t-told", popen)
    jobs.launched("t-told", _Job(os.getpid(), notifies=True))
    callback = popen.backend.notices[-1]
    time.sleep(0.1)
    assert heard == [] and not jobs.ended("t-told")
    popen.code = 0
    callback()
    callback()   # a second notice changes nothing
    assert _wait(lambda: heard == ["t-told"])
    time.sleep(0.1)
    assert heard == ["t-told"] and popen.told == 1


def test_a_watch_for_an_unknown_job_is_turned_away():
    from fiberrl._wire.stream import NotHereError, open_stream
    import pytest
    with pytest.raises(NotHereError):
        open_stream(runtime().address, "watch:nobody")
