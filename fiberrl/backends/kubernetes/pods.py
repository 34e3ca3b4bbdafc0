"""Pod manifests for fiberrl jobs, and what a pod's status means (pure functions).

A job's pod: one container running ``python3 -m fiberrl.spawn`` from the worker
image, ``restartPolicy: Never`` (fiberrl's pool restarts lost work itself), labels
``app=fiberrl``, ``fiberrl/run``, ``fiberrl/user``, the process name as an
annotation, resources as requests and limits (``nvidia.com/gpu`` for GPUs), an
owner reference to the master's pod when the master runs in the cluster (so
workers die with it), the namespace's service account if one is configured, and
volumes (PVCs, host paths, empty dirs). The run's secret is never in the manifest:
the container reads it from a Kubernetes Secret (``secretKeyRef``).
"""
from __future__ import annotations

import math
import re
import signal
import uuid
from typing import Any, Dict, List, Mapping, Optional, Sequence

from ...errors import ConfigError
from ..base import JobSpec, JobState, JobStatus

SECRET_KEY = "secret"
POD_IP_ENV = "FIBERRL_POD_IP"
POD_NAME_ENV = "FIBERRL_POD_NAME"
POD_UID_ENV = "FIBERRL_POD_UID"
#: waiting reasons after which a container will not start without a person's help
FATAL_WAITING = {"ErrImagePull", "ImagePullBackOff", "InvalidImageName",
                 "CreateContainerConfigError", "CreateContainerError", "CrashLoopBackOff"}


def label_value(text: str) -> str:
    """``text`` made a valid label value (63 characters of ``[A-Za-z0-9_.-]``)."""
    value = re.sub(r"[^A-Za-z0-9_.-]", "-", text)[:63].strip("-_.")
    return value or "none"


def pod_name(process_name: str) -> str:
    """A unique DNS-1123 pod name for the process ``process_name``."""
    slug = re.sub(r"[^a-z0-9-]", "-", process_name.lower()).strip("-")[:40].strip("-") or "job"
    return f"fiberrl-{slug}-{uuid.uuid4().hex[:8]}"


def quantity_cpu(cpu: float) -> str:
    """CPUs as a Kubernetes quantity (``1.5`` -> ``"1500m"``)."""
    return f"{math.ceil(cpu * 1000)}m"


def quantity_memory(mem: int) -> str:
    """Bytes as a Kubernetes quantity in MiB, rounded up."""
    return f"{math.ceil(mem / (1 << 20))}Mi"


def volume_entries(volumes: Sequence[Mapping[str, Any]]) -> tuple:
    """(pod volumes, container mounts) from the ``k8s_volumes`` setting: each entry has
    ``mount_path`` and one of ``pvc``, ``host_path`` or ``empty_dir`` (and optional
    ``name``, ``read_only``, ``sub_path``)."""
    pod_volumes, mounts = [], []
    for index, entry in enumerate(volumes):
        name = entry.get("name") or f"vol-{index}"
        if "mount_path" not in entry:
            raise ConfigError(f"k8s_volumes entry {entry!r} needs a mount_path")
        if "pvc" in entry:
            source = {"persistentVolumeClaim": {"claimName": entry["pvc"],
                                                "readOnly": bool(entry.get("read_only", False))}}
        elif "host_path" in entry:
            source = {"hostPath": {"path": entry["host_path"]}}
        elif "empty_dir" in entry:
            source = {"emptyDir": {}}
        else:
            raise ConfigError(f"k8s_volumes entry {entry!r} needs pvc, host_path or empty_dir")
        pod_volumes.append({"name": name, **source})
        mount = {"name": name, "mountPath": entry["mount_path"],
                 "readOnly": bool(entry.get("read_only", False))}
        if entry.get("sub_path"):
            mount["subPath"] = entry["sub_path"]
        mounts.append(mount)
    return pod_volumes, mounts


def check_settings(extra: Mapping[str, Any]) -> None:
    """ConfigError for a bad value of the backend's settings that are checked at init."""
    host_pid = extra.get("k8s_host_pid", False)
    if not isinstance(host_pid, bool):
        raise ConfigError(f"fiberrl setting 'k8s_host_pid' must be true or false, "
                          f"got {host_pid!r}")


def pod_manifest(spec: JobSpec, *, name: str, image: str, namespace: str, run: str, user: str,
                 secret_name: str, secret_env: str, python: str = "python3",
                 service_account: Optional[str] = None, owner: Optional[Mapping[str, str]] = None,
                 volumes: Sequence[Mapping[str, Any]] = (), working_dir: Optional[str] = None,
                 image_pull_policy: Optional[str] = None,
                 host_pid: bool = False) -> Dict[str, Any]:
    """The Pod (as the API's JSON) that runs ``spec``; ``host_pid`` puts it in its
    node's PID namespace (``hostPID``), where pids differ between the pods of a node."""
    env: List[Dict[str, Any]] = [{"name": k, "value": v} for k, v in sorted(spec.env.items())
                                 if k != secret_env]
    env.append({"name": secret_env, "valueFrom": {"secretKeyRef": {
        "name": secret_name, "key": SECRET_KEY}}})
    for var, path in ((POD_IP_ENV, "status.podIP"), (POD_NAME_ENV, "metadata.name"),
                      (POD_UID_ENV, "metadata.uid")):
        env.append({"name": var, "valueFrom": {"fieldRef": {"fieldPath": path}}})
    env.append({"name": "PYTHONUNBUFFERED", "value": "1"})
    resources: Dict[str, Dict[str, str]] = {}
    if spec.cpu is not None:
        resources.setdefault("requests", {})["cpu"] = quantity_cpu(spec.cpu)
        resources.setdefault("limits", {})["cpu"] = quantity_cpu(spec.cpu)
    if spec.mem is not None:
        resources.setdefault("requests", {})["memory"] = quantity_memory(spec.mem)
        resources.setdefault("limits", {})["memory"] = quantity_memory(spec.mem)
    if spec.gpu:
        resources.setdefault("requests", {})["nvidia.com/gpu"] = str(int(spec.gpu))
        resources.setdefault("limits", {})["nvidia.com/gpu"] = str(int(spec.gpu))
    pod_volumes, mounts = volume_entries(volumes)
    container: Dict[str, Any] = {"name": "fiberrl", "image": image,
                                 "command": [python] + list(spec.command[1:]), "env": env}
    if resources:
        container["resources"] = resources
    if mounts:
        container["volumeMounts"] = mounts
    if working_dir:
        container["workingDir"] = working_dir
    if image_pull_policy:
        container["imagePullPolicy"] = image_pull_policy
    metadata: Dict[str, Any] = {
        "name": name, "namespace": namespace,
        "labels": {"app": "fiberrl", "fiberrl/run": label_value(run),
                   "fiberrl/user": label_value(user)},
        "annotations": {"fiberrl/name": spec.name}}
    if owner:
        metadata["ownerReferences"] = [{"apiVersion": "v1", "kind": "Pod", "name": owner["name"],
                                        "uid": owner["uid"], "blockOwnerDeletion": True}]
    pod_spec: Dict[str, Any] = {"restartPolicy": "Never", "containers": [container]}
    if service_account:
        pod_spec["serviceAccountName"] = service_account
    if pod_volumes:
        pod_spec["volumes"] = pod_volumes
    if host_pid:
        pod_spec["hostPID"] = True
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": pod_spec}


def _get(obj: Any, *path: str) -> Any:
    """``obj.a.b`` for client objects or ``obj["a"]["b"]`` for dicts; None if absent."""
    for key in path:
        if obj is None:
            return None
        obj = obj.get(key) if isinstance(obj, Mapping) else getattr(obj, key, None)
    return obj


def pod_status(pod: Any) -> JobStatus:
    """fiberrl's view of a pod (a client ``V1Pod`` or its JSON)."""
    status = _get(pod, "status")
    phase = _get(status, "phase") or "Pending"
    if _get(status, "reason") == "Evicted":
        return JobStatus(JobState.FAILED, -int(signal.SIGKILL),
                         f"Evicted: {_get(status, 'message') or 'the node ran short of resources'}")
    container = (_get(status, "container_statuses") or _get(status, "containerStatuses") or [None])[0]
    waiting = _get(container, "state", "waiting")
    if phase == "Pending":
        reason = _get(waiting, "reason")
        if reason in FATAL_WAITING:
            return JobStatus(JobState.FAILED, 1, f"{reason}: {_get(waiting, 'message') or ''}".strip(": "))
        for condition in _get(status, "conditions") or []:
            if _get(condition, "reason") == "Unschedulable":
                return JobStatus(JobState.PENDING,
                                 reason=f"Unschedulable: {_get(condition, 'message') or ''}")
        return JobStatus(JobState.PENDING, reason=reason or "")
    if phase == "Running":
        return JobStatus(JobState.RUNNING)
    if phase == "Unknown":
        return JobStatus(JobState.UNKNOWN)
    terminated = _get(container, "state", "terminated")
    code = _get(terminated, "exit_code")
    if code is None:
        code = _get(terminated, "exitCode")
    reason = _get(terminated, "reason") or ""
    if reason == "OOMKilled":
        return JobStatus(JobState.FAILED, -int(signal.SIGKILL),
                         "OOMKilled: the container used more than its memory limit")
    if phase == "Succeeded":
        return JobStatus(JobState.SUCCEEDED, 0)
    code = 1 if code is None else int(code)
    if code > 128 and code - 128 in {s.value for s in signal.Signals}:
        sig = code - 128
        return JobStatus(JobState.FAILED, -sig,
                         f"killed by signal {sig} ({signal.Signals(sig).name})")
    return JobStatus(JobState.FAILED, code, f"exit code {code}" + (f" ({reason})" if reason
                                                                     and reason != "Error" else ""))
