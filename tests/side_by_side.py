"""Which tests share a machine-wide or session-wide cluster, so that pytest-xdist
(``scripts/test.sh`` runs the suite in two processes side by side) runs each such set
in one process, one test after the other, as a serial run does.

- ``clusters``: the real Slurm test cluster and dockerd are one per machine. A test
  fails if a Slurm job or a fiberrl container is left when it ends
  (``slurm_cluster.assert_no_live_jobs``, ``backend_bindings.assert_no_containers``):
  that holds only while no other test uses them at the same time. The session that
  started them takes them down at its end.
- ``kubernetes``: the fake Kubernetes API server is one per test process
  (``backend_bindings.fake_kube``); its users run in one process so it starts once.

Every other test may run in either process. A test that uses a cluster without being
in its group fails at once under pytest-xdist (:func:`require`), rather than
disturbing a test of the other process.
"""
import re
from typing import Optional

import pytest

CLUSTERS = "clusters"
KUBERNETES = "kubernetes"
#: files whose every test uses Slurm or Docker
CLUSTER_FILES = {"test_slurm.py", "test_slurm_warm.py", "test_docker.py"}

#: set by tests/conftest.py: whether this process is a pytest-xdist worker, and the
#: group of the test that runs now
state = {"worker": False, "group": None, "test": None}


def group_of(item) -> Optional[str]:
    """The group of a collected test (None: it uses no shared cluster)."""
    callspec = getattr(item, "callspec", None)
    params = callspec.params if callspec is not None else {}
    backend = params.get("fiberrl_backend", params.get("backend"))
    if backend in ("slurm", "docker"):
        return CLUSTERS
    if backend == "kubernetes":
        return KUBERNETES
    if (item.path.name in CLUSTER_FILES or item.get_closest_marker("slurm")
            or re.search(r"slurm|docker", item.name)):
        return CLUSTERS
    if item.path.name == "test_kubernetes.py" or "kubernetes" in item.name:
        return KUBERNETES
    return None


def require(group: str, what: str) -> None:
    """Fail the running test if it uses ``what`` without being in ``group`` (only
    under pytest-xdist, where that would overlap with another test's use of it)."""
    if state["worker"] and state["group"] != group:
        pytest.fail(f"{state['test']} uses {what} but is not in the xdist group {group!r}: "
                    f"make tests/side_by_side.py's group_of put it there")
