"""Ctrl-C (SIGINT to the whole process group, as a terminal sends it) during a
``pool.map`` script and during ``fiberrl train es``: the command exits within 3 s,
prints at most one line per process, leaves nothing running, and the pool does not
report its interrupted workers as lost; the same while the workers' interpreters are
still starting. Also: a never-closed ``Manager().Pool()`` prints nothing at exit."""
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

ROOT = Path(__file__).resolve().parent.parent
POOL_SCRIPT = """
import sys, time
import fiberrl

def slow(x):
    time.sleep(30)
    return x

if __name__ == "__main__":
    with fiberrl.Pool(2) as pool:
        pool.apply(time.sleep, (0,))   # both workers' start-up is behind us
        pool.apply(time.sleep, (0,))
        print("STARTED", flush=True)
        try:
            pool.map(slow, range(8), chunksize=1)
        except KeyboardInterrupt:
            print("interrupted", file=sys.stderr)
            sys.exit(130)
"""


def _session(pid):
    alive = []
    for proc in psutil.process_iter(["pid", "status"]):
        try:
            if os.getsid(proc.pid) == pid and proc.info["status"] != psutil.STATUS_ZOMBIE:
                alive.append(proc.pid)
        except (ProcessLookupError, PermissionError, psutil.Error):
            pass
    return alive


def _interrupt(cmd, ready, cwd, env=None, delay=0.5, out=None):
    """Start ``cmd`` in its own session, wait until ``ready()`` and ``delay`` s more,
    SIGINT the group; returns (exit status, seconds to exit, stderr). The rest of its
    stdout is appended to the list ``out`` if one is given."""
    proc = subprocess.Popen(cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True, env=env)
    try:
        deadline = time.monotonic() + 120
        while not ready(proc):
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "never got ready"
            time.sleep(0.1)
        time.sleep(delay)
        started = time.monotonic()
        os.killpg(proc.pid, signal.SIGINT)
        rest, err = proc.communicate(timeout=30)
        if out is not None:
            out.append(rest)
        took = time.monotonic() - started
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    deadline = time.monotonic() + 3
    while _session(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _session(proc.pid) == [], "processes left running after Ctrl-C"
    return proc.returncode, took, err


def _check_quiet(err):
    lines = err.splitlines()
    assert "Traceback" not in err, err
    assert " lost " not in err and "SIGTERM" not in err, err
    assert len(lines) <= 1, err   # the master's one line; the workers say nothing


def test_ctrl_c_during_pool_map(tmp_path):
    script = tmp_path / "job.py"
    script.write_text(POOL_SCRIPT)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    code, took, err = _interrupt([sys.executable, str(script)],
                                 lambda p: p.stdout.readline().startswith("STARTED"), tmp_path, env)
    assert code == 130, err
    assert took < 3, took
    _check_quiet(err)
    assert err.strip() == "interrupted"


EARLY_SCRIPT = """
import sys, time
import fiberrl

def slow(x):
    time.sleep(30)
    return x

if __name__ == "__main__":
    with fiberrl.Pool(2) as pool:   # its workers start in the background from here
        print("LAUNCHED", flush=True)
        try:
            pool.map(slow, range(8), chunksize=1)
        except KeyboardInterrupt:
            print("interrupted", file=sys.stderr)
            sys.exit(130)
"""


@pytest.mark.parametrize("step", ["WorkerConnection", "parent_watch"])
def test_a_worker_interrupted_while_it_connects_exits_quietly(monkeypatch, step):
    """The window the test below hits about once in 20 runs: Ctrl-C after the job
    let SIGINT through, while the worker still connects to its pool."""
    from fiberrl.pool import worker

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    if step != "WorkerConnection":   # connected: the interrupt comes a step later
        monkeypatch.setattr(worker, "WorkerConnection", lambda *a: _ClosableStub())
    monkeypatch.setattr(worker, step, interrupted)
    try:
        worker.run_worker(("127.0.0.1", 9), 0, "token", None, (), None, 1.0)
    except KeyboardInterrupt:   # (left to escape, it would end pytest's session)
        pytest.fail("the interrupt escaped the worker: its job would print a traceback")
    except SystemExit as ended:
        assert ended.code == 130
    else:
        pytest.fail("the worker went on after the interrupt")


class _ClosableStub:
    def close(self):
        pass


@pytest.mark.parametrize("delay", [0.05, 0.1, 0.15, 0.2, 0.3])
def test_ctrl_c_while_workers_start(tmp_path, delay):
    """Ctrl-C while the workers' interpreters are still starting (the first ones are
    exec'd, the fork server is itself starting): no job prints a traceback, and the
    caller is not left waiting. Several delays, since the window moves with load."""
    script = tmp_path / "early.py"
    script.write_text(EARLY_SCRIPT)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    code, took, err = _interrupt([sys.executable, str(script)],
                                 lambda p: p.stdout.readline().startswith("LAUNCHED"), tmp_path,
                                 env, delay=delay)
    assert code == 130, err
    assert took < 3, took
    _check_quiet(err)
    assert err.strip() == "interrupted"


def test_a_blocked_caller_sees_ctrl_c_taken_by_another_thread(tmp_path):
    """SIGINT may land on any thread of the process; Python raises it in the main
    thread only when that runs, so ``get()`` must not block it for good."""
    script = tmp_path / "poke.py"
    script.write_text(
        "import signal, threading, time\nimport fiberrl\n\n"
        "def poke():\n    time.sleep(0.5)\n"
        "    signal.pthread_kill(threading.get_ident(), signal.SIGINT)\n\n"
        "if __name__ == '__main__':\n    with fiberrl.Pool(1) as pool:\n"
        "        pool.apply(time.sleep, (0,))\n"
        "        threading.Thread(target=poke).start()\n        started = time.monotonic()\n"
        "        try:\n            pool.apply(time.sleep, (30,))\n"
        "        except KeyboardInterrupt:\n"
        "            print(round(time.monotonic() - started, 2))\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert float(done.stdout) < 1.5, done.stdout


@pytest.mark.slow
def test_ctrl_c_during_fiberrl_train_es(tmp_path):
    pytest.importorskip("torch")
    out = tmp_path / "es"
    fiberrl = Path(sys.executable).with_name("fiberrl")
    cmd = [str(fiberrl), "train", "es", "--env", "CartPole-v1", "--total-steps", "5000000",
           "--workers", "2", "--no-progress", "--eval-every", "2000", "--out", str(out)]
    code, took, err = _interrupt(cmd, lambda p: (out / "summary.json").exists(), tmp_path)
    assert code == 130, err
    assert took < 3, took
    _check_quiet(err)
    assert err.strip() == "fiberrl train: interrupted"


def test_an_unclosed_manager_pool_is_quiet_at_exit(tmp_path):
    script = tmp_path / "mgr.py"
    script.write_text("import fiberrl\n\ndef sq(x):\n    return x * x\n\n"
                      "if __name__ == '__main__':\n    pool = fiberrl.Manager().Pool(2)\n"
                      "    print(pool.map(sq, range(5)))\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[0, 1, 4, 9, 16]"
    # no per-worker "killed by signal 15 (SIGTERM)" warnings when the server stops them
    assert "SIGTERM" not in done.stderr and "killed by signal" not in done.stderr, done.stderr


def test_ctrl_c_while_the_command_loads_its_subcommands(monkeypatch, capsys):
    """The first second of ``fiberrl ...`` imports every subcommand (torch, numpy):
    Ctrl-C there is one line and exit 130 too, not an import traceback."""
    import fiberrl.cli as cli

    def interrupted():
        raise KeyboardInterrupt
    monkeypatch.setattr(cli, "build_parser", interrupted)
    assert cli.main(["backends"]) == 130
    assert capsys.readouterr().err == "fiberrl: interrupted\n"


# -- a program started with SIGINT ignored ---------------------------------------------
# A non-interactive shell starts its background commands (``cmd &`` in a script) with
# SIGINT ignored; so do nohup-style launchers and some CI runners and schedulers.
IGNORING = ["bash", "-c", 'trap "" INT; exec "$@"', "bash"]   # what such a shell does

IGNORED_SCRIPT = """
import multiprocessing, os, signal, sys, time
import fiberrl

def ignores(q):
    forked = b"FIBERRL_FORKSERVER=1" in open("/proc/self/environ", "rb").read()
    q.put(("forked" if forked else "execd", signal.getsignal(signal.SIGINT) is signal.SIG_IGN))

def nap(x):
    time.sleep(0.5)
    return os.getpid()

if __name__ == "__main__":
    print("parent", signal.getsignal(signal.SIGINT) is signal.SIG_IGN)
    q = fiberrl.Queue()
    for _ in range(100):   # until a job comes from the fork server (once it is ready)
        p = fiberrl.Process(target=ignores, args=(q,))
        p.start()
        kind, ignored = q.get()
        p.join()
        print(kind, ignored)
        if kind == "forked":
            break
        time.sleep(0.05)
    for method in ("spawn", "forkserver"):
        ctx = multiprocessing.get_context(method)
        sq = ctx.Queue()
        p = ctx.Process(target=ignores, args=(sq,))
        p.start()
        print("stdlib-" + method, sq.get()[1])
        p.join()
    with fiberrl.Pool(2) as pool:
        pool.apply(time.sleep, (0,))
        workers = []
        while len(workers) < 2:
            workers = sorted(p.pid for p in fiberrl.active_children() if "worker" in p.name)
        print("MAPPING", flush=True)
        pids = pool.map(nap, range(8), chunksize=1)
    print("the same workers did every task:", sorted(set(pids)) == workers)
"""


def test_a_program_started_with_sigint_ignored_keeps_it_ignored_in_its_jobs(tmp_path):
    """As with the stdlib: the program's jobs ignore SIGINT too, exec'd ones and those
    the fork server forks alike, so a SIGINT to the whole group during ``pool.map``
    stops nothing: every worker lives on and the map returns."""
    script = tmp_path / "ignoring.py"
    script.write_text(IGNORED_SCRIPT)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    before, rest = [], []

    def mapping(proc):
        before.append(proc.stdout.readline().strip())
        return before[-1] == "MAPPING"

    code, _, err = _interrupt([*IGNORING, sys.executable, str(script)], mapping, tmp_path, env,
                              delay=0.3, out=rest)
    assert code == 0, err
    assert "Traceback" not in err and "interrupted" not in err, err
    assert before[0] == "parent True"
    jobs = [line.split() for line in before[1:-3]]
    assert jobs[-1][0] == "forked" and all(ignored == "True" for _, ignored in jobs), before
    assert before[-3:-1] == ["stdlib-spawn True", "stdlib-forkserver True"]
    # no worker was interrupted (and replaced, its task re-run)
    assert rest == ["the same workers did every task: True\n"], (rest, err)


def test_the_suite_takes_ctrl_c_as_usual_when_started_in_the_background(tmp_path):
    """``bash scripts/test.sh > log &`` from a script: pytest starts with SIGINT
    ignored, and the suite (tests/conftest.py) gives its tests a terminal's Ctrl-C
    handling back, so a Ctrl-C case passes as in the foreground."""
    background = ["bash", "-c", '"$@" & wait $!', "bash"]   # a script's ``cmd &``
    probe = subprocess.run([*background, sys.executable, "-c",
                            "import signal; print(signal.getsignal(signal.SIGINT) is signal.SIG_IGN)"],
                           capture_output=True, text=True, timeout=60)
    assert probe.stdout.strip() == "True", probe   # how the run below starts
    done = subprocess.run([*background, sys.executable, "-m", "pytest", "-q",
                           "-p", "no:cacheprovider", "-o", "addopts=",
                           f"--basetemp={tmp_path / 'inner'}",
                           f"{__file__}::test_ctrl_c_during_pool_map"],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout[-4000:]
    assert "1 passed" in done.stdout, done.stdout[-4000:]


class CtrlCInTheBootstrap:
    """Unpickled in a job, it has a Ctrl-C arrive while the stdlib's bootstrap runs the
    after-fork hooks: after the process object was unpickled, before its target."""

    def __init__(self):
        self.armed = True   # (an object with no state is unpickled without __setstate__)

    def __setstate__(self, state):
        import multiprocessing.util
        self.__dict__.update(state)
        multiprocessing.util.register_after_fork(self, _ctrl_c_here)


def _ctrl_c_here(_):
    os.kill(os.getpid(), signal.SIGINT)
    time.sleep(0.2)   # where Python would raise KeyboardInterrupt if SIGINT were let through


def _say(word):
    print(word, flush=True)


def test_a_ctrl_c_in_the_bootstrap_before_the_target_ends_the_job_quietly():
    """The stdlib's bootstrap (closing stdin, the after-fork hooks) is still the job's
    start: a Ctrl-C there ends the job with 130 and no traceback, and the target does
    not run (CI once saw a worker's traceback from ``util._close_stdin``)."""
    import fiberrl
    proc = fiberrl.Process(target=_say, args=("the target ran",), kwargs={})
    proc.carried = CtrlCInTheBootstrap()
    proc.start()
    proc.join(60)
    logs = proc.job_logs()
    assert proc.exitcode == 130, logs
    assert "Traceback" not in logs and "the target ran" not in logs, logs
