"""``concurrent.futures.ProcessPoolExecutor(mp_context=fiberrl.get_context())``: its
workers are fiberrl jobs; results, exceptions, shutdown, and a killed worker."""
import os
import signal
import subprocess
import sys
import textwrap
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool

import pytest

import fiberrl


def _square(x):
    return x * x


def _fail(message):
    raise ValueError(message)


def _die():
    os.kill(os.getpid(), signal.SIGKILL)


def _pid():
    return os.getpid()


def test_map_submit_and_shutdown():
    with ProcessPoolExecutor(2, mp_context=fiberrl.get_context()) as executor:
        assert list(executor.map(_square, range(20), chunksize=3)) == [x * x for x in range(20)]
        assert executor.submit(_square, 7).result(timeout=60) == 49
        pids = {executor.submit(_pid).result(timeout=60) for _ in range(6)}
        assert os.getpid() not in pids
    with pytest.raises(RuntimeError):
        executor.submit(_square, 1)


def test_exception_travels_back():
    with ProcessPoolExecutor(1, mp_context=fiberrl.get_context()) as executor:
        future = executor.submit(_fail, "bad input")
        with pytest.raises(ValueError, match="bad input"):
            future.result(timeout=60)


def test_killed_worker_breaks_the_pool():
    executor = ProcessPoolExecutor(2, mp_context=fiberrl.get_context())
    try:
        assert executor.submit(_square, 3).result(timeout=60) == 9
        with pytest.raises(BrokenProcessPool):
            executor.submit(_die).result(timeout=60)
        with pytest.raises(BrokenProcessPool):
            executor.submit(_square, 2)
    finally:
        executor.shutdown(wait=True)


def test_functions_of_the_main_script(tmp_path):
    """The stdlib's queue pickles a task's function by reference: a function of the
    parent's ``__main__`` script must still be found in the job."""
    script = tmp_path / "main_script.py"
    script.write_text(textwrap.dedent("""
        import fiberrl
        from concurrent.futures import ProcessPoolExecutor

        def triple(x):
            return 3 * x

        if __name__ == "__main__":
            with ProcessPoolExecutor(2, mp_context=fiberrl.get_context()) as executor:
                print(list(executor.map(triple, range(5))))
    """))
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          timeout=120, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == "[0, 3, 6, 9, 12]"


def test_globals_an_initializer_of_the_main_script_sets_are_seen_by_its_tasks(tmp_path):
    """The usual pattern: ``initializer`` loads something into a global of the main
    script and the tasks use it. Functions of ``__main__`` travel by value; each used
    to get globals of its own, so the tasks saw the parent's ``None``. A task's own
    ``global`` assignment is kept by its worker too, as in the stdlib."""
    script = tmp_path / "initializer_script.py"
    script.write_text(textwrap.dedent("""
        import fiberrl
        from concurrent.futures import ProcessPoolExecutor

        MODEL = None
        CALLS = 0

        def load(value):
            global MODEL
            MODEL = value

        def predict(x):
            global CALLS
            CALLS += 1
            return MODEL, x, CALLS

        if __name__ == "__main__":
            with ProcessPoolExecutor(1, mp_context=fiberrl.get_context(), initializer=load,
                                     initargs=("weights",)) as executor:
                print(list(executor.map(predict, range(3))))
            worker = fiberrl.Process(target=load, args=("in a process",))
            worker.start()
            worker.join(60)
            print(worker.exitcode, MODEL, CALLS)   # the parent's own globals are untouched
    """))
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          timeout=120, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.splitlines() == [
        "[('weights', 0, 1), ('weights', 1, 2), ('weights', 2, 3)]", "0 None 0"]


@pytest.mark.slow
@pytest.mark.parametrize("backend", [pytest.param("slurm", marks=pytest.mark.slurm),
                                     "docker", "kubernetes"])
def test_on_a_cluster_backend_workers_are_jobs_and_a_crash_breaks_the_pool(tmp_path, backend):
    """On a backend whose jobs may run on other hosts, the executor's call queue (an OS
    pipe of the stdlib's ``Queue``) reaches its workers through fiberrl's relay, and
    each worker has a pid of its own (the executor keys them by pid, and a worker
    reports ``os.getpid()``): on Docker the run's jobs share one PID namespace; on
    Kubernetes pods ask for their node's (``k8s_host_pid``), which the fake, whose
    pods are local processes, has anyway."""
    import backend_bindings
    with backend_bindings.bound(backend, tmp_path):
        if backend == "kubernetes":
            fiberrl.init(extra=dict(fiberrl.config.get_config().extra, k8s_host_pid=True))
        with ProcessPoolExecutor(2, mp_context=fiberrl.get_context()) as executor:
            assert list(executor.map(_square, range(12), chunksize=5)) == [x * x for x in range(12)]
            assert executor.submit(_square, 9).result(timeout=120) == 81
            procs = list(executor._processes.values())
            assert len(procs) == 2 and len({p.pid for p in procs}) == 2, \
                [(p.job_id, p.pid) for p in procs]
        with pytest.raises(ValueError, match="bad input"):
            with ProcessPoolExecutor(1, mp_context=fiberrl.get_context()) as executor:
                executor.submit(_fail, "bad input").result(timeout=120)
        executor = ProcessPoolExecutor(2, mp_context=fiberrl.get_context())
        try:
            assert executor.submit(_square, 3).result(timeout=120) == 9
            with pytest.raises(BrokenProcessPool):
                executor.submit(_die).result(timeout=120)
        finally:
            executor.shutdown(wait=True)
