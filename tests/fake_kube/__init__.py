"""FakeKubeCluster: an in-repo fake of the Kubernetes core/v1 API for tests; NOT a real cluster.

No kube-apiserver, kubelet, k3s or kind can run on the project's machines (see
/work/shared/INFRA.md), so the Kubernetes backend is tested against this fake, driven by the
official ``kubernetes`` Python client exactly as a real cluster would be:

- an HTTP server (plain HTTP on 127.0.0.1, bearer-token auth) that serves the part of the
  core/v1 REST API a job backend uses -- pods (create, get, list, watch, delete, delete
  collection, merge patch, log, status), secrets, configmaps, namespaces, the node and
  ``/version`` -- with the JSON shapes, ``Status`` errors, resourceVersions and watch events of
  the real API server;
- a scheduler that binds each pod onto the single node ``fake-node`` when its resource requests
  fit, or leaves it ``Pending`` with ``PodScheduled=False, reason=Unschedulable``;
- a fake kubelet (``kubelet="process"``) that really runs ``containers[0]``'s command as a local
  process (in its own session, with only the environment the pod spec gives it), captures its
  output as the container log, enforces the memory limit by polling RSS, honours deletion grace
  periods, ``activeDeadlineSeconds`` and ``restartPolicy``, and reports phases and container
  states as a kubelet does;
- the owner-reference garbage collector (background propagation).

Typical use::

    with FakeKubeCluster(node_cpu=4, node_memory="8Gi") as cluster:
        v1 = kubernetes.client.CoreV1Api(cluster.api_client())
        # or: kubernetes.config.load_kube_config(config_file=cluster.kubeconfig_path)

Everything here is a test double: behaviour that is not listed above (TLS, RBAC, admission,
init containers, volumes, probes, ...) is missing, see tests/FAKE_KUBE_README.md.

The implementation is split by responsibility: ``objects`` (constants, Status errors,
quantities, name/label validation, selectors), ``store`` (the versioned store, object
validation, defaults, merge patch), ``kubelet`` (the fake scheduler and kubelet), ``api`` (the
core/v1 REST routes) and ``cluster`` (the HTTP server and ``FakeKubeCluster``).
"""
from __future__ import annotations

from .cluster import FakeKubeCluster

__all__ = ["FakeKubeCluster"]
