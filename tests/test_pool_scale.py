"""What a pool's master costs per worker: its file-descriptor budget and the
supervisor's polling (issue 23). The figures at 64-1,024 workers are in
bench/bench_scale.py and docs/scale.md."""
import subprocess
import sys
import textwrap
import time

import pytest

import fiberrl
from pool_helpers import wait_until


def _run(code: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, timeout=timeout)


def test_pool_raises_a_low_soft_fd_limit_to_the_hard_one():
    done = _run("""
        import resource, fiberrl
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        assert hard >= 1024, hard
        resource.setrlimit(resource.RLIMIT_NOFILE, (128, hard))
        with fiberrl.Pool(40) as pool:  # 2 descriptors per worker and the margin: over 128
            assert pool.map(abs, range(-100, 0)) == list(range(100, 0, -1))
        print("LIMIT", resource.getrlimit(resource.RLIMIT_NOFILE) == (hard, hard))
    """, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "LIMIT True" in done.stdout


def test_pool_fails_at_once_when_the_hard_fd_limit_is_too_low():
    done = _run("""
        import resource, time, fiberrl
        resource.setrlimit(resource.RLIMIT_NOFILE, (200, 200))
        started = time.monotonic()
        try:
            fiberrl.Pool(100)
        except OSError as exc:
            print("ERROR", exc)
        print("SECONDS", time.monotonic() - started)
    """)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "ERROR a pool of 100 more workers needs about" in done.stdout, done.stdout
    assert "hard limit 200" in done.stdout
    assert float(done.stdout.split("SECONDS")[1]) < 5


def test_the_master_holds_two_descriptors_per_worker(make_pool):
    """A worker's pool stream and its job's watch stream, nothing else: its output comes
    relayed by the fork server, its end in the server's reports, its hello on its watch
    stream, and no sentinel is made unless asked for (issue 32)."""
    from fiberrl.pool.limits import FDS_PER_WORKER, open_fds
    assert FDS_PER_WORKER == 2
    warm = make_pool(2)   # the runtime, the fork server and the output thread are up
    assert wait_until(lambda: warm.stats().alive == 2, 120), warm.stats()
    before = open_fds()
    pool = make_pool(64)
    assert wait_until(lambda: pool.stats().alive == 64, 600), pool.stats()
    assert pool.map(abs, range(-640, 0)) == list(range(640, 0, -1))
    held = open_fds() - before
    assert held <= 2 * 64 + 8, f"{held} descriptors for 64 workers ({held / 64:.2f} each)"
    processes = pool.workers()
    assert all(p._popen._sentinel is None for p in processes)   # none made
    from multiprocessing.connection import wait
    sentinel = processes[0].sentinel                             # made when asked for
    assert not wait([sentinel], 0.1)
    processes[0].kill()
    assert wait([sentinel], 10), "the sentinel made late did not fire at the job's end"


def test_a_new_worker_costs_the_supervisor_no_pass_over_the_others(make_pool):
    """Start-up linear in the pool's size (issue 32): the supervisor's loop, run for each
    worker's hello, reads counts and sets kept as workers come and go; a pass over every
    worker happens only on a timer (time limits, once a second) or on a shrink/close."""
    started = time.monotonic()
    pool = make_pool(48)
    assert wait_until(lambda: pool.stats().alive == 48, 600), pool.stats()
    elapsed = time.monotonic() - started
    roster = pool._core.supervisor.roster
    assert roster.scans <= 2 + 1.5 * elapsed, (roster.scans, elapsed)
    # the dispatcher counts a worker alive at its hello; the supervisor's roster hears
    # of it through its event queue a moment later (CI once read starting == 1 here)
    assert wait_until(lambda: roster.active == 48 and roster.starting == 0, 10), \
        (roster.active, roster.starting)
    assert pool.map(abs, range(-96, 0)) == list(range(96, 0, -1))


def test_starting_n_workers_asks_the_earlier_ones_if_they_ended_only_log_n_times(
        make_pool, monkeypatch):
    """Process.start() dropped ended children by asking every child, as the stdlib's
    does: a pool of n workers asked n * n / 2 times (issue 32's start-up)."""
    from multiprocessing import process as mp_process
    looks = []
    real = mp_process._cleanup
    monkeypatch.setattr(mp_process, "_cleanup", lambda: (looks.append(1), real())[1])
    pool = make_pool(200)
    assert wait_until(lambda: pool.stats().alive == 200, 600), pool.stats()
    assert len(looks) <= 4, len(looks)   # the set doubled from 64: 64, 128 (and 256)
    assert len(fiberrl.active_children()) >= 200   # which still looks every time


def test_workers_up_is_counted_as_workers_come_and_go(make_pool):
    pool = make_pool(4)
    pool.wait_until_workers_up(120)
    supervisor = pool._core.supervisor
    brute = lambda: sum(1 for r in supervisor.roster.records.values()  # noqa: E731
                        if r.hello and not r.retiring)
    assert supervisor.workers_up() == brute() == 4
    pool._pool[0].kill()
    assert wait_until(lambda: supervisor.workers_up() == 3 or brute() == 4, 30)
    assert wait_until(lambda: supervisor.workers_up() == brute() == 4, 60)
    pool.close()
    pool.join()
    assert supervisor.workers_up() == brute() == 0


def test_resize_checks_the_fd_budget_of_the_workers_it_adds(make_pool, monkeypatch):
    import fiberrl.pool.pool as pool_module
    pool = make_pool(1)
    asked = []
    monkeypatch.setattr(pool_module, "ensure_fd_room", asked.append)
    pool.resize(5)
    pool.resize(2)
    assert asked == [4, 0]


def test_connected_workers_are_polled_about_once_a_second(make_pool, monkeypatch):
    """The supervisor used to poll every worker's job 20 times a second: 0.4 ms of the
    master's CPU per worker per second while idle (a connected worker's death closes its
    connection, which the I/O thread reports at once)."""
    from fiberrl.process import Process
    polls = []
    original = Process.exitcode
    monkeypatch.setattr(Process, "exitcode", property(
        lambda self: polls.append(self.pid) or original.fget(self)))
    pool = make_pool(8)
    assert wait_until(lambda: pool.stats().alive == 8, 120), pool.stats()
    time.sleep(0.5)
    polls.clear()
    time.sleep(2.0)
    per_worker_per_s = len(polls) / 8 / 2.0
    assert 0 < per_worker_per_s <= 3, per_worker_per_s
    # and a connected worker's death is still noticed at once
    victim = pool.workers()[0]
    victim.kill()
    assert wait_until(lambda: pool.stats().worker_deaths == 1, 5), pool.stats()


def test_workers_lost_together_are_declared_together(make_pool, tmp_path):
    """Eight workers whose connections close while their jobs live on (a lost node):
    their tasks run again within about LOST_GRACE, not after a wait of a second or more
    per worker, one after the other (which made a node of 64 workers take minutes)."""
    from scale_tasks import hang_up_once
    pool = make_pool(8)
    assert wait_until(lambda: pool.stats().alive == 8, 120), pool.stats()
    started = time.monotonic()
    results = pool.starmap(hang_up_once, [(str(tmp_path), i) for i in range(8)], chunksize=1)
    elapsed = time.monotonic() - started
    assert results == list(range(8))
    assert pool.stats().worker_deaths == 8
    assert elapsed < 6.0, elapsed  # one after the other: 8 x (1 s wait + kill + restart)


def test_terminate_gives_workers_killed_when_lost_one_second_in_all(make_pool):
    """Workers declared lost were killed, but on a vanished node their jobs may not be
    reported ended for a while: terminate() waits one second for all of them together,
    not a second each (a node of 64 workers held the pool's end for a minute)."""
    pool = make_pool(1)
    assert pool.map(abs, [-1]) == [1]

    class NeverReported:
        exitcode = None

        def join(self, timeout=None):
            time.sleep(timeout or 0)

    pool._core.supervisor.unreaped.extend(NeverReported() for _ in range(6))
    started = time.monotonic()
    pool.terminate()
    assert time.monotonic() - started < 4.0   # one after the other: over 6 s
