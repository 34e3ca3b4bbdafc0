"""Shared fixtures: every test must leave no child process behind; pools made by a
test are terminated when it ends."""
import os
import time

import psutil
import pytest

import fiberrl


def _children():
    return {p.pid: p for p in psutil.Process().children(recursive=True)}


@pytest.fixture(autouse=True)
def no_leaked_processes():
    """Fail a test that leaves processes behind (after a short grace to exit)."""
    before = set(_children())
    yield
    deadline = time.monotonic() + 10.0
    leaked = {}
    while time.monotonic() < deadline:
        leaked = {pid: p for pid, p in _children().items()
                  if pid not in before and p.is_running() and p.status() != psutil.STATUS_ZOMBIE}
        if not leaked:
            return
        time.sleep(0.1)
    for proc in leaked.values():
        try:
            proc.kill()
        except psutil.Error:
            pass
    pytest.fail(f"test leaked processes: {[_describe(p) for p in leaked.values()]}")


def _describe(proc):
    try:
        return proc.cmdline()
    except psutil.Error as exc:
        return f"pid {proc.pid} ({type(exc).__name__})"


@pytest.fixture
def make_pool():
    """Pools made by a test, terminated and joined when it ends (pass or fail)."""
    made = []

    def make(*args, **kwargs):
        made.append(fiberrl.Pool(*args, **kwargs))
        return made[-1]

    yield make
    for p in made:
        p.terminate()
    for p in made:
        p.join()


# -- one test body, several backends ---------------------------------------------------
# A test marked ``@pytest.mark.any_backend`` runs once per backend in BACKENDS: on the
# local backend, and as Slurm jobs on the real one-node test cluster.
BACKENDS = ("local", "slurm")


def pytest_generate_tests(metafunc):
    if metafunc.definition.get_closest_marker("any_backend"):
        metafunc.parametrize("fiberrl_backend", BACKENDS, indirect=True)


@pytest.fixture(autouse=True)
def fiberrl_backend(request, tmp_path_factory):
    """The backend a test runs on (``local`` unless the test is bound to several)."""
    name = getattr(request, "param", "local")
    if name == "local":
        yield name
        return
    import slurm_cluster
    conf = slurm_cluster.up("single")
    os.environ["SLURM_CONF"] = conf
    fiberrl.init(backend="slurm", extra={
        "slurm_log_dir": str(tmp_path_factory.mktemp("slurm-logs"))})
    try:
        yield name
    finally:
        fiberrl.init()
        slurm_cluster.assert_no_live_jobs(conf)


@pytest.fixture(scope="session", autouse=True)
def _slurm_clusters_down_at_the_end():
    yield
    import slurm_cluster
    slurm_cluster.down_all()
