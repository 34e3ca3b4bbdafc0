"""How a test body is bound to each backend: start what the backend needs (once per
session), configure fiberrl for it, and check afterwards that no job outlived the test.

- local: nothing to do;
- slurm: the real one-node cluster of ``scripts/slurm-up.sh``;
- docker: the real dockerd and worker image of ``scripts/docker-up.sh``; the
  containers see the project directory mounted at the same path;
- kubernetes: the real ``kubernetes`` client against the in-repo FAKE API server
  (``tests/fake_kube.py``), whose fake kubelet runs each pod as a local process. No
  real Kubernetes cluster is involved.
"""
import contextlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

import fiberrl
import side_by_side
from pool_helpers import wait_until

ROOT = Path(__file__).resolve().parent.parent
_session = {}


def enabled(name: str) -> bool:
    """False when ``FIBERRL_TEST_<NAME>=0`` turns a backend's tests off."""
    return os.environ.get(f"FIBERRL_TEST_{name.upper()}", "1") != "0"


def still_there(live, grace: float) -> list:
    """What ``live()`` still lists after waiting up to ``grace`` s for it to be empty."""
    wait_until(lambda: not live(), grace, interval=0.2)
    return live()


# -- docker -----------------------------------------------------------------------------
def docker_up() -> None:
    """dockerd and the worker image, once per session (``scripts/docker-up.sh``)."""
    if not enabled("docker"):
        pytest.skip("Docker tests turned off (FIBERRL_TEST_DOCKER=0)")
    side_by_side.require(side_by_side.CLUSTERS, "dockerd")
    if "docker" in _session:
        return
    # a dockerd that already answers was started by someone else: leave it up at the end
    answering = subprocess.run(["docker", "info"], capture_output=True, timeout=60).returncode == 0
    done = subprocess.run(["bash", str(ROOT / "scripts" / "docker-up.sh")], capture_output=True,
                          text=True, timeout=1200)
    if done.returncode != 0:
        pytest.fail(f"scripts/docker-up.sh failed:\n{done.stderr[-4000:]}")
    _session["docker"] = "keep" if answering else "stop"


def docker_down() -> None:
    if _session.pop("docker", None) == "stop":
        subprocess.run(["bash", str(ROOT / "scripts" / "docker-down.sh")], capture_output=True,
                       timeout=300)


def docker_volumes(tmp_dir: Path) -> dict:
    """Mounts that make a container see what a local job would: the test's files
    (``tmp_dir``'s parent, read-write), and this interpreter's environment (read-only)
    when it lies outside the project directory (a git worktree's tests use the main
    checkout's ``.venv``), since a job's ``sys.path`` is its parent's."""
    shared = str(tmp_dir.parent)
    volumes = {shared: {"bind": shared, "mode": "rw"}}
    prefix = os.path.realpath(sys.prefix)
    if not prefix.startswith(str(ROOT) + os.sep) and prefix != os.path.realpath(sys.base_prefix):
        volumes[prefix] = {"bind": prefix, "mode": "ro"}
    return volumes


def fiberrl_containers() -> list:
    """Names of the containers fiberrl started that still exist."""
    out = subprocess.run(["docker", "ps", "-a", "--filter", "label=fiberrl.run", "--format",
                          "{{.Names}} {{.Status}}"], capture_output=True, text=True, timeout=60)
    return out.stdout.splitlines()


def assert_no_containers(grace: float = 15.0) -> None:
    """Fail (after removing them) if fiberrl containers still exist ``grace`` s on."""
    left = still_there(fiberrl_containers, grace)
    if left:
        subprocess.run(["docker", "rm", "-f", *[line.split()[0] for line in left]],
                       capture_output=True, timeout=60)
        pytest.fail(f"containers outlived the test: {left}")


# -- kubernetes (fake API server) -----------------------------------------------------------
def fake_kube():
    """The session's fake Kubernetes API server (started on first use)."""
    if not enabled("kubernetes"):
        pytest.skip("Kubernetes tests turned off (FIBERRL_TEST_KUBERNETES=0)")
    side_by_side.require(side_by_side.KUBERNETES, "the session's fake Kubernetes API server")
    if "kube" not in _session:
        from fake_kube import FakeKubeCluster
        cluster = FakeKubeCluster(node_cpu=16, node_memory="16Gi")
        cluster.start()
        _session["kube"] = cluster
    return _session["kube"]


def kube_down() -> None:
    cluster = _session.pop("kube", None)
    if cluster is not None:
        cluster.stop()


def live_pods(cluster) -> list:
    """Pods of the fake cluster that are pending or running."""
    from kubernetes import client
    api = client.CoreV1Api(cluster.api_client())
    return [f"{p.metadata.name} {p.status.phase}" for p in
            api.list_namespaced_pod("default").items if p.status.phase in ("Pending", "Running")]


def assert_no_pods(cluster, grace: float = 15.0) -> None:
    """Fail if pods of the fake cluster are still pending or running ``grace`` s on."""
    left = still_there(lambda: live_pods(cluster), grace)
    if left:
        pytest.fail(f"pods outlived the test: {left}")


def kube_settings(cluster) -> dict:
    """fiberrl's settings for the fake cluster: its kubeconfig, and this interpreter as
    the pods' Python (the fake kubelet runs pods as local processes)."""
    return {"k8s_kubeconfig": cluster.kubeconfig_path, "k8s_python": sys.executable,
            "k8s_namespace": "default"}


# -- the binding -------------------------------------------------------------------------------
@contextlib.contextmanager
def bound(name: str, tmp_dir: Path):
    """fiberrl configured for backend ``name`` inside the block (yields the fake cluster
    for ``kubernetes``, else None); afterwards the defaults come back and the test fails
    if a job, container or pod outlived it."""
    handle, check = None, None
    if name == "slurm":
        import slurm_cluster
        conf = slurm_cluster.up("single")
        os.environ["SLURM_CONF"] = conf
        fiberrl.init(backend="slurm", extra={"slurm_log_dir": str(tmp_dir)})
        check = lambda: slurm_cluster.assert_no_live_jobs(conf)  # noqa: E731
    elif name == "docker":
        docker_up()
        fiberrl.init(backend="docker", extra={"docker_volumes": docker_volumes(tmp_dir)})
        check = assert_no_containers
    elif name == "kubernetes":
        handle = fake_kube()
        fiberrl.init(backend="kubernetes", extra=kube_settings(handle))
        check = lambda: assert_no_pods(handle)  # noqa: E731
    else:
        raise ValueError(f"no binding for backend {name!r}")
    try:
        yield handle
    finally:
        fiberrl.config.reset()
        check()
