"""The HTTP front end and the public entry point: ``_Server`` and ``_Handler`` serve
``CoreV1Api`` over plain HTTP on 127.0.0.1, and ``FakeKubeCluster`` wires the store, the
fake kubelet, the garbage collector and the server together and writes a kubeconfig. Part
of the in-repo FAKE Kubernetes core/v1 API used by tests (see ``fake_kube``); NOT a real
cluster.
"""
from __future__ import annotations

import base64
import copy
import json
import logging
import math
import os
import re
import select
import shutil
import socket
import tempfile
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Dict, List, Optional, Set, Tuple
from urllib.parse import parse_qs, urlsplit

from .objects import (ApiError, BASE_ENV_VARS, DEFAULT_NAMESPACES, GPU, HOST_IP, KINDS,
                      KUBE_VERSION, NODE_LABELS, NODE_NAME, PLURALS, POD_IP, _ENV_NAME, _ts,
                      parse_quantity)
from .store import Store
from .kubelet import ConfigError, Kubelet, expand_vars
from .api import CoreV1Api, Request, Response

logger = logging.getLogger(__name__)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False
    allow_reuse_address = True
    request_queue_size = 128  # bursts of clients must not wait for SYN retries

    def __init__(self, address: Tuple[str, int], cluster: "FakeKubeCluster") -> None:
        self.cluster = cluster
        self.api = CoreV1Api(cluster)
        self.connections: Set[socket.socket] = set()
        self.connections_lock = threading.Lock()
        super().__init__(address, _Handler)

    def close_connections(self) -> None:
        with self.connections_lock:
            for conn in list(self.connections):
                try:
                    conn.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass


class _Handler(BaseHTTPRequestHandler):
    """HTTP/1.1 with keep-alive; watches and followed logs are chunked streams."""
    protocol_version = "HTTP/1.1"
    server_version = "fake-kube-apiserver"
    sys_version = ""
    timeout = 120  # idle keep-alive connections are closed after this
    server: _Server

    def setup(self) -> None:
        super().setup()
        with self.server.connections_lock:
            self.server.connections.add(self.connection)

    def finish(self) -> None:
        with self.server.connections_lock:
            self.server.connections.discard(self.connection)
        super().finish()

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (stdlib's name)
        logger.debug("fake kube-apiserver: " + format, *args)

    def do_GET(self) -> None:
        self._serve("GET")

    def do_POST(self) -> None:
        self._serve("POST")

    def do_DELETE(self) -> None:
        self._serve("DELETE")

    def do_PATCH(self) -> None:
        self._serve("PATCH")

    def do_PUT(self) -> None:
        self._serve("PUT")

    def _serve(self, method: str) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        url = urlsplit(self.path)
        query = {k: v[-1] for k, v in parse_qs(url.query, keep_blank_values=True).items()}
        req = Request(method, url.path, query, body, self.headers.get("Content-Type") or "",
                      self._client_gone)
        try:
            self._check_auth(url.path)
            response = self.server.api.handle(req)
        except ApiError as exc:
            response = Response(exc.code, exc.status())
        except Exception as exc:  # a bug in the fake: answer 500 like the API server would
            logger.exception("fake kube-apiserver: %s %s failed", method, self.path)
            response = Response(500, ApiError(500, "InternalError", str(exc)).status())
        self._send(response)

    def _check_auth(self, path: str) -> None:
        if path.rstrip("/") in ("/version", "/healthz", "/readyz", "/livez"):
            return
        if self.headers.get("Authorization") != f"Bearer {self.server.cluster.token}":
            raise ApiError(401, "Unauthorized", "Unauthorized")

    def _send(self, response: Response) -> None:
        if response.stream is not None:
            self._send_stream(response)
            return
        if isinstance(response.body, (dict, list)):
            data = json.dumps(response.body).encode()
        else:
            data = str(response.body).encode()
        self.send_response(response.code)
        self.send_header("Content-Type", response.content_type)
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Cache-Control", "no-cache, private")
        self.end_headers()
        self.wfile.write(data)

    def _send_stream(self, response: Response) -> None:
        self.send_response(response.code)
        self.send_header("Content-Type", response.content_type)
        self.send_header("Transfer-Encoding", "chunked")
        self.send_header("Cache-Control", "no-cache, private")
        self.end_headers()
        try:
            for piece in response.stream:
                if piece:
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(piece), piece))
                    self.wfile.flush()
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()
        except OSError:  # the client went away
            self.close_connection = True
        finally:
            response.stream.close()

    def _client_gone(self) -> bool:
        """Whether the client closed the connection (no request is pipelined in a stream)."""
        try:
            readable, _, _ = select.select([self.connection], [], [], 0)
            return bool(readable) and self.connection.recv(1, socket.MSG_PEEK) == b""
        except OSError:
            return True


# --------------------------------------------------------------------------------------
# The public class
# --------------------------------------------------------------------------------------
class FakeKubeCluster:
    """An in-repo fake of the Kubernetes core/v1 API for tests; NOT a real cluster.

    One fake node ``fake-node`` with ``node_cpu`` CPUs, ``node_memory`` memory, ``node_gpus``
    ``nvidia.com/gpu`` and room for ``node_pods`` pods. Pods run as local processes
    (``kubelet="process"``, the only mode). Drive it with the real ``kubernetes`` client
    through :attr:`kubeconfig_path` or :meth:`api_client`.

    PIDs: by default every pod is in this host's PID namespace, which a real cluster
    gives only to pods with ``hostPID: true`` on one node. ``pid_namespaces=True`` (root,
    util-linux ``unshare``) gives each pod without ``hostPID`` a namespace of its own, as
    a real node does: its process is pid 1 there, with pid 1's signal rules. Signals
    to the pod reach ``unshare``, which ignores SIGTERM (a real kubelet's SIGTERM
    reaches the process) and whose death by SIGKILL kills the process. Not the
    default: the other tests were written against host pids (docs/backends.md lists
    the five that fail with it, and why).

    Test hooks: :attr:`unpullable` (image substrings that fail to pull), :meth:`evict`,
    :meth:`compact` (expire watch history), :meth:`pod_pid`, :meth:`log_path`.
    """

    def __init__(self, node_cpu: Any = 16, node_memory: Any = "16Gi", kubelet: str = "process",
                 *, node_gpus: int = 0, node_pods: int = 110, token: Optional[str] = None,
                 workdir: Optional[str] = None, poll_interval: float = 0.2,
                 pull_backoff: float = 0.5, restart_backoff: float = 0.5,
                 service_env: bool = True, max_events: int = 10000,
                 pid_namespaces: bool = False) -> None:
        if kubelet != "process":
            raise ValueError(f"unsupported fake kubelet {kubelet!r}: only 'process' exists "
                             "(a 'docker' kubelet is not implemented)")
        for quantity in (node_cpu, node_memory):
            parse_quantity(quantity)  # fail early on a bad value
        self.node_cpu, self.node_memory = str(node_cpu), str(node_memory)
        self.node_gpus, self.node_pods = int(node_gpus), int(node_pods)
        self.kubelet_mode = kubelet
        self.token = token or f"fake-token-{uuid.uuid4().hex}"
        self.poll_interval = poll_interval
        self.pull_backoff = pull_backoff
        self.restart_backoff = restart_backoff
        self.service_env = service_env
        self.pid_namespaces = pid_namespaces
        #: an image whose name contains any of these strings fails to pull
        self.unpullable: Set[str] = {"does-not-exist"}
        self.namespaces: Set[str] = set(DEFAULT_NAMESPACES)
        self.cond = threading.Condition(threading.RLock())
        self.store = Store(self.cond, max_events)
        self.kubelet = Kubelet(self)
        self._own_workdir = workdir is None
        self.workdir = workdir or ""
        self.host = "127.0.0.1"
        self.port = 0
        self.kubeconfig_path = ""
        self.started_at = time.time()
        self.stopping = False
        self._server: Optional[_Server] = None
        self._thread: Optional[threading.Thread] = None

    # -- lifecycle ----------------------------------------------------------------------
    def start(self) -> "FakeKubeCluster":
        """Serve on 127.0.0.1:<free port> in a background thread and write the kubeconfig."""
        if self._server is not None:
            return self
        if self._own_workdir:
            self.workdir = tempfile.mkdtemp(prefix="fake-kube-")
        os.makedirs(self.workdir, exist_ok=True)
        self._server = _Server((self.host, 0), self)
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever,
                                        kwargs={"poll_interval": 0.1}, daemon=True,
                                        name="fake-kube-apiserver")
        self._thread.start()
        self.kubeconfig_path = self._write_kubeconfig()
        logger.info("fake Kubernetes API (NOT a real cluster) at %s", self.url)
        return self

    def stop(self) -> None:
        """Kill every pod's processes, stop the server, remove the temporary workdir."""
        if self._server is None:
            return
        with self.cond:
            self.stopping = True
            self.cond.notify_all()
        self.kubelet.stop_all()
        self._server.shutdown()
        self._server.close_connections()
        self._server.server_close()
        if self._thread is not None:
            self._thread.join(10)
        self._server = None
        if self._own_workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self) -> "FakeKubeCluster":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def _write_kubeconfig(self) -> str:
        config = {
            "apiVersion": "v1", "kind": "Config", "preferences": {},
            "clusters": [{"name": "fake", "cluster": {"server": self.url}}],
            "users": [{"name": "fake", "user": {"token": self.token}}],
            "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "fake",
                                                      "namespace": "default"}}],
            "current-context": "fake",
        }
        path = os.path.join(self.workdir, "kubeconfig")
        with open(path, "w", encoding="utf-8") as out:
            json.dump(config, out, indent=2)  # JSON is YAML: load_kube_config reads it
        return path

    def api_client(self) -> Any:
        """A ``kubernetes.client.ApiClient`` configured from :attr:`kubeconfig_path`."""
        from kubernetes import config  # the fake itself needs only the stdlib and psutil
        return config.new_client_from_config(config_file=self.kubeconfig_path)

    # -- test hooks ---------------------------------------------------------------------
    def is_unpullable(self, image: str) -> bool:
        """Whether the fake kubelet fails to pull ``image`` (see :attr:`unpullable`)."""
        return any(part in image for part in self.unpullable)

    def evict(self, namespace: str, name: str,
              message: str = "The node was low on resource: memory.") -> None:
        """Evict a pod as the kubelet does under node pressure: kill its processes and
        report phase Failed, reason ``Evicted`` and ``message``. KeyError if no such pod."""
        with self.cond:
            pod = self.store.get("Pod", namespace, name)
            if pod is None:
                raise KeyError(f"no pod {namespace}/{name}")
            rt = self.kubelet.runtime(pod["metadata"]["uid"])
            if rt is not None:
                self.kubelet.evict(rt, message)
                return
            new = copy.deepcopy(pod)  # not bound yet: fail it in place
            new["status"].update(phase="Failed", reason="Evicted", message=message)
            self.kubelet.unbound.pop(pod["metadata"]["uid"], None)
            self.store.replace(new)

    def compact(self) -> None:
        """Forget the watch history: watches from an older resourceVersion get 410 Expired."""
        self.store.compact()

    def pod_pid(self, namespace: str, name: str) -> Optional[int]:
        """The pid of the pod's current container process (None if it has none)."""
        with self.cond:
            pod = self.store.get("Pod", namespace, name)
            rt = pod and self.kubelet.runtime(pod["metadata"]["uid"])
            return rt.proc.pid if rt and rt.proc is not None else None

    def log_path(self, namespace: str, name: str) -> Optional[str]:
        """The file holding the pod's current container log (None before it started)."""
        with self.cond:
            pod = self.store.get("Pod", namespace, name)
            rt = pod and self.kubelet.runtime(pod["metadata"]["uid"])
            return rt.log_path(rt.attempts) if rt and rt.attempts else None

    # -- objects: creation, deletion and garbage collection -----------------------------
    def add_object(self, obj: dict) -> dict:
        """Store a new (validated) object; schedule pods; collect an orphan at once."""
        with self.cond:
            stored = self.store.add(obj)
            if obj["kind"] == "Pod":
                self.kubelet.add(stored)
            if stored["metadata"].get("ownerReferences") and not self._has_live_owner(stored):
                logger.info("fake GC: %s %s/%s has no live owner: deleting it", obj["kind"],
                            stored["metadata"]["namespace"], stored["metadata"]["name"])
                self.delete_object(obj["kind"], stored["metadata"]["namespace"],
                                   stored["metadata"]["name"])
            if obj["kind"] == "Pod":
                self.kubelet.schedule()
            return stored

    def delete_object(self, kind: str, ns: str, name: str, grace: Optional[int] = None,
                      propagation: str = "Background") -> Optional[dict]:
        """Delete like the API server: pods with a live process terminate gracefully first
        (the returned pod carries deletionTimestamp), anything else goes at once."""
        with self.cond:
            obj = self.store.get(kind, ns, name)
            if obj is None:
                return None
            if propagation == "Orphan":
                self._orphan_dependents(obj)
            elif propagation == "Foreground":
                for dep in self._dependents(obj):
                    self.delete_object(dep["kind"], ns, dep["metadata"]["name"],
                                       propagation="Foreground")
            if kind != "Pod":
                return self.remove_object(kind, ns, name)
            return self._delete_pod(obj, grace)

    def _delete_pod(self, pod: dict, grace: Optional[int]) -> Optional[dict]:
        meta = pod["metadata"]
        if grace is None:
            grace = pod["spec"].get("terminationGracePeriodSeconds", 30)
        rt = self.kubelet.runtime(meta["uid"])
        if rt is None or rt.done or grace == 0:
            return self.remove_object("Pod", meta["namespace"], meta["name"])
        current = meta.get("deletionGracePeriodSeconds")
        if current is None or grace < current:
            new = copy.deepcopy(pod)
            new["metadata"]["deletionTimestamp"] = _ts(time.time() + grace)
            new["metadata"]["deletionGracePeriodSeconds"] = grace
            pod = self.store.replace(new)
            self.kubelet.request_stop(rt, grace)
        return pod

    def remove_object(self, kind: str, ns: str, name: str,
                      uid: Optional[str] = None) -> Optional[dict]:
        """Take an object out of the store (DELETED), then collect its dependents."""
        with self.cond:
            current = self.store.get(kind, ns, name)
            if current is None or (uid is not None and current["metadata"]["uid"] != uid):
                return None
            obj = self.store.remove(kind, ns, name)
            if kind == "Pod":
                self.kubelet.forget(obj["metadata"]["uid"])
            for dep in self._dependents(obj):
                if not self._has_live_owner(dep):
                    self.delete_object(dep["kind"], ns, dep["metadata"]["name"])
            if kind == "Pod":
                self.kubelet.schedule()
            return obj

    def _dependents(self, owner: dict) -> List[dict]:
        uid, ns = owner["metadata"]["uid"], owner["metadata"]["namespace"]
        return [obj for kind in KINDS.values() for obj in self.store.values(kind, ns)
                if any(ref.get("uid") == uid
                       for ref in obj["metadata"].get("ownerReferences") or [])]

    def _has_live_owner(self, obj: dict) -> bool:
        """Whether any owner still exists (owners of kinds this fake does not serve are
        assumed to exist)."""
        ns = obj["metadata"]["namespace"]
        for ref in obj["metadata"].get("ownerReferences") or []:
            if ref.get("kind") not in PLURALS or ref.get("apiVersion") != "v1":
                return True
            owner = self.store.get(ref["kind"], ns, ref.get("name", ""))
            if owner is not None and owner["metadata"]["uid"] == ref.get("uid"):
                return True
        return False

    def _orphan_dependents(self, owner: dict) -> None:
        uid = owner["metadata"]["uid"]
        for dep in self._dependents(owner):
            new = copy.deepcopy(dep)
            refs = [r for r in new["metadata"]["ownerReferences"] if r.get("uid") != uid]
            if refs:
                new["metadata"]["ownerReferences"] = refs
            else:
                del new["metadata"]["ownerReferences"]
            self.store.replace(new)

    # -- what the kubelet needs ---------------------------------------------------------
    def node(self) -> dict:
        """The ``fake-node`` Node object."""
        capacity = {"cpu": self.node_cpu, "memory": self.node_memory,
                    "pods": str(self.node_pods), "ephemeral-storage": "100Gi"}
        if self.node_gpus:
            capacity[GPU] = str(self.node_gpus)
        info = {"architecture": "amd64", "bootID": "fake", "containerRuntimeVersion":
                f"fake-{self.kubelet_mode}://0", "kernelVersion": os.uname().release,
                "kubeProxyVersion": KUBE_VERSION["gitVersion"],
                "kubeletVersion": KUBE_VERSION["gitVersion"], "machineID": "fake",
                "operatingSystem": "linux", "osImage": "fake", "systemUUID": "fake"}
        return {"kind": "Node", "apiVersion": "v1",
                "metadata": {"name": NODE_NAME, "uid": str(uuid.uuid5(uuid.NAMESPACE_DNS,
                                                                       NODE_NAME)),
                             "resourceVersion": "1",
                             "creationTimestamp": _ts(self.started_at),
                             "labels": dict(NODE_LABELS)},
                "spec": {},
                "status": {"capacity": capacity, "allocatable": dict(capacity),
                           "conditions": [{"type": "Ready", "status": "True",
                                           "reason": "KubeletReady",
                                           "message": "kubelet is posting ready status"}],
                           "addresses": [{"type": "InternalIP", "address": HOST_IP},
                                         {"type": "Hostname", "address": NODE_NAME}],
                           "nodeInfo": info}}

    def container_env(self, ns: str, pod_name: str, container: dict) -> Dict[str, str]:
        """The container's environment: PATH/HOME/LANG of this process, HOSTNAME, the
        kubernetes service variables, then envFrom and env (ConfigError if unresolvable)."""
        with self.cond:
            pod = self.store.get("Pod", ns, pod_name)
            if pod is None:
                raise ConfigError("CreateContainerConfigError", "pod is gone")
            env = {k: os.environ[k] for k in BASE_ENV_VARS if k in os.environ}
            env["HOSTNAME"] = pod_name
            if self.service_env:
                env.update(KUBERNETES_SERVICE_HOST=self.host,
                           KUBERNETES_SERVICE_PORT=str(self.port),
                           KUBERNETES_PORT=f"tcp://{self.host}:{self.port}")
            for source in container.get("envFrom") or []:
                env.update(self._env_from(ns, source))
            for var in container.get("env") or []:
                value = self._env_value(pod, container, var, env)
                if value is not None:
                    env[var["name"]] = value
            return env

    def _env_from(self, ns: str, source: dict) -> Dict[str, str]:
        kind, ref = ("Secret", source.get("secretRef")) if source.get("secretRef") else \
            ("ConfigMap", source.get("configMapRef") or {})
        obj = self.store.get(kind, ns, ref.get("name", ""))
        if obj is None:
            if ref.get("optional"):
                return {}
            raise ConfigError("CreateContainerConfigError",
                              f'{kind.lower()} "{ref.get("name")}" not found')
        prefix = source.get("prefix", "")
        return {prefix + key: self._config_value(obj, key) for key in obj.get("data") or {}
                if _ENV_NAME.match(prefix + key)}

    def _env_value(self, pod: dict, container: dict, var: dict,
                   env: Dict[str, str]) -> Optional[str]:
        source = var.get("valueFrom")
        if not source:
            return expand_vars(var.get("value") or "", env)
        for field, kind in (("secretKeyRef", "Secret"), ("configMapKeyRef", "ConfigMap")):
            if source.get(field):
                return self._key_ref(kind, pod["metadata"]["namespace"], source[field])
        if source.get("fieldRef"):
            return _field_ref(pod, source["fieldRef"]["fieldPath"])
        return self._resource_ref(container, source["resourceFieldRef"])

    def _key_ref(self, kind: str, ns: str, ref: dict) -> Optional[str]:
        obj = self.store.get(kind, ns, ref["name"])
        if obj is None:
            if ref.get("optional"):
                return None
            raise ConfigError("CreateContainerConfigError",
                              f'{kind.lower()} "{ref["name"]}" not found')
        if ref["key"] not in (obj.get("data") or {}):
            if ref.get("optional"):
                return None
            raise ConfigError("CreateContainerConfigError",
                              f"couldn't find key {ref['key']} in {kind} {ns}/{ref['name']}")
        return self._config_value(obj, ref["key"])

    @staticmethod
    def _config_value(obj: dict, key: str) -> str:
        value = obj["data"][key]
        if obj["kind"] == "Secret":
            return base64.b64decode(value).decode("utf-8", "replace")
        return value

    def _resource_ref(self, container: dict, ref: dict) -> str:
        part, _, name = ref.get("resource", "").partition(".")
        resources = container.get("resources") or {}
        value = (resources.get(part) or {}).get(name)
        if value is None:  # limits default to the node's allocatable, requests to 0
            value = self.kubelet.capacity().get(name, 0) if part == "limits" else 0
        amount = parse_quantity(value) / parse_quantity(ref.get("divisor") or "1")
        return str(math.ceil(amount))  # rounded up, like the kubelet


def _field_ref(pod: dict, path: str) -> str:
    """The value of a downward-API ``fieldRef``."""
    meta = pod["metadata"]
    match = re.match(r"^metadata\.(labels|annotations)\['(.+)'\]$", path)
    if match:
        return (meta.get(match.group(1)) or {}).get(match.group(2), "")
    values = {"metadata.name": meta["name"], "metadata.namespace": meta["namespace"],
              "metadata.uid": meta["uid"], "spec.nodeName": NODE_NAME,
              "spec.serviceAccountName": pod["spec"].get("serviceAccountName", "default"),
              "status.hostIP": HOST_IP, "status.hostIPs": HOST_IP,
              "status.podIP": POD_IP, "status.podIPs": POD_IP}
    return values.get(path, "")
