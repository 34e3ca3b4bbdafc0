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
        self.lost_for = []

    def poll(self):
        if self.process is not None:
            return self.process.poll()
        return self.code

    def _job_ended(self):
        self.told += 1

    def lost(self, reason):
        self.lost_for.append(reason)


class _FakeRemotePopen(_FakePopen):
    """A job on another host whose backend lists it as running for ever (a Slurm job
    stuck completing on a dead node)."""

    class backend:
        shares_host = False


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


def test_a_job_elsewhere_whose_stream_stays_gone_is_given_up_once_though_its_backend_lists_it():
    jobs = job_watch()
    heard = []
    jobs.on_end(lambda token: heard.append(token) if token.startswith("t-remote") else None)
    popen, never = _FakeRemotePopen(), _FakeRemotePopen()
    jobs.watch("t-remote", popen, lost_after=0.5)
    jobs.watch("t-remote-never-started", never, lost_after=0.2)   # still queued, say
    sentinel_r, sentinel_w = os.pipe()
    watch = ParentWatch(runtime().address, "t-remote", grace=5.0, interval=0.05,
                        sentinel_write=sentinel_w)
    watch.start()
    assert _wait(lambda: jobs.jobs["t-remote"].link is not None), "never connected"
    time.sleep(1.0)   # twice lost_after while its heartbeats come: not lost
    assert popen.lost_for == [] and heard == []
    watch.stop()   # its stream ends and no other comes (its host is gone)
    stopped = time.monotonic()
    assert _wait(lambda: heard == ["t-remote"])
    assert time.monotonic() - stopped >= 0.4
    assert len(popen.lost_for) == 1 and "its host is gone or cut off" in popen.lost_for[0]
    assert jobs.ended("t-remote") and popen.told == 1
    time.sleep(0.5)
    assert heard == ["t-remote"] and len(popen.lost_for) == 1
    assert never.lost_for == [] and not jobs.ended("t-remote-never-started")
    os.close(sentinel_r)


class _FakeUnanswerableRemotePopen(_FakeRemotePopen):
    """A job on another host whose backend cannot answer at all (``squeue`` exiting 1
    while the controller has lost the job's node)."""

    def poll(self):
        raise RuntimeError("squeue exited with status 1")


def test_a_job_elsewhere_whose_stream_stays_gone_is_given_up_though_its_backend_fails():
    # The status query failing used to skip the silence check: the interpreter's exit,
    # which joins every child, then waited for ever (test_slurm_warm's node loss, twice
    # in CI)
    jobs = job_watch()
    heard = []
    jobs.on_end(lambda token: heard.append(token) if token == "t-unanswerable" else None)
    popen = _FakeUnanswerableRemotePopen()
    jobs.watch("t-unanswerable", popen, lost_after=0.3)
    sentinel_r, sentinel_w = os.pipe()
    watch = ParentWatch(runtime().address, "t-unanswerable", grace=5.0, interval=0.05,
                        sentinel_write=sentinel_w)
    watch.start()
    assert _wait(lambda: jobs.jobs["t-unanswerable"].link is not None), "never connected"
    watch.stop()   # its stream ends and no other comes
    assert _wait(lambda: heard == ["t-unanswerable"]), "never given up"
    assert len(popen.lost_for) == 1 and jobs.ended("t-unanswerable")
    os.close(sentinel_r)


def _touch_and_sleep(path):
    open(path, "w").close()
    time.sleep(60)


def test_join_returns_for_a_job_whose_host_vanished_though_its_backend_still_lists_it(tmp_path):
    """A job on another host that dies without its backend ever saying so (a Slurm job
    stuck completing on a node whose slurmd died): join() does not wait for ever, nor
    does the interpreter's exit, which joins every child."""
    import signal

    import fiberrl
    from fiberrl.backends import JobState, JobStatus, register_backend
    from fiberrl.backends.local import LocalBackend

    class NeverToldBackend(LocalBackend):
        """Starts local jobs but reports on them as a remote scheduler that lost a node."""
        shares_host = False

        def notify_end(self, job, callback):
            return False

        def status(self, job):
            return JobStatus(JobState.RUNNING)

        def wait(self, job, timeout=None):
            time.sleep(timeout or 0)
            return None

    register_backend("never-told", lambda listen_host=None: NeverToldBackend(listen_host))
    fiberrl.init(backend="never-told", heartbeat_timeout=1.0, heartbeat_interval=0.2,
                 parent_grace=0.5)
    try:
        running = tmp_path / "running"
        proc = fiberrl.Process(target=_touch_and_sleep, args=(str(running),))
        proc.start()
        assert _wait(running.exists, 30)   # it said hello: its watch stream is up
        pid = proc.pid
        os.kill(pid, signal.SIGKILL)   # its stream ends; its backend never tells
        killed = time.monotonic()
        proc.join(30)
        assert proc.exitcode == -signal.SIGKILL
        assert 1.5 < time.monotonic() - killed < 15
        assert not proc.is_alive() and proc not in fiberrl.active_children()
    finally:
        fiberrl.config.reset()
