"""The spare interpreter ``Pool()`` starts for a fresh program's first worker
(:mod:`fiberrl._runtime.spare`): it becomes that worker with the worker's own
environment, it is listed by ``fiberrl ps``, and one that is not taken exits."""
import json
import os
import subprocess
import sys
import textwrap
import time

import psutil
import pytest

from fiberrl._runtime import spare

SPARE_MARK = spare.SPARE_ENV.encode() + b"="


def _run(script: str, tmp_path, timeout: float = 120, options=()) -> subprocess.CompletedProcess:
    path = tmp_path / "main.py"
    path.write_text(textwrap.dedent(script))
    return subprocess.run([sys.executable, *options, str(path)], capture_output=True,
                          text=True, timeout=timeout, cwd=tmp_path)


def _started_as_spare(pid: int) -> bool:
    """Whether process ``pid`` was started as a spare (its start-up environment says so)."""
    with open(f"/proc/{pid}/environ", "rb") as fh:
        return any(entry.startswith(SPARE_MARK) for entry in fh.read().split(b"\0"))


def _live_spares():
    found = []
    for child in psutil.Process().children(recursive=True):
        try:
            if child.status() != psutil.STATUS_ZOMBIE and _started_as_spare(child.pid):
                found.append(child)
        except (psutil.Error, OSError):
            pass
    return found


def _wait_ended(popen: subprocess.Popen, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while popen.poll() is None:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def test_a_fresh_programs_first_pool_worker_is_the_spare_with_its_own_environment(tmp_path):
    result = _run("""
        import json, os, time
        import multiprocessing
        import fiberrl

        def describe(_):
            time.sleep(0.02)
            return (os.getpid(), multiprocessing.current_process().name, os.getcwd(),
                    sorted(k for k in os.environ if k.startswith("FIBERRL_")),
                    fiberrl.config.get_config().extra.get("probe"))

        if __name__ == "__main__":
            os.environ["FIBERRL_TEST_MARK"] = "set before Pool()"
            fiberrl.init(extra={"probe": 42})   # the job's configuration, not the spare's
            with fiberrl.Pool(2) as pool:
                rows = pool.map(describe, range(40), chunksize=1)
                spares = []
                for pid, name, cwd, env, probe in {r[0]: r for r in rows}.values():
                    with open(f"/proc/{pid}/environ", "rb") as fh:
                        if any(e.startswith(b"FIBERRL_SPARE=") for e in fh.read().split(b"\\0")):
                            spares.append([pid, name, cwd, env, probe])
                from fiberrl.backends.local import LocalBackend
                listed = {j.id: [j.name, j.run] for j in LocalBackend().list_jobs()}
                report = {"spares": spares, "listed": listed,
                          "run": os.environ["FIBERRL_RUN_ID"]}
            from fiberrl.backends.local.forkserver import read_table
            report["recorded_after"] = [read_table(pid) for pid, *_ in spares]
            print(json.dumps(report))
    """, tmp_path)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout.splitlines()[-1])
    assert len(report["spares"]) == 1, report   # the first worker, and only it
    pid, name, cwd, env, probe = report["spares"][0]
    assert cwd == str(tmp_path) and probe == 42
    assert "FIBERRL_SPARE" not in env            # the job's environment, not the spare's
    assert "FIBERRL_TEST_MARK" in env and "FIBERRL_JOB_NAME" in env
    assert report["listed"][f"local-{pid}"] == [name, report["run"]]   # fiberrl ps
    assert report["recorded_after"] == [None]   # its line went with the pool


def test_a_spare_not_taken_because_pool_failed_exits_at_once(tmp_path):
    result = _run("""
        import time
        import psutil
        import fiberrl

        if __name__ == "__main__":
            started = time.monotonic()
            try:
                fiberrl.Pool(0)
            except ValueError as exc:
                print("refused:", exc)
            spares = []
            for child in psutil.Process().children():
                with open(f"/proc/{child.pid}/environ", "rb") as fh:
                    if b"FIBERRL_SPARE=" in fh.read():
                        spares.append(child)
            assert spares, "no spare was started"
            gone, alive = psutil.wait_procs(spares, timeout=5)
            print("alive after", round(time.monotonic() - started, 1), "s:", len(alive))
            print("exit codes:", sorted(p.returncode for p in gone))
    """, tmp_path, options=("-X", "dev"))   # dev mode shows a subprocess dropped unreaped
    assert result.returncode == 0, result.stderr
    assert "refused:" in result.stdout
    assert "s: 0" in result.stdout and "exit codes: [0]" in result.stdout, result.stdout
    assert result.stderr == ""


def test_a_process_whose_jobs_are_forked_drops_its_spare(tmp_path):
    result = _run("""
        import json, time
        import psutil
        import fiberrl

        def nothing(x=None):
            return x

        if __name__ == "__main__":
            for _ in range(2):   # the first job is exec'd, the second starts the fork server
                proc = fiberrl.Process(target=nothing)
                proc.start()
                proc.join()
            with fiberrl.Pool(2) as pool:
                assert pool.map(nothing, range(10)) == list(range(10))
                time.sleep(0.5)
                spares = []
                for child in psutil.Process().children(recursive=True):
                    try:
                        if (child.status() != psutil.STATUS_ZOMBIE and b"FIBERRL_SPARE="
                                in open(f"/proc/{child.pid}/environ", "rb").read()):
                            spares.append(child.pid)
                    except (psutil.Error, OSError):
                        pass
                print(json.dumps(spares))
    """, tmp_path)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout.splitlines()[-1]) == []


@pytest.fixture
def own_spare():
    """This process's spare, started for the test (a process starts one only once)."""
    spare.discard()
    spare._started_in.discard(os.getpid())
    spare.prestart(sys.executable)
    try:
        yield spare._spares[os.getpid()].popen
    finally:
        spare.discard()


def test_a_spare_that_does_not_fit_the_job_is_discarded(own_spare):
    env = dict(os.environ, PYTHONHASHSEED="12345")   # read only when python starts
    assert spare.take(sys.executable, env, os.getcwd()) is None
    assert _wait_ended(own_spare, 10) and own_spare.returncode == 0
    assert spare.take(sys.executable, dict(os.environ), os.getcwd()) is None   # used up


def test_a_spare_is_not_given_a_job_that_inherits_descriptors(own_spare):
    read_end, write_end = os.pipe()
    try:
        assert spare.take(sys.executable, dict(os.environ), os.getcwd(), (read_end,)) is None
        assert _wait_ended(own_spare, 10)
    finally:
        os.close(read_end)
        os.close(write_end)


def test_a_forked_child_of_the_parent_does_not_keep_a_discarded_spare_waiting(own_spare):
    child = os.fork()
    if child == 0:   # holds whatever descriptors it inherited for 20 s
        time.sleep(20)
        os._exit(0)
    try:
        spare.discard()
        assert _wait_ended(own_spare, 10), \
            "the spare waited for the forked child's copy of its pipe"
        assert own_spare.returncode == 0
    finally:
        os.kill(child, 9)
        os.waitpid(child, 0)
    assert not _live_spares()


def test_a_spare_that_died_before_its_job_is_passed_over(own_spare):
    own_spare.kill()
    own_spare.wait(10)
    assert spare.take(sys.executable, dict(os.environ), os.getcwd()) is None


def test_no_spare_is_started_for_a_backend_configured_before_pool(tmp_path):
    result = _run("""
        import psutil
        import fiberrl

        if __name__ == "__main__":
            fiberrl.init(backend="kubernetes")   # no API server: Pool() fails, later
            try:
                fiberrl.Pool(1)
            except Exception as exc:
                print("pool:", type(exc).__name__)
            print("children:", len(psutil.Process().children()))
    """, tmp_path)
    assert "children: 0" in result.stdout, (result.stdout, result.stderr)


def test_a_spare_that_cannot_start_is_no_error():
    spare.discard()
    spare._started_in.discard(os.getpid())
    try:
        spare.prestart(None)   # sys.executable where Python cannot tell its own path
        assert os.getpid() not in spare._spares
        spare._started_in.discard(os.getpid())
        spare.prestart("")     # or an empty one
        assert os.getpid() not in spare._spares
    finally:
        spare._started_in.discard(os.getpid())
