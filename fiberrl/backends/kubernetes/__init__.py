"""The Kubernetes backend: each fiberrl process is a pod (the official ``kubernetes`` client).

Configuration: in a pod, the in-cluster service account; elsewhere the kubeconfig
(``KUBECONFIG`` or ``~/.kube/config``; ``k8s_kubeconfig`` and ``k8s_context``
settings). Other ``extra`` settings: ``k8s_namespace`` (default: the pod's own, the
context's, or ``default``), ``k8s_image`` (or the ``image`` setting; default
``fiberrl-worker:cpu``), ``k8s_service_account``, ``k8s_volumes`` (see
:func:`.kubernetes_pods.volume_entries`), ``k8s_python`` (default ``python3``),
``k8s_working_dir``, ``k8s_image_pull_policy``, ``k8s_unschedulable_grace``
(seconds a pod may stay unschedulable before it fails, default 60), ``k8s_host_pid``
(default false: pods in their node's PID namespace, ``hostPID``).

- PIDs: a pod has a PID namespace of its own, so every job's ``os.getpid()`` (which
  is its ``Process.pid``) is the same small number and code that keys processes by
  pid (``concurrent.futures.ProcessPoolExecutor``) breaks with 2+ workers.
  ``shareProcessNamespace`` shares one only between the containers of one pod, so
  ``k8s_host_pid`` is the one way to distinct pids, and only among the pods of one node
  (and it needs a cluster policy that allows ``hostPID``).

- The run's secret lives in one Kubernetes Secret per run (labelled, owned by the
  master's pod when there is one, deleted when the master exits); pods read it
  through ``secretKeyRef``, so it is never in a pod spec.
- Status comes from one cached pod list per run (label selector), not one request
  per pod. Pending pods that cannot start (``ImagePullBackOff``,
  ``CreateContainerConfigError``...) fail at once with the reason; unschedulable
  ones after the grace; ``OOMKilled``, ``Evicted`` and signals become reasons.
  Finished pods are deleted once their log tail is kept.
- A pod listens on its own IP (the downward API's ``status.podIP``).

``configs/rbac.yaml`` grants the least the backend needs: pods (create, get, list,
watch, delete), pods/log (get), secrets (create, get, delete) in its namespace.
"""
from __future__ import annotations

import atexit
import logging
import os
import signal
import threading
import time
from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional

from ...config import DEFAULT_IMAGE, get_config
from ...errors import BackendError
from ..._wire.auth import SECRET_ENV, run_secret
from ..._wire.sockets import default_listen_host
from .. import addresses
from ..base import Backend, Job, JobInfo, JobSpec, JobState, JobStatus, run_id, user_name
from .pods import (POD_IP_ENV, POD_NAME_ENV, POD_UID_ENV, SECRET_KEY, check_settings,
                   label_value, pod_manifest, pod_name, pod_status)

logger = logging.getLogger(__name__)

REFRESH = 0.5
_NAMESPACE_FILE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"
_TAIL_KEPT = 200


def _client_modules():
    try:
        from kubernetes import client, config
    except ImportError as exc:
        raise BackendError("the kubernetes backend needs the kubernetes client: "
                           "pip install 'fiberrl[kubernetes]'") from exc
    return client, config


@dataclass
class _PodData:
    """The backend's private state for one pod."""

    final: Optional[JobStatus] = None
    tail: str = ""
    deleted_with: Optional[int] = None
    pending_since: float = 0.0


class KubernetesBackend(Backend):
    """One pod per process, in one namespace."""

    name = "kubernetes"
    shares_host = False

    def __init__(self, listen_host: Optional[str] = None) -> None:
        client, config = _client_modules()
        cfg = get_config()
        self._extra: Mapping[str, Any] = cfg.extra
        namespace = self._extra.get("k8s_namespace")
        try:
            if os.environ.get("KUBERNETES_SERVICE_HOST") and not self._extra.get("k8s_kubeconfig"):
                config.load_incluster_config()
                if namespace is None and os.path.exists(_NAMESPACE_FILE):
                    namespace = open(_NAMESPACE_FILE).read().strip()
            else:
                config.load_kube_config(config_file=self._extra.get("k8s_kubeconfig"),
                                        context=self._extra.get("k8s_context"))
                if namespace is None:
                    _, active = config.list_kube_config_contexts(
                        config_file=self._extra.get("k8s_kubeconfig"))
                    namespace = (active or {}).get("context", {}).get("namespace")
        except Exception as exc:
            raise BackendError(f"cannot configure the Kubernetes client: {exc}") from exc
        self._api = client.CoreV1Api()
        self._exceptions = client.exceptions
        self.namespace = namespace or "default"
        self._image = cfg.image or self._extra.get("k8s_image") or DEFAULT_IMAGE
        check_settings(self._extra)
        self._host_pid = bool(self._extra.get("k8s_host_pid", False))
        self._listen_host = listen_host
        self._run = run_id()
        self._selector = f"fiberrl/run={label_value(self._run)}"
        self._secret_name = f"fiberrl-{label_value(self._run).lower().replace('_', '-')}"[:63]
        self._secret_ready = False
        self._lock = threading.Lock()
        self._pods: Dict[str, Any] = {}
        self._fetched_at = 0.0

    # -- the run's secret -------------------------------------------------------------
    def _owner(self) -> Optional[Dict[str, str]]:
        """The master's own pod (when it is one of ours or runs in the cluster)."""
        name, uid = os.environ.get(POD_NAME_ENV), os.environ.get(POD_UID_ENV)
        return {"name": name, "uid": uid} if name and uid else None

    def _ensure_secret(self) -> None:
        with self._lock:
            if self._secret_ready:
                return
            body = {"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
                    "metadata": {"name": self._secret_name,
                                 "labels": {"app": "fiberrl",
                                            "fiberrl/run": label_value(self._run)}},
                    "stringData": {SECRET_KEY: run_secret().hex()}}
            owner = self._owner()
            if owner:
                body["metadata"]["ownerReferences"] = [{"apiVersion": "v1", "kind": "Pod",
                                                        **owner}]
            try:
                self._api.create_namespaced_secret(self.namespace, body)
                atexit.register(self._delete_secret)
            except self._exceptions.ApiException as exc:
                if exc.status != 409:  # 409: a job of this run made it already
                    raise BackendError(f"cannot create the run's Secret: {exc.reason}: "
                                       f"{exc.body}") from exc
            self._secret_ready = True

    def _delete_secret(self) -> None:
        try:
            self._api.delete_namespaced_secret(self._secret_name, self.namespace)
        except Exception:
            logger.debug("deleting secret %s", self._secret_name, exc_info=True)

    # -- submitting ---------------------------------------------------------------------
    def create_job(self, spec: JobSpec) -> Job:
        self._ensure_secret()
        name = pod_name(spec.name)
        manifest = pod_manifest(
            spec, name=name, image=spec.image or self._image, namespace=self.namespace,
            run=self._run, user=user_name(), secret_name=self._secret_name,
            secret_env=SECRET_ENV, python=self._extra.get("k8s_python", "python3"),
            service_account=self._extra.get("k8s_service_account"), owner=self._owner(),
            volumes=self._extra.get("k8s_volumes") or (),
            working_dir=self._extra.get("k8s_working_dir"),
            image_pull_policy=self._extra.get("k8s_image_pull_policy"),
            host_pid=self._host_pid)
        try:
            self._api.create_namespaced_pod(self.namespace, manifest)
        except self._exceptions.ApiException as exc:
            raise BackendError(f"Kubernetes refused pod {name} for {spec.name!r}: "
                               f"{exc.status} {exc.reason}: {exc.body}") from exc
        self._fetched_at = 0.0
        return Job(id=name, backend=self.name, spec=spec,
                   data=_PodData(pending_since=time.monotonic()))

    # -- watching -------------------------------------------------------------------------
    def _pod(self, name: str) -> Optional[Any]:
        with self._lock:
            if time.monotonic() - self._fetched_at >= REFRESH:
                try:
                    pods = self._api.list_namespaced_pod(self.namespace,
                                                         label_selector=self._selector)
                    self._pods = {p.metadata.name: p for p in pods.items}
                except self._exceptions.ApiException as exc:
                    logger.warning("listing pods failed: %s %s", exc.status, exc.reason)
                self._fetched_at = time.monotonic()
            return self._pods.get(name)

    def status(self, job: Job) -> JobStatus:
        data: _PodData = job.data
        if data.final is not None:
            return data.final
        pod = self._pod(job.id)
        if pod is None:
            if data.deleted_with is not None:
                sig = data.deleted_with
                data.final = JobStatus(JobState.CANCELLED, -sig,
                                       f"pod deleted ({signal.Signals(sig).name})")
                return data.final
            if time.monotonic() - data.pending_since < 5.0:
                return JobStatus(JobState.PENDING)  # not in the list yet
            data.final = JobStatus(JobState.FAILED, None, "the pod is gone")
            return data.final
        status = pod_status(pod)
        if status.state is JobState.RUNNING and job.host is None:
            job.host = pod.spec.node_name
        if status.state is JobState.PENDING and status.reason.startswith("Unschedulable"):
            grace = float(self._extra.get("k8s_unschedulable_grace", 60))
            if time.monotonic() - data.pending_since > grace:
                status = JobStatus(JobState.FAILED, 1, status.reason)
        if data.deleted_with is not None and status.state.finished:
            status = JobStatus(JobState.CANCELLED, -data.deleted_with,
                               f"pod deleted ({signal.Signals(data.deleted_with).name})")
        if status.state.finished:
            data.final = status
            self._keep_tail_and_delete(job)
        return status

    def _keep_tail_and_delete(self, job: Job) -> None:
        data: _PodData = job.data
        data.tail = self._read_log(job.id, _TAIL_KEPT) or data.tail
        try:
            self._api.delete_namespaced_pod(job.id, self.namespace, grace_period_seconds=0)
        except self._exceptions.ApiException as exc:
            if exc.status != 404:
                logger.debug("deleting pod %s: %s", job.id, exc.reason)

    def _read_log(self, name: str, tail: int) -> str:
        try:
            return self._api.read_namespaced_pod_log(name, self.namespace, tail_lines=tail)
        except self._exceptions.ApiException:
            return ""

    def terminate(self, job: Job, force: bool = False) -> None:
        data: _PodData = job.data
        if data.final is not None:
            return
        data.tail = self._read_log(job.id, _TAIL_KEPT)
        data.deleted_with = int(signal.SIGKILL if force else signal.SIGTERM)
        try:
            self._api.delete_namespaced_pod(job.id, self.namespace,
                                            grace_period_seconds=0 if force else 10)
        except self._exceptions.ApiException as exc:
            if exc.status != 404:
                logger.warning("deleting pod %s: %s %s", job.id, exc.status, exc.reason)
        self._fetched_at = 0.0

    def logs(self, job: Job, tail: int = 50) -> str:
        data: _PodData = job.data
        text = data.tail if data.final is not None else (self._read_log(job.id, tail) or data.tail)
        return "\n".join(text.splitlines()[-tail:])

    def listen_host(self) -> str:
        """In a pod, the pod's IP; elsewhere see :mod:`.addresses`."""
        pod_ip = os.environ.get(POD_IP_ENV)
        if pod_ip and addresses.is_local_address(pod_ip):
            return pod_ip
        return addresses.listen_host(self._listen_host, default_listen_host)

    # -- the command line -----------------------------------------------------------------
    def list_jobs(self) -> List[JobInfo]:
        pods = self._api.list_namespaced_pod(
            self.namespace, label_selector=f"app=fiberrl,fiberrl/user={label_value(user_name())}")
        return [JobInfo(id=p.metadata.name, backend=self.name,
                        name=(p.metadata.annotations or {}).get("fiberrl/name", ""),
                        run=(p.metadata.labels or {}).get("fiberrl/run", ""),
                        state=p.status.phase or "", host=p.spec.node_name or "",
                        created=str(p.metadata.creation_timestamp or "")[:19])
                for p in pods.items]

    def attach(self, job_id: str) -> Job:
        try:
            pod = self._api.read_namespaced_pod(job_id, self.namespace)
        except self._exceptions.ApiException as exc:
            raise BackendError(f"no pod {job_id!r} in namespace {self.namespace}: "
                               f"{exc.reason}") from exc
        spec = JobSpec(command=[], name=(pod.metadata.annotations or {}).get("fiberrl/name", job_id))
        self._selector = f"fiberrl/run={(pod.metadata.labels or {}).get('fiberrl/run', '')}"
        return Job(id=job_id, backend=self.name, spec=spec, data=_PodData(pending_since=time.monotonic()))
