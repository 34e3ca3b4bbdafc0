"""``fiberrl run / ps / logs / cancel`` as a person uses them: the real command line in
a subprocess, on the local backend, on Slurm, on Docker, and on the fake Kubernetes API."""
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from fiberrl.backends.base import RUN_ENV

import backend_bindings
import pool_helpers

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = """
import sys, time
import fiberrl

def square(x):
    return x * x

if __name__ == "__main__":
    with fiberrl.Pool(2) as pool:
        print("RESULT", pool.map(square, range(5)), flush=True)
    if len(sys.argv) > 1 and sys.argv[1] == "sleep":
        worker = fiberrl.Process(target=time.sleep, args=(120,), name="napper")
        worker.start()
        print("SLEEPING", flush=True)
        worker.join()
    sys.exit(int(sys.argv[1]) if len(sys.argv) > 1 and sys.argv[1].isdigit() else 0)
"""


def fiberrl_cli(*args, cwd, timeout=300, **popen):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("FIBERRL_LISTEN_HOST", None)  # a person's shell does not set it
    return subprocess.run([sys.executable, "-m", "fiberrl.cli", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=timeout, **popen)


@pytest.fixture
def project(tmp_path):
    (tmp_path / "job.py").write_text(SCRIPT)
    return tmp_path


def test_run_the_example_on_the_local_backend():
    done = fiberrl_cli("run", "examples/monte_carlo_pi.py", "--workers", "2", cwd=ROOT)
    assert done.returncode == 0, done.stderr
    assert "pi ~ 3.1" in done.stdout + done.stderr  # the example logs its result


def test_run_passes_arguments_and_the_exit_code(project):
    done = fiberrl_cli("run", "job.py", "3", cwd=project)
    assert done.returncode == 3, done.stderr
    assert "RESULT [0, 1, 4, 9, 16]" in done.stdout
    assert "exit code 3" in done.stderr


def _ps_until(backend, predicate, cwd, timeout=60):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        out = fiberrl_cli("ps", "--backend", backend, cwd=cwd).stdout
        if predicate(out):
            return out
        time.sleep(0.5)
    raise AssertionError(f"fiberrl ps never showed what was expected:\n{out}")


_LIVE_STATES = {"RUNNING", "PENDING", "running", "sleeping", "created"}


def _live_nappers(ps_output):
    """The ``fiberrl ps`` lines of the test script's sleeping process that are live."""
    return [line for line in ps_output.splitlines()
            if "napper" in line and _LIVE_STATES & set(line.split())]


@pytest.mark.parametrize("backend", ["local", "slurm", "docker"])
def test_ps_and_cancel_all_of_a_run(backend, project):
    if backend == "slurm":
        import slurm_cluster
        os.environ["SLURM_CONF"] = slurm_cluster.up("single")
    if backend == "docker":
        backend_bindings.docker_up()
    # a run id of its own: the clean-up below cancels this run's jobs, not those of
    # another test process (pytest-xdist) or of another user of the machine
    own_run = f"cli-test-{uuid.uuid4().hex[:8]}"
    runner = subprocess.Popen([sys.executable, "-m", "fiberrl.cli", "run", "--backend", backend,
                               "job.py", "sleep"], cwd=project, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True,
                              env={**os.environ, "PYTHONPATH": str(ROOT), RUN_ENV: own_run})
    try:
        # (finished jobs of earlier runs stay listed for a while: look for a live one)
        out = _ps_until(backend, lambda text: any(own_run in line for line in _live_nappers(text)),
                        project, timeout=180)
        run = [line for line in _live_nappers(out) if own_run in line][0].split()[2]
        assert run == own_run, out
        assert any(run in line and "napper" not in line for line in out.splitlines()[1:]), out
        cancelled = fiberrl_cli("cancel", "--backend", backend, "--all", "--run", run, cwd=project)
        assert cancelled.returncode == 0 and cancelled.stdout.count("cancelled") >= 2, cancelled
        code = runner.wait(60)
        stdout, stderr = runner.communicate()
        assert code != 0 and "SLEEPING" in stdout, stderr
        _ps_until(backend, lambda text: not any(
            run in line and ("RUNNING" in line or "running" in line or "sleeping" in line)
            for line in text.splitlines()), project)
    finally:
        if runner.poll() is None:
            runner.kill()
            runner.wait()
        fiberrl_cli("cancel", "--backend", backend, "--all", "--run", own_run, cwd=project)


def test_logs_of_a_slurm_job(project):
    import slurm_cluster
    os.environ["SLURM_CONF"] = slurm_cluster.up("single")
    done = fiberrl_cli("run", "--backend", "slurm", "job.py", cwd=project)
    assert done.returncode == 0, done.stderr
    job_id = done.stderr.split("slurm job ")[1].split()[0]
    logs = fiberrl_cli("logs", "--backend", "slurm", job_id, cwd=project)
    assert "RESULT [0, 1, 4, 9, 16]" in logs.stdout, logs


def test_run_on_docker_builds_an_image_of_the_directory(project):
    backend_bindings.docker_up()
    done = fiberrl_cli("run", "--backend", "docker", "job.py", "5", cwd=project, timeout=600)
    assert done.returncode == 5, done.stderr
    assert "RESULT [0, 1, 4, 9, 16]" in done.stdout
    assert pool_helpers.wait_until(lambda: not backend_bindings.fiberrl_containers(), 30)


OWNER_SCRIPT = """
import json, os, time
import fiberrl
from kubernetes import client, config

if __name__ == "__main__":
    child = fiberrl.Process(target=time.sleep, args=(30,))
    child.start()
    config.load_kube_config(config_file=json.loads(os.environ["FIBERRL_EXTRA"])["k8s_kubeconfig"])
    pod = client.CoreV1Api().read_namespaced_pod(child.job_id, "default")
    owner = pod.metadata.owner_references[0]
    print("OWNED BY MASTER", owner.kind == "Pod" and owner.name == os.environ["FIBERRL_POD_NAME"],
          flush=True)
    child.terminate()
    child.join(30)
"""


def test_run_on_kubernetes_makes_the_master_a_pod_that_owns_its_workers(project):
    """Against the FAKE API server: the master is a pod, its workers are pods it owns."""
    import json
    (project / "owner.py").write_text(OWNER_SCRIPT)
    cluster = backend_bindings.fake_kube()
    extra = {**backend_bindings.kube_settings(cluster), "k8s_working_dir": str(project)}
    env = {**os.environ, "PYTHONPATH": str(ROOT), "FIBERRL_EXTRA": json.dumps(extra)}
    env.pop("FIBERRL_LISTEN_HOST", None)

    def run(*args):
        return subprocess.run([sys.executable, "-m", "fiberrl.cli", "run", "--backend",
                               "kubernetes", "--no-build", "--image", "fiberrl-worker:cpu", *args],
                              cwd=project, env=env, capture_output=True, text=True, timeout=300)

    done = run("job.py", "4")
    assert done.returncode == 4, done.stderr
    assert "RESULT [0, 1, 4, 9, 16]" in done.stdout
    assert "runs as kubernetes job fiberrl-main-job-py-" in done.stderr
    owned = run("owner.py")
    assert owned.returncode == 0, owned.stderr
    assert "OWNED BY MASTER True" in owned.stdout, owned.stdout + owned.stderr
    backend_bindings.assert_no_pods(cluster)
