"""The local backend's fork server: jobs forked from a warm interpreter behave as
jobs started as fresh interpreters do (exit codes, signals, output, sentinels,
environment), and neither the server nor its jobs outlive their parent."""
import os
import random
import signal
import subprocess
import sys
import textwrap
import time
from multiprocessing.connection import wait

import psutil
import pytest

import fiberrl
from fiberrl.backends.local.forkserver_client import ForkedJob, running_servers
from fiberrl.backends.local import LocalBackend

import pool_helpers


def _noop():
    pass


def _report(queue, name):
    queue.put((os.environ.get(name), os.getcwd(), random.random(), os.getppid(),
               sorted(t.name for t in __import__("threading").enumerate())))


def _shout(text):
    print(text, flush=True)
    print(text.upper(), file=sys.stderr, flush=True)


def _forked(proc):
    return isinstance(proc._popen.job.data, ForkedJob)


@pytest.fixture
def server():
    """A ready fork server of this process (jobs started now are forked)."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        ready = [s for s in running_servers() if s.ready()]
        if ready:
            return ready[0]
        proc = fiberrl.Process(target=_noop)  # the second job of a process starts the server
        proc.start()
        proc.join(30)
        time.sleep(0.05)
    pytest.fail("the fork server never became ready")


def test_forked_jobs_get_their_own_environment_directory_and_seed(server, tmp_path, monkeypatch):
    monkeypatch.setenv("FIBERRL_TEST_VALUE", "set after the server started")
    monkeypatch.chdir(tmp_path)
    queue = fiberrl.Queue()
    procs = [fiberrl.Process(target=_report, args=(queue, "FIBERRL_TEST_VALUE")) for _ in range(2)]
    for proc in procs:
        proc.start()
    assert all(_forked(proc) for proc in procs)
    reports = [queue.get(timeout=30) for _ in procs]
    for proc in procs:
        proc.join(30)
        assert proc.exitcode == 0
    for value, cwd, _, parent, threads in reports:
        assert value == "set after the server started"
        assert cwd == str(tmp_path)
        assert parent == server.process.pid
        assert "MainThread" in threads
    assert reports[0][2] != reports[1][2], "forked siblings drew the same random numbers"


def _sigint_ignored(queue):
    queue.put(signal.getsignal(signal.SIGINT) is signal.SIG_IGN)


def test_a_forked_job_ignores_sigint_when_its_parent_does_at_its_start(server):
    """As an exec'd job (and a stdlib child) would: the parent's disposition when the
    job starts, not the server's (which always ignores SIGINT) nor the one the parent
    had when the server started."""
    queue = fiberrl.Queue()
    seen = []
    for disposition in (signal.SIG_IGN, signal.default_int_handler):
        previous = signal.signal(signal.SIGINT, disposition)
        try:
            proc = fiberrl.Process(target=_sigint_ignored, args=(queue,))
            proc.start()
        finally:
            signal.signal(signal.SIGINT, previous)
        assert _forked(proc)
        seen.append(queue.get(timeout=30))
        proc.join(30)
        assert proc.exitcode == 0
    assert seen == [True, False]


@pytest.mark.parametrize("target,args,code", [(sys.exit, (3,), 3), (os._exit, (0,), 0),
                                              (time.sleep, (60,), -signal.SIGKILL)])
def test_exit_codes_and_signals_of_forked_jobs(server, target, args, code):
    proc = fiberrl.Process(target=target, args=args)
    proc.start()
    assert _forked(proc)
    if code < 0:
        time.sleep(0.3)
        proc.kill()
    proc.join(30)
    assert proc.exitcode == code


def test_terminate_and_sentinel_of_a_forked_job(server):
    proc = fiberrl.Process(target=time.sleep, args=(60,))
    proc.start()
    assert _forked(proc)
    assert not wait([proc.sentinel], 0.2)
    proc.terminate()
    assert wait([proc.sentinel], 10), "the sentinel did not fire when the job ended"
    proc.join(10)
    assert proc.exitcode == -signal.SIGTERM


def test_output_of_a_forked_job_reaches_the_parent_and_its_logs(server, capfd):
    proc = fiberrl.Process(target=_shout, args=("hello from a fork",))
    proc.start()
    assert _forked(proc)
    proc.join(30)
    assert proc.exitcode == 0
    assert "hello from a fork" in proc.job_logs()
    assert pool_helpers.wait_until(lambda: "HELLO FROM A FORK" in capfd.readouterr().err, 5)


def test_interpreter_start_up_variables_or_the_setting_turn_forking_off(server, monkeypatch):
    monkeypatch.setenv("PYTHONFAULTHANDLER", "1")  # only read when an interpreter starts
    proc = fiberrl.Process(target=_noop)
    proc.start()
    proc.join(30)
    assert proc.exitcode == 0 and not _forked(proc)
    monkeypatch.delenv("PYTHONFAULTHANDLER")
    fiberrl.init(forkserver=False)
    try:
        proc = fiberrl.Process(target=_noop)
        proc.start()
        proc.join(30)
        assert proc.exitcode == 0 and not _forked(proc)
    finally:
        fiberrl.config.reset()


def test_a_job_whose_server_died_is_killed_and_reported(server):
    proc = fiberrl.Process(target=time.sleep, args=(60,))
    proc.start()
    assert _forked(proc)
    pid = proc.pid
    server.process.kill()
    server.process.wait(10)
    proc.join(60)   # nobody could reap it: without its server's end, a join never returns
    assert proc.exitcode == -signal.SIGKILL, "join waited for a job nobody could reap"
    assert pool_helpers.wait_until(lambda: not psutil.pid_exists(pid)
                                   or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE, 10)
    after = fiberrl.Process(target=sys.exit, args=(5,))  # a new server, or an exec'd job
    after.start()
    after.join(30)
    assert after.exitcode == 5


def _pipes(pid="self"):
    """{fd: pipe inode} of a process."""
    found = {}
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            link = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if link.startswith("pipe:"):
            found[int(fd)] = link
    return found


def _descriptors(queue, looked=None):
    import resource
    queue.put((_pipes(), resource.getrlimit(resource.RLIMIT_NOFILE)))
    if looked is not None:   # alive, its pipes held by the server, until the test looked
        looked.wait(30)


def test_a_forked_job_holds_none_of_its_siblings_output_pipes(server):
    """The server keeps two output pipes per job; a job closes its siblings' (all at
    once) and gets the open-file limit its parent has, not the server's."""
    import resource
    sleepers = [fiberrl.Process(target=time.sleep, args=(60,)) for _ in range(6)]
    for proc in sleepers:
        proc.start()
    try:
        queue, looked = fiberrl.Queue(), fiberrl.Event()
        probe = fiberrl.Process(target=_descriptors, args=(queue, looked))
        probe.start()
        assert _forked(probe)
        pipes, limits = queue.get(timeout=30)
        kept_by_server = set(_pipes(server.process.pid).values())
        looked.set()
        shared = {fd for fd, inode in pipes.items() if inode in kept_by_server}
        assert shared == {1, 2}, pipes   # its own stdout and stderr, no sibling's
        assert limits == resource.getrlimit(resource.RLIMIT_NOFILE)
        probe.join(30)
    finally:
        for proc in sleepers:
            proc.kill()
            proc.join(10)


_LOW_SOFT_LIMIT = textwrap.dedent("""
    import os, resource, sys, time
    sys.path.insert(0, sys.argv[1])
    import fiberrl
    from fiberrl.backends.local.forkserver_client import running_servers
    import test_forkserver as t
    if __name__ == "__main__":
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(256, hard // 2), hard))
        while not any(s.ready() for s in running_servers()):
            p = fiberrl.Process(target=t._noop); p.start(); p.join(); time.sleep(0.05)
        sleepers = [fiberrl.Process(target=time.sleep, args=(60,)) for _ in range(6)]
        for p in sleepers:
            p.start()
        queue = fiberrl.Queue()
        probe = fiberrl.Process(target=t._descriptors, args=(queue,))
        probe.start()
        pipes, limits = queue.get(timeout=30)
        server = running_servers()[0]
        kept = set(t._pipes(server.process.pid).values())
        print("SHARED", sorted(fd for fd, inode in pipes.items() if inode in kept))
        print("LIMITS", limits == resource.getrlimit(resource.RLIMIT_NOFILE))
        print("LIFTED", max(t._pipes(server.process.pid)) >= min(256, hard // 2))
        for p in sleepers:
            p.kill(); p.join(10)
        probe.join(10)
""")


def test_siblings_pipes_are_closed_at_once_where_the_server_could_raise_its_limit(tmp_path):
    """With a soft open-file limit below the hard one, the server raises its own, keeps
    its jobs' output pipes above the old soft limit, and a forked job closes them all
    in one call and gets the old limit back."""
    import resource
    if resource.getrlimit(resource.RLIMIT_NOFILE)[1] < 1024:
        pytest.skip("the hard open-file limit is too low to test this")
    script = tmp_path / "low_soft_limit.py"
    script.write_text(_LOW_SOFT_LIMIT)
    out = subprocess.run([sys.executable, str(script), os.path.dirname(__file__)],
                         capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PYTHONPATH": os.getcwd()})
    assert out.returncode == 0, out.stderr[-2000:]
    assert "SHARED [1, 2]" in out.stdout, out.stdout
    assert "LIMITS True" in out.stdout and "LIFTED True" in out.stdout, out.stdout


def test_ps_names_forked_jobs_and_not_the_server(server):
    proc = fiberrl.Process(target=time.sleep, args=(60,), name="forked-napper")
    proc.start()
    try:
        assert _forked(proc)
        jobs = {job.id: job for job in LocalBackend().list_jobs()}
        assert jobs[f"local-{proc.pid}"].name == "forked-napper"
        assert f"local-{server.process.pid}" not in jobs
    finally:
        proc.kill()
        proc.join(10)


_ABANDONING_PARENT = textwrap.dedent("""
    import os, sys, time
    import fiberrl
    from fiberrl.backends.local.forkserver_client import running_servers
    def noop():
        pass
    if __name__ == "__main__":
        fiberrl.init(parent_grace=1.0)
        deadline = time.monotonic() + 60
        while not any(s.ready() for s in running_servers()) and time.monotonic() < deadline:
            p = fiberrl.Process(target=noop); p.start(); p.join()
            time.sleep(0.05)
        sleeper = fiberrl.Process(target=time.sleep, args=(600,))
        sleeper.start()
        print(running_servers()[0].process.pid, sleeper.pid, flush=True)
        time.sleep(0.5)
        os._exit(0)  # no clean-up at all: as if the parent were killed
""")


def test_the_server_and_its_jobs_do_not_outlive_their_parent(tmp_path):
    script = tmp_path / "parent.py"
    script.write_text(_ABANDONING_PARENT)
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                         timeout=120, env={**os.environ, "PYTHONPATH": os.getcwd()})
    assert out.returncode == 0, out.stderr
    server_pid, job_pid = (int(word) for word in out.stdout.split())

    def gone(pid):
        try:
            return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return True

    assert pool_helpers.wait_until(lambda: gone(job_pid) and gone(server_pid), 30), \
        "the forked job or its server outlived the parent"


def _has_module(queue, name):
    import sys
    queue.put(name in sys.modules)


def test_set_forkserver_preload_imports_modules_in_the_next_server():
    from fiberrl.backends.local import forkserver_client
    fiberrl.set_forkserver_preload(["xml.dom.minidom", "no_such_module_anywhere"])
    forkserver_client.close_all()  # the next server starts with the preloads
    try:
        deadline = time.monotonic() + 60
        while not any(s.ready() for s in running_servers()) and time.monotonic() < deadline:
            proc = fiberrl.Process(target=_noop)
            proc.start()
            proc.join(30)
        queue = fiberrl.Queue()
        proc = fiberrl.Process(target=_has_module, args=(queue, "xml.dom.minidom"))
        proc.start()
        assert _forked(proc)
        assert queue.get(timeout=30) is True
        proc.join(30)
    finally:
        fiberrl.set_forkserver_preload([])
        forkserver_client.close_all()
    with pytest.raises(TypeError):
        fiberrl.set_forkserver_preload("xml")


def test_a_server_whose_parent_finished_before_its_preloads_exits_quietly():
    """A short script ends while its fork server still imports: the server used to die
    on 'control.send(READY)' with a BrokenPipeError traceback on the user's terminal."""
    import socket
    import subprocess
    import sys
    ours, theirs = socket.socketpair()
    server = subprocess.Popen([sys.executable, "-m", "fiberrl.backends.local",
                               str(theirs.fileno())], pass_fds=(theirs.fileno(),),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    theirs.close()
    ours.close()   # the parent is gone before the server is ready
    out, err = server.communicate(timeout=60)
    assert server.returncode == 0, err
    assert err == "" and out == ""


def test_the_io_thread_never_waits_for_an_exit_code_that_is_late(server):
    # poll() waits a little for the exit code of a job whose pidfd fired (the stdlib's
    # poll() reaps it at once); on the I/O thread it must not: the loop carries every
    # job's messages and ends. Here the fork server is stopped, so the code is late.
    from fiberrl._runtime.liveness import job_watch
    import threading
    proc = fiberrl.Process(target=time.sleep, args=(0.2,))
    proc.start()
    assert _forked(proc)
    sentinel = proc.sentinel
    os.kill(server.process.pid, signal.SIGSTOP)
    try:
        assert wait([sentinel], timeout=30) == [sentinel]
        took = []
        done = threading.Event()

        def poll_on_the_loop():
            started = time.monotonic()
            took.append((proc._popen.poll(), time.monotonic() - started))
            done.set()

        job_watch().reactor.call_soon(poll_on_the_loop)
        assert done.wait(30)
        assert took[0][0] is None and took[0][1] < 1.0, took
    finally:
        os.kill(server.process.pid, signal.SIGCONT)
    proc.join(30)
    assert proc.exitcode == 0
