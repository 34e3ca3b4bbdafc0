"""Shared fixtures: every test must leave no child process behind; pools made by a
test are terminated when it ends. Also the session's signal state (below)."""
import os
import signal
import time

import psutil
import pytest

import fiberrl
import side_by_side
from fiberrl._wire.sockets import default_listen_host


def take_ctrl_c_as_in_a_terminal() -> None:
    """Give this process, and so every process a test starts, the SIGINT handling of
    a command typed at a terminal: Python's ``KeyboardInterrupt`` handler, SIGINT not
    blocked.

    A process started with SIGINT ignored passes that on to its children, and Python
    installs no ``KeyboardInterrupt`` handler then. A non-interactive shell starts its
    background commands so (``bash scripts/test.sh > log &`` in a script), and so do
    ``nohup`` and some CI runners. The Ctrl-C tests (tests/test_interrupt.py, CPython's
    ``test_wait_result``...) send SIGINT on purpose and need the usual handling,
    whatever way the suite itself was started. (fiberrl keeps an ignored SIGINT
    ignored, as the stdlib does: tests/test_interrupt.py checks that too, in children
    started with SIGINT ignored on purpose.)"""
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    if hasattr(signal, "pthread_sigmask"):
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


# before any test, fixture or plugin starts a subprocess
take_ctrl_c_as_in_a_terminal()


def _children():
    """This process's descendants, less the helpers that live as long as this process
    by design: the local backend's fork servers (every job they fork is still counted)
    and the stdlib's resource tracker (started by the first SharedMemory block)."""
    return {p.pid: p for p in psutil.Process().children(recursive=True) if not _is_helper(p)}


_HELPERS = ("fiberrl.backends.local", "from multiprocessing.resource_tracker import main")


def _is_helper(proc):
    try:
        cmdline = proc.cmdline()
    except psutil.Error:
        return False
    return any(helper in cmdline or any(helper in arg for arg in cmdline) for helper in _HELPERS)


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
# local backend, as Slurm jobs on the real one-node test cluster, as containers of the
# real dockerd, and as pods of the FAKE Kubernetes API server (tests/backend_bindings.py).
BACKENDS = ("local", "slurm", "docker", "kubernetes")

# Jobs in containers (and on other hosts) must reach this process's hub: listen on
# this machine's routable address rather than loopback, for every backend alike.
os.environ.setdefault("FIBERRL_LISTEN_HOST", default_listen_host())


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
    import backend_bindings
    with backend_bindings.bound(name, tmp_path_factory.mktemp(f"{name}-jobs")):
        yield name


@pytest.fixture(scope="session", autouse=True)
def _backends_down_at_the_end():
    yield
    import backend_bindings
    import slurm_cluster
    slurm_cluster.down_all()
    backend_bindings.docker_down()
    backend_bindings.kube_down()


# -- two test processes side by side (pytest-xdist; see tests/side_by_side.py) -------------
def pytest_configure(config):
    workerinput = getattr(config, "workerinput", None)
    side_by_side.state.update(worker=workerinput is not None,
                              grouped=bool(workerinput and workerinput.get("side_by_side")))


def _grouping(config) -> bool:
    return config.getvalue("dist") == "loadgroup"


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """``--dist loadgroup``: each group of tests/side_by_side.py is one unit of work,
    run by one worker in collection order."""
    if not _grouping(config):
        return None
    from xdist.scheduler import LoadScopeScheduling

    class GroupScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid):
            return side_by_side.group_of(nodeid)

    return GroupScheduling(config, log)


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node):
    """Tell each worker whether its groups are kept together."""
    node.workerinput["side_by_side"] = _grouping(node.config)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    """Before any fixture of the test starts a cluster: which group the test is in."""
    side_by_side.state.update(group=side_by_side.group_of(item.nodeid), test=item.nodeid)
