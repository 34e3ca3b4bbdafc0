"""Ctrl-C held while a job starts (fiberrl/_runtime/interrupts.py): a process the local
backend launches starts with SIGINT blocked, and ``release()`` tells a held Ctrl-C
from none."""
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import fiberrl
from fiberrl._runtime import interrupts
from fiberrl.backends.base import JobSpec
from fiberrl.backends.local import LocalBackend

ROOT = Path(__file__).resolve().parent.parent


def _blocked(pid):
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("SigBlk:"):
                return int(line.split()[1], 16)
    raise AssertionError("no SigBlk line")


def _start_and_read_mask(command):
    backend = LocalBackend()
    job = backend.create_job(JobSpec(command=command, name="held"))
    try:
        time.sleep(0.3)
        return _blocked(job.pid) & (1 << (signal.SIGINT - 1))
    finally:
        backend.terminate(job, force=True)
        backend.wait(job, timeout=10)


def test_an_execd_job_of_the_entry_point_starts_with_sigint_blocked(tmp_path):
    # a stand-in interpreter that only sleeps: what matters is the command's shape,
    # ``PYTHON -m fiberrl.spawn`` (exec'd: the fork server is off)
    python = tmp_path / "python"
    python.write_text("#!/bin/sh\nexec sleep 30\n")
    python.chmod(0o755)
    fiberrl.init(forkserver=False)
    try:
        assert _start_and_read_mask([str(python), "-m", "fiberrl.spawn"])
    finally:
        fiberrl.config.reset()
    # ...and the launching thread got its own mask back
    assert signal.SIGINT not in signal.pthread_sigmask(signal.SIG_BLOCK, [])


def test_another_command_gets_ctrl_c_as_usual():
    """``fiberrl run script.py`` and other commands: nothing would release SIGINT."""
    assert not _start_and_read_mask(["sleep", "30"])


def _run(code):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                          text=True, timeout=30)


def test_release_says_whether_ctrl_c_came_while_held():
    done = _run("import os, signal\nfrom fiberrl._runtime import interrupts\n"
                "interrupts.hold()\nprint(interrupts.release())\n"
                "interrupts.hold()\nos.kill(os.getpid(), signal.SIGINT)\n"
                "print(interrupts.release())\n")
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["True", "False"]
    assert "Traceback" not in done.stderr


def test_release_goes_on_where_sigint_is_ignored():
    done = _run("import os, signal\nfrom fiberrl._runtime import interrupts\n"
                "signal.signal(signal.SIGINT, signal.SIG_IGN)\ninterrupts.hold()\n"
                "os.kill(os.getpid(), signal.SIGINT)\nprint(interrupts.release())\n")
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["True"]


def test_held_restores_the_mask():
    with interrupts.held():
        assert signal.SIGINT in signal.pthread_sigmask(signal.SIG_BLOCK, [])
    assert signal.SIGINT not in signal.pthread_sigmask(signal.SIG_BLOCK, [])


def test_a_ctrl_c_while_start_creates_the_job_leaves_no_job_running(monkeypatch):
    """Ctrl-C in the window where the backend has launched the job but start() has not
    recorded it yet: start() raises KeyboardInterrupt and the job is stopped, instead
    of running on (it would connect, take its process and run) while the caller takes
    the process as never started."""
    import psutil
    from fiberrl import popen as fiberrl_popen
    real_launched = fiberrl_popen.Popen._launched
    launched = []

    def ctrl_c_then_record(self, job):
        launched.append(job)
        signal.raise_signal(signal.SIGINT)   # the Ctrl-C lands before the job is recorded
        real_launched(self, job)

    monkeypatch.setattr(fiberrl_popen.Popen, "_launched", ctrl_c_then_record)
    proc = fiberrl.Process(target=time.sleep, args=(60,))
    try:
        proc.start()
    except KeyboardInterrupt:
        pass
    else:
        raise AssertionError("start() swallowed the Ctrl-C")
    monkeypatch.undo()
    assert launched and launched[0].pid
    deadline = time.monotonic() + 10
    while psutil.pid_exists(launched[0].pid) and psutil.Process(launched[0].pid).status() != "zombie":
        assert time.monotonic() < deadline, "the job launched before the Ctrl-C still runs"
        time.sleep(0.05)
