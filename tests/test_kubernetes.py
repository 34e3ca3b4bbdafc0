"""The Kubernetes backend: golden tests of its Pod manifests and status mapping, and its
behaviour through the real ``kubernetes`` client against the in-repo FAKE API server
(``tests/fake_kube.py``: a fake core/v1 API whose fake kubelet runs pods as local
processes). No real cluster is involved; ``test_real_cluster_*`` runs only when
``FIBERRL_TEST_KUBECONFIG`` names a reachable cluster's kubeconfig.
"""
import os
import shutil
import time

import pytest

import fiberrl
import backend_bindings
import pool_helpers
from fiberrl.backends.base import JobSpec, JobState
from fiberrl.backends.kubernetes.pods import pod_manifest, pod_status

SPEC = JobSpec(command=["/venv/bin/python", "-m", "fiberrl.spawn"], name="Pool-1-worker-2",
               env={"FIBERRL_HUB": "tcp://10.0.0.5:20001", "FIBERRL_SECRET": "ab" * 32,
                    "FIBERRL_TOKEN": "t0k"}, cpu=1.5, mem=(2 << 30) + 1, gpu=1)


def _manifest(**overrides):
    options = dict(name="fiberrl-pool-1-worker-2-abcd1234", image="reg/fiberrl-worker:cpu",
                   namespace="rl", run="vm-42-beef", user="alice", secret_name="fiberrl-vm-42-beef",
                   secret_env="FIBERRL_SECRET")
    options.update(overrides)
    return pod_manifest(SPEC, **options)


def test_pod_manifest_golden():
    manifest = _manifest(owner={"name": "master-pod", "uid": "u-1"}, service_account="fiberrl",
                         volumes=[{"pvc": "data", "mount_path": "/data", "read_only": True},
                                  {"empty_dir": True, "mount_path": "/scratch", "name": "tmp"}])
    container = manifest["spec"]["containers"][0]
    assert manifest["metadata"] == {
        "name": "fiberrl-pool-1-worker-2-abcd1234", "namespace": "rl",
        "labels": {"app": "fiberrl", "fiberrl/run": "vm-42-beef", "fiberrl/user": "alice"},
        "annotations": {"fiberrl/name": "Pool-1-worker-2"},
        "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": "master-pod",
                             "uid": "u-1", "blockOwnerDeletion": True}]}
    assert manifest["spec"]["restartPolicy"] == "Never"
    assert manifest["spec"]["serviceAccountName"] == "fiberrl"
    assert manifest["spec"]["volumes"] == [
        {"name": "vol-0", "persistentVolumeClaim": {"claimName": "data", "readOnly": True}},
        {"name": "tmp", "emptyDir": {}}]
    assert container["volumeMounts"] == [
        {"name": "vol-0", "mountPath": "/data", "readOnly": True},
        {"name": "tmp", "mountPath": "/scratch", "readOnly": False}]
    assert container["command"] == ["python3", "-m", "fiberrl.spawn"]
    assert container["resources"] == {
        "requests": {"cpu": "1500m", "memory": "2049Mi", "nvidia.com/gpu": "1"},
        "limits": {"cpu": "1500m", "memory": "2049Mi", "nvidia.com/gpu": "1"}}
    env = {e["name"]: e for e in container["env"]}
    assert env["FIBERRL_SECRET"] == {"name": "FIBERRL_SECRET", "valueFrom": {"secretKeyRef": {
        "name": "fiberrl-vm-42-beef", "key": "secret"}}}
    assert env["FIBERRL_POD_IP"]["valueFrom"] == {"fieldRef": {"fieldPath": "status.podIP"}}
    assert env["FIBERRL_TOKEN"] == {"name": "FIBERRL_TOKEN", "value": "t0k"}


def test_the_secret_is_nowhere_in_the_pod_spec():
    assert "ab" * 32 not in repr(_manifest())


@pytest.mark.parametrize("pod,state,code,reason", [
    ({"status": {"phase": "Pending"}}, JobState.PENDING, None, ""),
    ({"status": {"phase": "Pending", "conditions": [{"type": "PodScheduled", "status": "False",
      "reason": "Unschedulable", "message": "0/1 nodes are available: Insufficient cpu."}]}},
     JobState.PENDING, None, "Unschedulable: 0/1 nodes are available: Insufficient cpu."),
    ({"status": {"phase": "Pending", "containerStatuses": [{"state": {"waiting": {
        "reason": "ImagePullBackOff", "message": "Back-off pulling image"}}}]}},
     JobState.FAILED, 1, "ImagePullBackOff: Back-off pulling image"),
    ({"status": {"phase": "Running"}}, JobState.RUNNING, None, ""),
    ({"status": {"phase": "Succeeded", "containerStatuses": [{"state": {"terminated": {
        "exitCode": 0, "reason": "Completed"}}}]}}, JobState.SUCCEEDED, 0, ""),
    ({"status": {"phase": "Failed", "containerStatuses": [{"state": {"terminated": {
        "exitCode": 3, "reason": "Error"}}}]}}, JobState.FAILED, 3, "exit code 3"),
    ({"status": {"phase": "Failed", "containerStatuses": [{"state": {"terminated": {
        "exitCode": 137, "reason": "OOMKilled"}}}]}}, JobState.FAILED, -9, "OOMKilled"),
    ({"status": {"phase": "Failed", "containerStatuses": [{"state": {"terminated": {
        "exitCode": 139, "reason": "Error"}}}]}}, JobState.FAILED, -11, "SIGSEGV"),
    ({"status": {"phase": "Failed", "reason": "Evicted", "message": "low on memory"}},
     JobState.FAILED, -9, "Evicted: low on memory"),
])
def test_pod_status_reasons(pod, state, code, reason):
    status = pod_status(pod)
    assert (status.state, status.exit_code) == (state, code)
    assert reason in status.reason


def test_host_pid_is_asked_for_only_by_the_setting():
    assert "hostPID" not in _manifest()["spec"]
    assert _manifest(host_pid=True)["spec"]["hostPID"] is True
    with pytest.raises(fiberrl.errors.ConfigError, match="k8s_host_pid"):
        fiberrl.init(backend="kubernetes", extra={"k8s_host_pid": "yes"})


# -- through the real client against the fake API server ------------------------------------
@pytest.fixture
def kube(tmp_path):
    """fiberrl on the fake cluster for this test; no pod outlives it."""
    with backend_bindings.bound("kubernetes", tmp_path) as cluster:
        yield cluster


def _pods(cluster):
    from kubernetes import client
    return client.CoreV1Api(cluster.api_client()).list_namespaced_pod("default").items


def _hold_memory(megabytes):
    block = bytearray(megabytes << 20)
    for i in range(0, len(block), 4096):
        block[i] = 1
    time.sleep(120)


def _sleep(seconds):
    time.sleep(seconds)


def test_pods_carry_the_secret_by_reference_and_are_deleted_when_done(kube):
    proc = fiberrl.Process(target=_sleep, args=(2,), name="sleeper")
    proc.start()
    assert pool_helpers.wait_until(lambda: proc.pid is not None, 60)
    pod, = [p for p in _pods(kube) if p.metadata.annotations.get("fiberrl/name") == "sleeper"]
    env = {e.name: e for e in pod.spec.containers[0].env}
    assert env["FIBERRL_SECRET"].value is None
    assert env["FIBERRL_SECRET"].value_from.secret_key_ref.key == "secret"
    assert pod.spec.restart_policy == "Never"
    proc.join(60)
    assert proc.exitcode == 0
    assert pool_helpers.wait_until(lambda: not any(
        p.metadata.name == pod.metadata.name for p in _pods(kube)), 10)


def test_oomkilled_pod(kube):
    proc = fiberrl.Process(target=_hold_memory, args=(300,), mem="100M")
    proc.start()
    proc.join(60)
    assert proc.exitcode == -9
    assert proc.exit_reason.startswith("OOMKilled")


def test_evicted_pod(kube):
    proc = fiberrl.Process(target=_sleep, args=(60,))
    proc.start()
    assert pool_helpers.wait_until(lambda: proc.pid is not None, 60)
    kube.evict("default", proc.job_id, message="The node was low on resource: memory.")
    proc.join(30)
    assert proc.exitcode == -9 and "Evicted: The node was low" in proc.exit_reason


def test_image_that_cannot_be_pulled_fails_with_the_reason(kube):
    fiberrl.init(backend="kubernetes", image="registry.example/does-not-exist:1",
                 extra=backend_bindings.kube_settings(kube))
    proc = fiberrl.Process(target=_sleep, args=(1,))
    proc.start()
    proc.join(30)
    assert proc.exitcode == 1 and "ImagePull" in proc.exit_reason


def test_unschedulable_pod_fails_after_the_grace(kube):
    fiberrl.init(backend="kubernetes", extra={**backend_bindings.kube_settings(kube),
                                              "k8s_unschedulable_grace": 2})
    proc = fiberrl.Process(target=_sleep, args=(1,), cpu=64)
    proc.start()
    proc.join(30)
    assert proc.exitcode == 1 and "Unschedulable" in proc.exit_reason
    assert "Insufficient cpu" in proc.exit_reason


def test_deleting_a_busy_workers_pod_mid_map_loses_nothing(kube, make_pool):
    from kubernetes import client
    pool = make_pool(3)
    result = pool.map_async(pool_helpers.sleep_then_square, [(0.2, i) for i in range(30)], 1)
    assert pool_helpers.wait_until(lambda: pool.stats().pending == 3, 60), pool.stats()
    client.CoreV1Api(kube.api_client()).delete_namespaced_pod(
        pool.workers()[0].job_id, "default", grace_period_seconds=0)
    assert result.get(timeout=120) == [i * i for i in range(30)]
    assert pool.stats().worker_deaths >= 1


@pytest.mark.skipif(not os.environ.get("FIBERRL_TEST_KUBECONFIG"),
                    reason="needs a real cluster: set FIBERRL_TEST_KUBECONFIG (and an image "
                           "it can pull in FIBERRL_TEST_IMAGE)")
def test_real_cluster_pool_map():
    fiberrl.init(backend="kubernetes", image=os.environ.get("FIBERRL_TEST_IMAGE"),
                 extra={"k8s_kubeconfig": os.environ["FIBERRL_TEST_KUBECONFIG"]})
    try:
        with fiberrl.Pool(2) as pool:
            assert pool.map(abs, range(-5, 0)) == [5, 4, 3, 2, 1]
    finally:
        fiberrl.config.reset()



@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("unshare"),
                    reason="the fake's per-pod PID namespaces need root and unshare")
def test_pids_on_nodes_that_give_each_pod_its_own_pid_namespace(tmp_path):
    """As on a real node: without ``k8s_host_pid`` every job is pid 1 of its pod, so
    ``concurrent.futures`` could not tell two workers apart; with it pids differ, and
    each is the job's ``os.getpid()``."""
    from fake_kube import FakeKubeCluster
    cluster = FakeKubeCluster(node_cpu=16, node_memory="16Gi", pid_namespaces=True).start()
    try:
        for host_pid in (False, True):
            fiberrl.init(backend="kubernetes", extra=dict(
                backend_bindings.kube_settings(cluster), k8s_host_pid=host_pid))
            pids, seen = pool_helpers.live_pids(2)
            assert pids == seen, (host_pid, pids, seen)
            assert pids == ([1, 1] if not host_pid else sorted(set(pids))), (host_pid, pids)
    finally:
        fiberrl.config.reset()
        try:
            backend_bindings.assert_no_pods(cluster)
        finally:
            cluster.stop()
