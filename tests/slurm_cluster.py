"""The real Slurm test clusters (scripts/slurm-up.sh) as pytest fixtures' helpers.

A cluster is brought up once per test session when the first test needs it and
brought down at the end if this session started it. ``FIBERRL_TEST_SLURM=0`` skips
the Slurm tests (for a machine where Slurm cannot be installed); otherwise a cluster
that does not come up is an error, not a skip.
"""
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

import side_by_side

ROOT = Path(__file__).resolve().parent.parent
_started = {}


def enabled() -> bool:
    """False when the person running the tests turned the Slurm tests off."""
    return os.environ.get("FIBERRL_TEST_SLURM", "1") != "0"


def conf_path(topology: str) -> str:
    base = os.environ.get("FIBERRL_SLURM_DIR", "/var/tmp/fiberrl-slurm")
    return os.path.join(base, topology, "slurm.conf")


def _running(topology: str) -> bool:
    conf = conf_path(topology)
    if not os.path.exists(conf):
        return False
    env = {**os.environ, "SLURM_CONF": conf}
    done = subprocess.run(["sinfo", "-h", "-o", "%t"], env=env, capture_output=True, text=True,
                          timeout=30)
    states = done.stdout.split()  # a trailing "*" means the node does not respond
    return done.returncode == 0 and states != [] and all(
        state in ("idle", "mix", "alloc") for state in states)


def up(topology: str) -> str:
    """Bring ``topology`` up (once per session); return its SLURM_CONF path."""
    if not enabled():
        pytest.skip("Slurm tests turned off (FIBERRL_TEST_SLURM=0)")
    side_by_side.require(side_by_side.CLUSTERS, "the Slurm test cluster")
    if topology in _started:
        if not _running(topology):  # a test stopped a daemon: start it again
            _run("slurm-up.sh", topology)
        return _started[topology]
    already = _running(topology)
    _run("slurm-up.sh", topology)
    _started[topology] = conf_path(topology)
    if already:
        _started.setdefault("_kept", set()).add(topology)
    return _started[topology]


def _run(script: str, topology: str) -> None:
    done = subprocess.run(["bash", str(ROOT / "scripts" / script), topology],
                          capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        pytest.fail(f"scripts/{script} {topology} failed:\n{done.stderr[-4000:]}")


def down_all() -> None:
    """Stop the clusters this session started (not those that were already up)."""
    kept = _started.pop("_kept", set())
    for topology in list(_started):
        if topology not in kept:
            _run("slurm-down.sh", topology)
        _started.pop(topology)


def squeue(conf: str, *args: str) -> str:
    """``squeue`` against the cluster of ``conf``."""
    return subprocess.run(["squeue", "-h", *args], env={**os.environ, "SLURM_CONF": conf},
                          capture_output=True, text=True, timeout=30, check=True).stdout


def live_jobs(conf: str) -> list:
    """Ids of the cluster's jobs that are pending, running or ending."""
    return squeue(conf, "-t", "PD,CF,R,CG,S", "-o", "%i").split()


def assert_no_live_jobs(conf: str, grace: float = 15.0) -> None:
    """Fail (after cancelling them) if jobs are still alive ``grace`` seconds on."""
    from backend_bindings import still_there
    jobs = still_there(lambda: live_jobs(conf), grace)
    if jobs:
        described = squeue(conf, "-t", "PD,CF,R,CG,S", "-o", "%i %j %T %r")
        subprocess.run(["scancel", *jobs], env={**os.environ, "SLURM_CONF": conf}, timeout=30)
        pytest.fail(f"Slurm jobs outlived the test:\n{described}")


#: seconds a master program on the cluster may run: under pytest's 300 s per test, with
#: room for the check of leftover jobs after it
MASTER_TIMEOUT = 240.0


def run_master(command: list, env: dict, cwd: str = None, timeout: float = MASTER_TIMEOUT,
               dumps_on_sigusr1: bool = False) -> subprocess.CompletedProcess:
    """Run a master program to its end; if it is still running after ``timeout`` s,
    fail with what it printed and the stack of every thread (faulthandler, on SIGABRT)
    rather than leave pytest to kill the test with no word from the program. A master
    that ``dumps_on_sigusr1`` is sent SIGUSR1 first, to print its own state."""
    proc = subprocess.Popen(command, env={**env, "PYTHONFAULTHANDLER": "1"}, cwd=cwd,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        if dumps_on_sigusr1:   # it says what it waits on
            proc.send_signal(signal.SIGUSR1)
            time.sleep(2)
        proc.send_signal(signal.SIGABRT)
        try:
            out, err = proc.communicate(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
        pytest.fail(f"the master program was still running after {timeout:.0f} s; its "
                    f"output:\n{out[-3000:]}\n{err[-12000:]}")
    return subprocess.CompletedProcess(command, proc.returncode, out, err)
