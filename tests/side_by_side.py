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

Every other test runs with the rest of its file (a group named by the file), in the
file's order, as in a serial run: the blocks of a document in tests/test_docs.py
build on each other, and a module's fixtures are made once.

The groups are told from test ids alone (pytest-xdist's scheduler, in the controlling
process, has nothing else): tests/conftest.py gives pytest-xdist a scheduler that keeps
each group on one worker (``--dist loadgroup``; its own reading of ``xdist_group``
marks does not work with pytest 9). A test that uses a cluster without being in its
group fails at once (:func:`require`), rather than disturbing a test of the other
process.
"""
import re

import pytest

CLUSTERS = "clusters"
KUBERNETES = "kubernetes"
#: files whose every test uses Slurm or Docker
CLUSTER_FILES = {"test_slurm.py", "test_slurm_warm.py", "test_docker.py"}

#: set by tests/conftest.py: whether this process is a pytest-xdist worker whose
#: controller keeps the groups together, and the group of the test that runs now
state = {"worker": False, "grouped": False, "group": None, "test": None}


def group_of(nodeid: str) -> str:
    """The group of the test ``nodeid``: a cluster's, else its file's."""
    path, _, name = nodeid.partition("::")
    filename = path.rsplit("/", 1)[-1]
    if filename in CLUSTER_FILES or re.search(r"slurm|docker", name):
        return CLUSTERS   # by name or by parameter, e.g. test_pool.py::test_map[docker-3]
    if filename == "test_kubernetes.py" or "kubernetes" in name:
        return KUBERNETES
    return filename[:-3] if filename.endswith(".py") else filename


def require(group: str, what: str) -> None:
    """Fail the running test if it uses ``what`` without being in ``group`` (only
    under pytest-xdist, where that would overlap with another test's use of it)."""
    if state["worker"] and (not state["grouped"] or state["group"] != group):
        pytest.fail(f"{state['test']} uses {what} but pytest-xdist does not run it in the "
                    f"group {group!r}: run with --dist loadgroup (scripts/test.sh does), and "
                    f"make tests/side_by_side.py's group_of put the test there")
