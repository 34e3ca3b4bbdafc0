"""Tests of tests/fake_kube.py (an in-repo fake of the Kubernetes core/v1 API; NOT a real
cluster), driven only through the official ``kubernetes`` client: CoreV1Api, VersionApi,
Watch and load_kube_config, the calls a Kubernetes backend makes."""
import base64
import json
import os
import sys
import time

import psutil
import pytest

kubernetes = pytest.importorskip("kubernetes", reason="needs the kubernetes client (extra)")
from kubernetes import client, config, watch  # noqa: E402
from kubernetes.client.exceptions import ApiException  # noqa: E402

from fake_kube import FakeKubeCluster  # noqa: E402

NS = "default"
PY = sys.executable
SLEEP = "import time; time.sleep(60)"


@pytest.fixture
def cluster():
    with FakeKubeCluster(node_cpu=4, node_memory="8Gi", poll_interval=0.1, pull_backoff=0.3,
                         restart_backoff=0.3) as fake:
        yield fake


@pytest.fixture
def v1(cluster):
    api = cluster.api_client()
    yield client.CoreV1Api(api)
    api.close()


def make_pod(name=None, code="pass", *, generate_name=None, labels=None, env=None,
             resources=None, image="python:3.11", restart="Never", owners=None, grace=None,
             command=None, deadline=None):
    """A V1Pod whose only container runs ``python -c code``."""
    container = client.V1Container(
        name="main", image=image, command=command or [PY, "-c", code], env=env,
        resources=client.V1ResourceRequirements(**resources) if resources else None)
    return client.V1Pod(
        metadata=client.V1ObjectMeta(name=name, generate_name=generate_name, labels=labels,
                                     owner_references=owners),
        spec=client.V1PodSpec(containers=[container], restart_policy=restart,
                              termination_grace_period_seconds=grace,
                              active_deadline_seconds=deadline))


def wait_for(check, timeout=10.0, what="condition"):
    """Poll ``check()`` until it returns something true; that value."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def wait_phase(v1, name, *phases, timeout=10.0):
    """The pod once its phase is one of ``phases``."""
    def check():
        pod = v1.read_namespaced_pod(name, NS)
        return pod if pod.status.phase in phases else None
    return wait_for(check, timeout, f"pod {name} in {phases}")


def waiting_reason(v1, name):
    statuses = v1.read_namespaced_pod(name, NS).status.container_statuses or []
    waiting = statuses and statuses[0].state.waiting
    return waiting.reason if waiting else None


def gone(v1, name):
    try:
        v1.read_namespaced_pod(name, NS)
    except ApiException as exc:
        return exc.status == 404
    return False


def body_of(exc):
    return json.loads(exc.body)


# -- lifecycle, exit codes, logs -------------------------------------------------------
def test_failed_pod_reports_exit_code_and_log(v1):
    code = ("import sys; print('out line', flush=True); print('err line', file=sys.stderr); "
            "sys.exit(3)")
    v1.create_namespaced_pod(NS, make_pod("fails", code))
    pod = wait_phase(v1, "fails", "Failed")
    terminated = pod.status.container_statuses[0].state.terminated
    assert (terminated.exit_code, terminated.reason) == (3, "Error")
    assert pod.status.container_statuses[0].ready is False
    log = v1.read_namespaced_pod_log("fails", NS)
    assert log == "out line\nerr line\n"
    assert v1.read_namespaced_pod_log("fails", NS, tail_lines=1) == "err line\n"
    assert v1.read_namespaced_pod_status("fails", NS).status.phase == "Failed"


def test_succeeded_pod_status_fields(v1):
    created = v1.create_namespaced_pod(NS, make_pod("ok", "print('fine')"))
    assert created.status.phase == "Pending" and created.metadata.uid
    assert created.metadata.creation_timestamp is not None
    assert created.spec.restart_policy == "Never" and created.status.qos_class == "BestEffort"
    pod = wait_phase(v1, "ok", "Succeeded")
    assert pod.spec.node_name == "fake-node"
    assert (pod.status.pod_ip, pod.status.host_ip) == ("127.0.0.1", "127.0.0.1")
    assert pod.status.start_time is not None
    terminated = pod.status.container_statuses[0].state.terminated
    assert (terminated.exit_code, terminated.reason) == (0, "Completed")
    conditions = {c.type: c.status for c in pod.status.conditions}
    assert conditions["PodScheduled"] == "True" and conditions["Ready"] == "False"
    assert int(pod.metadata.resource_version) > int(created.metadata.resource_version)
    time.sleep(0.3)  # finished pods stay until deleted, as in Kubernetes
    assert v1.read_namespaced_pod("ok", NS).status.phase == "Succeeded"


def test_generate_name(v1):
    first = v1.create_namespaced_pod(NS, make_pod(generate_name="job-"))
    second = v1.create_namespaced_pod(NS, make_pod(generate_name="job-"))
    for pod in (first, second):
        assert pod.metadata.name.startswith("job-") and len(pod.metadata.name) == 9
    assert first.metadata.name != second.metadata.name
    wait_phase(v1, first.metadata.name, "Succeeded")


def test_restart_on_failure_and_previous_log(v1, tmp_path):
    marker = tmp_path / "ran-once"
    code = (f"import os, sys; p = {str(marker)!r}; first = not os.path.exists(p); "
            f"open(p, 'w').close(); print('first' if first else 'second'); "
            f"sys.exit(1 if first else 0)")
    v1.create_namespaced_pod(NS, make_pod("flaky", code, restart="OnFailure"))
    pod = wait_phase(v1, "flaky", "Succeeded")
    status = pod.status.container_statuses[0]
    assert status.restart_count == 1
    assert status.last_state.terminated.exit_code == 1
    assert v1.read_namespaced_pod_log("flaky", NS) == "second\n"
    assert v1.read_namespaced_pod_log("flaky", NS, previous=True) == "first\n"


def test_active_deadline_exceeded(v1):
    v1.create_namespaced_pod(NS, make_pod("slow", SLEEP, deadline=1))
    pod = wait_phase(v1, "slow", "Failed", timeout=5)
    assert pod.status.reason == "DeadlineExceeded"


def test_follow_log_streams_until_the_container_exits(v1):
    code = "import time\nfor i in range(3):\n    print(i, flush=True); time.sleep(0.2)"
    v1.create_namespaced_pod(NS, make_pod("talker", code))
    wait_phase(v1, "talker", "Running", "Succeeded")
    lines = list(watch.Watch().stream(v1.read_namespaced_pod_log, "talker", NS))
    assert lines == ["0", "1", "2"]


# -- errors ----------------------------------------------------------------------------
def test_api_errors_are_status_objects(v1, cluster):
    with pytest.raises(ApiException) as missing:
        v1.read_namespaced_pod("nope", NS)
    assert missing.value.status == 404
    assert body_of(missing.value)["reason"] == "NotFound"
    assert body_of(missing.value)["message"] == 'pods "nope" not found'
    with pytest.raises(ApiException) as missing_delete:
        v1.delete_namespaced_secret("nope", NS)
    assert missing_delete.value.status == 404

    v1.create_namespaced_pod(NS, make_pod("dup"))
    with pytest.raises(ApiException) as dup:
        v1.create_namespaced_pod(NS, make_pod("dup"))
    assert dup.value.status == 409 and body_of(dup.value)["reason"] == "AlreadyExists"

    no_containers = {"metadata": {"name": "empty"}, "spec": {"containers": []}}
    with pytest.raises(ApiException) as invalid:
        v1.create_namespaced_pod(NS, no_containers)
    status = body_of(invalid.value)
    assert invalid.value.status == 422 and status["reason"] == "Invalid"
    assert status["details"]["causes"][0]["field"] == "spec.containers"

    with pytest.raises(ApiException) as bad_name:
        v1.create_namespaced_pod(NS, make_pod("Bad_Name"))
    assert bad_name.value.status == 422
    assert body_of(bad_name.value)["details"]["causes"][0]["field"] == "metadata.name"

    with pytest.raises(ApiException) as bad_label:
        v1.create_namespaced_pod(NS, make_pod("x", labels={"a": "not ok!"}))
    assert bad_label.value.status == 422

    too_much = {"requests": {"cpu": "2"}, "limits": {"cpu": "1"}}
    with pytest.raises(ApiException) as over_limit:
        v1.create_namespaced_pod(NS, make_pod("x", resources=too_much))
    assert over_limit.value.status == 422

    gpu_without_limit = {"requests": {"nvidia.com/gpu": "1"}}
    with pytest.raises(ApiException) as gpu:
        v1.create_namespaced_pod(NS, make_pod("x", resources=gpu_without_limit))
    assert gpu.value.status == 422

    cfg = client.Configuration()
    cfg.host = cluster.url
    cfg.api_key = {"BearerToken": "wrong"}
    cfg.api_key_prefix = {"BearerToken": "Bearer"}
    with client.ApiClient(cfg) as anonymous, pytest.raises(ApiException) as unauthorized:
        client.CoreV1Api(anonymous).list_namespaced_pod(NS)
    assert unauthorized.value.status == 401
    wait_phase(v1, "dup", "Succeeded")


def test_kubeconfig_version_namespace_and_node(cluster):
    config.load_kube_config(config_file=cluster.kubeconfig_path)
    try:
        assert client.VersionApi().get_code().git_version.endswith("-fake")
        core = client.CoreV1Api()
        assert core.read_namespace("any-name").status.phase == "Active"
        node = core.read_node("fake-node")
        assert node.status.allocatable["cpu"] == "4"
        assert [n.metadata.name for n in core.list_node().items] == ["fake-node"]
    finally:
        client.Configuration.set_default(None)


# -- watch and selectors ---------------------------------------------------------------
def test_watch_sees_added_modified_deleted(v1):
    start_rv = v1.list_namespaced_pod(NS).metadata.resource_version
    v1.create_namespaced_pod(NS, make_pod("watched", labels={"app": "w"}))
    v1.create_namespaced_pod(NS, make_pod("other", labels={"app": "x"}))
    wait_phase(v1, "watched", "Succeeded")
    v1.delete_namespaced_pod("watched", NS)

    stream = watch.Watch().stream(v1.list_namespaced_pod, NS, label_selector="app=w",
                                  resource_version=start_rv, timeout_seconds=2)
    events = [(e["type"], e["object"].metadata.name, e["object"].status.phase) for e in stream]
    assert {name for _, name, _ in events} == {"watched"}
    types = [t for t, _, _ in events]
    assert types[0] == "ADDED" and types[-1] == "DELETED" and "MODIFIED" in types
    assert ("MODIFIED", "watched", "Running") in events
    assert ("MODIFIED", "watched", "Succeeded") in events


def test_watch_from_now_streams_live_events_and_times_out(v1):
    v1.create_namespaced_pod(NS, make_pod("live", "import time; time.sleep(0.5)"))
    w = watch.Watch()
    seen = []
    started = time.monotonic()
    for event in w.stream(v1.list_namespaced_pod, NS, timeout_seconds=5):
        seen.append((event["type"], event["object"].status.phase))
        if event["object"].status.phase == "Succeeded":
            w.stop()
    assert seen[0][0] == "ADDED"  # the current state first, then the changes
    assert seen[-1] == ("MODIFIED", "Succeeded")
    assert time.monotonic() - started < 4
    seen.clear()  # a watch with nothing happening ends at timeoutSeconds
    started = time.monotonic()
    rv = v1.list_namespaced_pod(NS).metadata.resource_version
    assert list(watch.Watch().stream(v1.list_namespaced_pod, NS, resource_version=rv,
                                     timeout_seconds=1)) == []
    assert 0.9 < time.monotonic() - started < 3


def test_watch_from_a_compacted_resource_version_is_410(v1, cluster):
    rv = v1.list_namespaced_pod(NS).metadata.resource_version
    v1.create_namespaced_pod(NS, make_pod("p"))
    cluster.compact()
    with pytest.raises(ApiException) as expired:
        list(watch.Watch().stream(v1.list_namespaced_pod, NS, resource_version=rv,
                                  timeout_seconds=1))
    assert expired.value.status == 410
    wait_phase(v1, "p", "Succeeded")


def test_label_and_field_selectors(v1):
    for name, labels in (("a1", {"app": "a", "tier": "x"}), ("a2", {"app": "a", "tier": "y"}),
                         ("b1", {"app": "b"})):
        v1.create_namespaced_pod(NS, make_pod(name, SLEEP, labels=labels))

    def names(**kwargs):
        return sorted(p.metadata.name for p in v1.list_namespaced_pod(NS, **kwargs).items)

    assert names(label_selector="app=a") == ["a1", "a2"]
    assert names(label_selector="app=a,tier=y") == ["a2"]
    assert names(label_selector="app!=a") == ["b1"]
    assert names(label_selector="tier in (x,y)") == ["a1", "a2"]
    assert names(label_selector="!tier") == ["b1"]
    assert names(field_selector="metadata.name=b1") == ["b1"]
    assert names(label_selector="app=a", field_selector="metadata.name!=a1") == ["a2"]
    items = v1.list_namespaced_pod(NS).items
    assert items[0].kind is None  # list items carry no kind, as in Kubernetes
    with pytest.raises(ApiException) as bad:
        v1.list_namespaced_pod(NS, field_selector="spec.foo=x")
    assert bad.value.status == 400

    v1.delete_collection_namespaced_pod(NS, label_selector="app=a", grace_period_seconds=0)
    assert names() == ["b1"]
    v1.delete_namespaced_pod("b1", NS, grace_period_seconds=0)
    wait_for(lambda: names() == [], what="all pods deleted")


# -- secrets and the container's environment -------------------------------------------
def test_secret_crud_and_env_resolution(v1, monkeypatch):
    monkeypatch.setenv("FAKE_KUBE_SHOULD_NOT_LEAK", "1")
    secret = client.V1Secret(
        metadata=client.V1ObjectMeta(name="creds", labels={"app": "s"}),
        data={"token": base64.b64encode(b"s3cret").decode()}, string_data={"user": "alice"})
    created = v1.create_namespaced_secret(NS, secret)
    assert created.type == "Opaque" and created.string_data is None
    assert base64.b64decode(created.data["user"]) == b"alice"
    assert [s.metadata.name for s in v1.list_namespaced_secret(NS, label_selector="app=s").items] \
        == ["creds"]

    env = [
        client.V1EnvVar(name="PLAIN", value="v-$(HOSTNAME)"),
        client.V1EnvVar(name="TOKEN", value_from=client.V1EnvVarSource(
            secret_key_ref=client.V1SecretKeySelector(name="creds", key="token"))),
        client.V1EnvVar(name="MY_IP", value_from=client.V1EnvVarSource(
            field_ref=client.V1ObjectFieldSelector(field_path="status.podIP"))),
        client.V1EnvVar(name="MY_NAME", value_from=client.V1EnvVarSource(
            field_ref=client.V1ObjectFieldSelector(field_path="metadata.name"))),
        client.V1EnvVar(name="MY_NS", value_from=client.V1EnvVarSource(
            field_ref=client.V1ObjectFieldSelector(field_path="metadata.namespace"))),
    ]
    code = "import json, os; print(json.dumps(dict(os.environ)))"
    v1.create_namespaced_pod(NS, make_pod("envy", code, env=env))
    wait_phase(v1, "envy", "Succeeded")
    seen = json.loads(v1.read_namespaced_pod_log("envy", NS, _preload_content=False).data)
    assert seen["TOKEN"] == "s3cret" and seen["PLAIN"] == "v-envy"
    assert (seen["MY_IP"], seen["MY_NAME"], seen["MY_NS"]) == ("127.0.0.1", "envy", NS)
    assert "FAKE_KUBE_SHOULD_NOT_LEAK" not in seen and "PATH" in seen

    status = v1.delete_namespaced_secret("creds", NS)  # the client returns a dict here
    assert status["status"] == "Success" and status["details"]["name"] == "creds"
    with pytest.raises(ApiException) as missing:
        v1.read_namespaced_secret("creds", NS)
    assert missing.value.status == 404


def test_missing_secret_is_create_container_config_error_until_it_exists(v1):
    env = [client.V1EnvVar(name="TOKEN", value_from=client.V1EnvVarSource(
        secret_key_ref=client.V1SecretKeySelector(name="later", key="token")))]
    v1.create_namespaced_pod(NS, make_pod("waits", "import os; print(os.environ['TOKEN'])",
                                          env=env))
    wait_for(lambda: waiting_reason(v1, "waits") == "CreateContainerConfigError",
             what="CreateContainerConfigError")
    pod = v1.read_namespaced_pod("waits", NS)
    assert pod.status.phase == "Pending"
    assert 'secret "later" not found' in pod.status.container_statuses[0].state.waiting.message
    v1.create_namespaced_secret(NS, client.V1Secret(
        metadata=client.V1ObjectMeta(name="later"), string_data={"token": "now"}))
    wait_phase(v1, "waits", "Succeeded")  # the kubelet retries, as a real one does
    assert v1.read_namespaced_pod_log("waits", NS) == "now\n"


# -- scheduling, images, resources -----------------------------------------------------
def test_unschedulable_until_capacity_frees(v1):
    v1.create_namespaced_pod(NS, make_pod("big", SLEEP, resources={"requests": {"cpu": "3"}}))
    wait_phase(v1, "big", "Running")
    v1.create_namespaced_pod(NS, make_pod("next", resources={"requests": {"cpu": "2"}}))
    v1.create_namespaced_pod(NS, make_pod("gpu", resources={
        "requests": {"nvidia.com/gpu": "1"}, "limits": {"nvidia.com/gpu": "1"}}))

    def scheduled_condition(name):
        conditions = v1.read_namespaced_pod(name, NS).status.conditions or []
        return next((c for c in conditions if c.type == "PodScheduled"), None)

    cond = wait_for(lambda: scheduled_condition("next"), what="PodScheduled condition")
    assert (cond.status, cond.reason) == ("False", "Unschedulable")
    assert cond.message.startswith("0/1 nodes are available: 1 Insufficient cpu.")
    gpu = wait_for(lambda: scheduled_condition("gpu"), what="PodScheduled condition")
    assert "Insufficient nvidia.com/gpu" in gpu.message
    assert v1.read_namespaced_pod("next", NS).spec.node_name is None

    v1.delete_namespaced_pod("big", NS, grace_period_seconds=0)
    pod = wait_phase(v1, "next", "Succeeded")  # scheduled once the cpu is free
    assert scheduled_condition("next").status == "True" and pod.spec.node_name == "fake-node"
    assert v1.read_namespaced_pod("gpu", NS).status.phase == "Pending"


def test_unpullable_image_backs_off(v1):
    v1.create_namespaced_pod(NS, make_pod("nopull", image="registry.local/does-not-exist:1"))
    reasons = set()
    wait_for(lambda: reasons.add(waiting_reason(v1, "nopull")) or
             {"ErrImagePull", "ImagePullBackOff"} <= reasons, what="image pull back-off")
    assert v1.read_namespaced_pod("nopull", NS).status.phase == "Pending"
    with pytest.raises(ApiException) as no_log:
        v1.read_namespaced_pod_log("nopull", NS)
    assert no_log.value.status == 400


def test_memory_limit_is_oom_killed(v1):
    code = "import time; b = bytearray(300 * 1024 * 1024); time.sleep(30)"
    v1.create_namespaced_pod(NS, make_pod("hog", code, resources={
        "limits": {"memory": "100Mi"}}))
    pod = wait_phase(v1, "hog", "Failed", timeout=15)
    terminated = pod.status.container_statuses[0].state.terminated
    assert (terminated.exit_code, terminated.reason) == (137, "OOMKilled")
    assert pod.status.qos_class == "Burstable"
    assert pod.spec.containers[0].resources.requests == {"memory": "100Mi"}  # defaulted


def test_evict_hook(v1, cluster):
    v1.create_namespaced_pod(NS, make_pod("victim", SLEEP))
    wait_phase(v1, "victim", "Running")
    pid = cluster.pod_pid(NS, "victim")
    cluster.evict(NS, "victim", message="The node was low on resource: memory.")
    pod = wait_phase(v1, "victim", "Failed")
    assert (pod.status.reason, pod.status.message) == (
        "Evicted", "The node was low on resource: memory.")
    assert pod.status.container_statuses[0].state.terminated.exit_code == 137
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE


# -- deletion, garbage collection, stop ------------------------------------------------
def test_delete_with_grace_period_kills_a_process_ignoring_sigterm(v1, cluster):
    code = ("import signal, time; signal.signal(signal.SIGTERM, "
            "lambda *a: print('TERM', flush=True)); print('up', flush=True); time.sleep(60)")
    v1.create_namespaced_pod(NS, make_pod("stubborn", code))
    wait_for(lambda: v1.read_namespaced_pod_log("stubborn", NS) if
             v1.read_namespaced_pod("stubborn", NS).status.phase == "Running" else None,
             what="process up")
    pid = cluster.pod_pid(NS, "stubborn")
    started = time.monotonic()
    deleted = v1.delete_namespaced_pod("stubborn", NS, body=client.V1DeleteOptions(
        grace_period_seconds=1))
    assert deleted.metadata.deletion_timestamp is not None
    assert deleted.metadata.deletion_grace_period_seconds == 1
    assert v1.read_namespaced_pod("stubborn", NS).metadata.deletion_timestamp is not None
    wait_for(lambda: gone(v1, "stubborn"), what="pod removed")
    assert 0.9 < time.monotonic() - started < 5
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE


def test_owner_reference_garbage_collection(v1):
    owner = v1.create_namespaced_pod(NS, make_pod("owner", SLEEP))
    ref = client.V1OwnerReference(api_version="v1", kind="Pod", name="owner",
                                  uid=owner.metadata.uid)
    v1.create_namespaced_pod(NS, make_pod("dependent", SLEEP, owners=[ref]))
    v1.create_namespaced_secret(NS, client.V1Secret(
        metadata=client.V1ObjectMeta(name="owned", owner_references=[ref]),
        string_data={"k": "v"}))
    wait_phase(v1, "dependent", "Running")

    v1.delete_namespaced_pod("owner", NS, grace_period_seconds=0)
    wait_for(lambda: gone(v1, "dependent"), what="dependent pod collected")
    with pytest.raises(ApiException) as secret_gone:
        v1.read_namespaced_secret("owned", NS)
    assert secret_gone.value.status == 404

    stale = client.V1OwnerReference(api_version="v1", kind="Pod", name="owner",
                                    uid=owner.metadata.uid)  # the owner no longer exists
    v1.create_namespaced_pod(NS, make_pod("orphan", SLEEP, owners=[stale]))
    wait_for(lambda: gone(v1, "orphan"), what="orphan collected")


def test_stop_leaves_no_processes():
    fake = FakeKubeCluster().start()
    api = fake.api_client()
    v1 = client.CoreV1Api(api)
    spawner = (f"import subprocess, time; subprocess.Popen([{PY!r}, '-c', {SLEEP!r}]); "
               "time.sleep(60)")
    for name in ("s1", "s2"):
        v1.create_namespaced_pod(NS, make_pod(name, spawner))
    for name in ("s1", "s2"):
        wait_phase(v1, name, "Running")
    time.sleep(0.5)  # let the grandchildren start and the kubelet see them
    pids = {fake.pod_pid(NS, name) for name in ("s1", "s2")}
    tree = {p.pid for pid in pids for p in psutil.Process(pid).children(recursive=True)}
    assert len(tree) == 2
    api.close()
    fake.stop()
    alive = [pid for pid in pids | tree if psutil.pid_exists(pid)
             and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE]
    assert alive == []
    assert not os.path.exists(fake.workdir)


# -- more of the API a backend may use -------------------------------------------------
def test_requests_never_exceed_the_node(v1):
    rv = v1.list_namespaced_pod(NS).metadata.resource_version
    names = [f"w{i}" for i in range(12)]
    for name in names:
        v1.create_namespaced_pod(NS, make_pod(name, "import time; time.sleep(0.2)", labels={
            "batch": "b"}, resources={"requests": {"cpu": "1", "memory": "64Mi"}}))
    running, most, done = set(), 0, set()
    for event in watch.Watch().stream(v1.list_namespaced_pod, NS, label_selector="batch=b",
                                      resource_version=rv, timeout_seconds=20):
        pod = event["object"]
        (running.add if pod.status.phase == "Running" else running.discard)(pod.metadata.name)
        most = max(most, len(running))
        if pod.status.phase == "Succeeded":
            done.add(pod.metadata.name)
            if done == set(names):
                break
    assert done == set(names) and 1 < most <= 4  # node_cpu=4, each pod requests 1


def test_patch_labels_and_list_all_namespaces(v1):
    v1.create_namespaced_pod(NS, make_pod("patched", labels={"a": "1"}))
    other = make_pod("elsewhere")
    v1.create_namespaced_pod("team-b", other)
    patched = v1.patch_namespaced_pod("patched", NS, {"metadata": {"labels": {"b": "2"}}})
    assert patched.metadata.labels == {"a": "1", "b": "2"}
    with pytest.raises(ApiException) as forbidden:
        v1.patch_namespaced_pod("patched", NS, {"spec": {"restartPolicy": "Always"}})
    assert forbidden.value.status == 422
    everywhere = v1.list_pod_for_all_namespaces(label_selector="b=2").items
    assert [p.metadata.name for p in everywhere] == ["patched"]
    assert {p.metadata.namespace for p in v1.list_pod_for_all_namespaces().items} == {
        NS, "team-b"}
    wait_phase(v1, "patched", "Succeeded")


def test_restart_policy_always_crash_loops_and_bad_command_is_start_error(v1):
    v1.create_namespaced_pod(NS, make_pod("crashy", "import sys; sys.exit(2)",
                                          restart="Always"))
    wait_for(lambda: waiting_reason(v1, "crashy") == "CrashLoopBackOff", what="CrashLoopBackOff")
    pod = v1.read_namespaced_pod("crashy", NS)
    assert pod.status.phase == "Running"  # a restarting pod never finishes
    assert pod.status.container_statuses[0].restart_count >= 1
    assert pod.status.container_statuses[0].last_state.terminated.exit_code == 2

    v1.create_namespaced_pod(NS, make_pod("nocmd", command=["/no/such/binary"]))
    pod = wait_phase(v1, "nocmd", "Failed")
    terminated = pod.status.container_statuses[0].state.terminated
    assert (terminated.exit_code, terminated.reason) == (128, "StartError")
    v1.delete_namespaced_pod("crashy", NS, grace_period_seconds=0)


def test_configmap_env_from_and_node_selector(v1):
    v1.create_namespaced_config_map(NS, client.V1ConfigMap(
        metadata=client.V1ObjectMeta(name="settings"), data={"MODE": "fast", "LEVEL": "3"}))
    pod = make_pod("configured", "import os; print(os.environ['CFG_MODE'], os.environ['LEVEL'])",
                   env=[client.V1EnvVar(name="LEVEL", value_from=client.V1EnvVarSource(
                       config_map_key_ref=client.V1ConfigMapKeySelector(name="settings",
                                                                        key="LEVEL")))])
    pod.spec.containers[0].env_from = [client.V1EnvFromSource(
        prefix="CFG_", config_map_ref=client.V1ConfigMapEnvSource(name="settings"))]
    v1.create_namespaced_pod(NS, pod)
    wait_phase(v1, "configured", "Succeeded")
    assert v1.read_namespaced_pod_log("configured", NS) == "fast 3\n"

    picky = make_pod("picky")
    picky.spec.node_selector = {"gpu": "a100"}
    v1.create_namespaced_pod(NS, picky)
    wait_for(lambda: (v1.read_namespaced_pod("picky", NS).status.conditions or [None])[0],
             what="PodScheduled condition")
    condition = v1.read_namespaced_pod("picky", NS).status.conditions[0]
    assert "didn't match Pod's node affinity/selector" in condition.message
