"""Every row of docs/compatibility.md's "Coming from Uber Fiber" table, run.

The rows are read from the page; each has a check below, keyed by the row's first
cell, and a row without a check (or a check without a row) fails the test, so the
table and this file cannot drift apart. A check uses the fiberrl side of its row the
way a Fiber program used the Fiber side, or, for what is not carried over, shows
that fiberrl says so clearly and that the named replacement works.
"""
import dataclasses
import importlib
import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import fiberrl
import fiberrl.config
import pool_helpers
from fiberrl.errors import ConfigError

DOC = Path(__file__).resolve().parent.parent / "docs" / "compatibility.md"
GET = 120


def table_rows():
    """The first cell of each row of the "Coming from Uber Fiber" table."""
    text = DOC.read_text(encoding="utf-8").split("## Coming from Uber Fiber", 1)[1]
    text = text.split("\n## ", 1)[0]
    rows = [line for line in text.splitlines() if line.startswith("| ")]
    return [re.split(r" \| ", row[2:], maxsplit=1)[0] for row in rows[1:]]   # no header


CHECKS = {}


def check(first_cell):
    def register(fn):
        CHECKS[first_cell] = fn
        return fn
    return register


class Calculator:
    def add(self, a, b):
        return a + b

    def child(self):
        return Calculator()


@pytest.fixture(autouse=True)
def _defaults_after():
    yield
    fiberrl.config.reset()


# -- carried over -------------------------------------------------------------------------
@check("`fiber.Process`")
def _process(tmp_path):
    proc = fiberrl.Process(target=pool_helpers.touch, args=(str(tmp_path / "ran"),))
    proc.start()
    proc.join(60)
    assert proc.exitcode == 0 and (tmp_path / "ran").exists()


@check("`fiber.Pool`")
def _pool(tmp_path):
    with fiberrl.Pool() as pool:
        assert pool.processes == (os.cpu_count() or 1)
        assert pool.map(pool_helpers.square, range(10)) == [x * x for x in range(10)]
        assert pool.apply(pool_helpers.power, (2,), {"exp": 3}) == 8


@check("`Pool(error_handling=True)`")
def _error_handling(tmp_path):
    with fiberrl.Pool(2, error_handling=True) as pool:
        task = pool_helpers.raise_first_runs
        assert pool.starmap(task, [(str(tmp_path), {1: 1}, x) for x in range(4)]) == [0, 1, 4, 9]
        assert pool.stats().error_reruns == 1


@check("`Pool.start_workers`")
def _start_workers(tmp_path):
    with fiberrl.Pool(1, idle_timeout=60) as pool:
        pool.start_workers()
        assert pool_helpers.wait_until(lambda: pool.stats().alive == 1, 60), pool.stats()


@check("`Pool.wait_until_workers_up`")
def _wait_until_workers_up(tmp_path):
    with fiberrl.Pool(2) as pool:
        pool.wait_until_workers_up(timeout=60)
        assert pool.stats().alive == 2


@check("`fiber.SimpleQueue`")
def _simple_queue(tmp_path):
    q = fiberrl.SimpleQueue()
    q.put("item")
    assert not q.empty() and q.get() == "item"


@check("`SimpleQueue.reader`")
def _reader(tmp_path):
    q = fiberrl.SimpleQueue()
    q.put(1)
    assert q.reader.recv() == 1
    q.close()
    assert q.reader.closed and q._reader.closed


@check("`SimpleQueue.writer`")
def _writer(tmp_path):
    q = fiberrl.SimpleQueue()
    q.writer.send(2)
    assert q.get() == 2
    q.close()
    assert q.writer.closed and q._writer.closed


@check("`fiber.Pipe`")
def _pipe(tmp_path):
    left, right = fiberrl.Pipe()
    left.send(b"hello")
    assert right.recv() == b"hello"


@check("`fiber.queues.Pipe`")
def _queues_pipe(tmp_path):
    from fiberrl.queues import Pipe
    import fiberrl.connection
    assert Pipe is fiberrl.connection.Pipe
    reader, writer = Pipe(duplex=False)
    writer.send("one way")
    assert reader.recv() == "one way"


@check("`fiber.queues.SimpleQueue`")
def _queues_simple_queue(tmp_path):
    from fiberrl.queues import SimpleQueue
    q = SimpleQueue()
    q.put(3)
    assert q.get() == 3


@check("`fiber.Manager`")
def _manager(tmp_path):
    with fiberrl.Manager() as manager:
        shared = manager.dict()
        shared["name"] = "managed_dict"
        assert dict(shared) == {"name": "managed_dict"}


@check("`fiber.managers.BaseManager`")
def _base_manager(tmp_path):
    class CalcManager(fiberrl.managers.BaseManager):
        pass
    CalcManager.register("Calculator", Calculator)
    with CalcManager() as manager:
        assert manager.Calculator().add(1, 2) == 3


@check("`fiber.managers.SyncManager`")
def _sync_manager(tmp_path):
    manager = fiberrl.managers.SyncManager()
    manager.start()
    try:
        items = manager.list()
        items.append("x")
        assert list(items) == ["x"]
    finally:
        manager.shutdown()


@check("`fiber.managers.AsyncManager`")
def _async_manager(tmp_path):
    from fiberrl.managers import AsyncManager

    class MyManager(AsyncManager):
        pass
    MyManager.register("Calculator", Calculator)
    with MyManager() as manager:
        calc = manager.Calculator()
        assert calc.add(10, 32).get() == 42


@check("`fiber.managers.AsyncProxyResult`")
def _async_proxy_result(tmp_path):
    import concurrent.futures
    from fiberrl.managers import AsyncManager, AsyncProxyResult

    class MyManager(AsyncManager):
        pass
    MyManager.register("Calculator", Calculator, method_to_typeid={"child": "ReturnedCalculator"})
    MyManager.register("ReturnedCalculator", create_method=False)   # wraps what child() returns
    with MyManager() as manager:
        calc = manager.Calculator()
        handle = calc.add(1, 2)
        assert isinstance(handle, AsyncProxyResult)
        assert isinstance(handle, concurrent.futures.Future)
        handle.wait()
        assert handle.ready() and handle.successful() and handle.get(timeout=GET) == 3
        child = calc.child().get(timeout=GET)   # a #PROXY result: a proxy
        assert child.add(2, 2) == 4


@check("`fiber.current_process`")
def _current_process(tmp_path):
    assert fiberrl.current_process().name == "MainProcess"


@check("`fiber.active_children`")
def _active_children(tmp_path):
    assert fiberrl.active_children() == []


@check("`fiber.cpu_count`")
def _cpu_count(tmp_path):
    assert fiberrl.cpu_count() == os.cpu_count()


@check("`fiber.get_context`")
def _get_context(tmp_path):
    ctx = fiberrl.get_context("spawn")
    proc = ctx.Process(target=pool_helpers.touch, args=(str(tmp_path / "spawned"),))
    proc.start()
    proc.join(60)
    assert proc.exitcode == 0 and (tmp_path / "spawned").exists()
    assert fiberrl.get_context("fork").get_start_method() == "fork"


@fiberrl.meta(cpu=1, memory=64, gpu=0)
def _fiber_style_target(path):
    pool_helpers.touch(path)


@check("`fiber.meta`")
def _meta(tmp_path):
    from fiberrl.resources import hints_of
    assert hints_of(_fiber_style_target) == {"cpu": 1, "mem": 64 << 20, "gpu": 0}
    assert hints_of(fiberrl.meta(mem="1G", time_limit=60)(lambda: None)) == {
        "mem": 1 << 30, "time_limit": 60}
    with pytest.raises(TypeError, match="not both"):
        fiberrl.meta(mem="1G", memory=1000)
    proc = fiberrl.Process(target=_fiber_style_target, args=(str(tmp_path / "meta"),))
    assert proc._resources["mem"] == 64 << 20
    proc.start()
    proc.join(60)
    assert proc.exitcode == 0


@check("`fiber.meta` on a pool's task")
def _meta_on_pool_tasks(tmp_path):
    with fiberrl.Pool(1, cpu=1, mem="256M") as pool:
        pool.apply(_fiber_style_target, (str(tmp_path / "task"),))   # its hints are not used
        assert (tmp_path / "task").exists()


@check("`fiber.init`")
def _init(tmp_path):
    assert fiberrl.init(backend="local", log_level="debug").log_level == "debug"
    with pytest.raises(ConfigError, match="valid keys: backend"):
        fiberrl.init(cpu_per_job=2)


@check("`fiber.reset`")
def _reset(tmp_path):
    default = fiberrl.config.get_config().heartbeat_timeout
    for reset in (fiberrl.reset, fiberrl.config.reset):
        fiberrl.init(heartbeat_timeout=default + 5)
        reset()
        assert fiberrl.config.get_config().heartbeat_timeout == default


@check("`fiber.config.<key>`")
def _config_key(tmp_path):
    import logging
    import fiberrl.config as fiber_config   # as Fiber's programs and tests use it
    assert fiberrl.config.default_backend == fiber_config.backend == "local"
    assert fiber_config.log_level == logging.WARNING
    assert fiber_config.image is None and fiber_config.default_image == "fiberrl-worker:cpu"
    assert fiber_config.kubernetes_namespace == "default" and fiber_config.mem_per_job is None
    fiber_config.log_level = logging.DEBUG
    fiber_config.mem_per_job = 512      # Fiber's megabytes
    fiber_config.kubernetes_namespace = "rl"
    fiber_config.image = "python:3.11-slim"
    config = fiberrl.config.get_config()
    assert (config.log_level, config.mem, config.extra["k8s_namespace"], config.image) == (
        "DEBUG", "512M", "rl", "python:3.11-slim")
    assert fiber_config.log_level == logging.DEBUG and fiber_config.mem_per_job == "512M"
    assert fiber_config.cpu_per_job == 1   # every worker is a job of its own
    with pytest.raises(ConfigError, match="cpu_per_job.*workers_per_job"):
        fiber_config.cpu_per_job = 2
    # Fiber's own switches are kept as set, and change nothing (the rows below)
    assert (fiber_config.ipc_active, fiber_config.log_file) == (True, None)
    fiber_config.ipc_active = False
    assert fiber_config.ipc_active is False
    fiber_config.ipc_active = True
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.backend = "docker"
    fiber_config.backend = "local"
    assert fiberrl.config.get_config().backend == "local"


@check("`.fiberconfig`")
def _config_file(tmp_path):
    path = tmp_path / "fiberrl.toml"
    path.write_text('heartbeat_timeout = 42.0\n')
    code = ("import fiberrl.config as c; print(c.get_config().heartbeat_timeout)")
    env = {k: v for k, v in os.environ.items() if k != "FIBERRL_CONFIG"}
    here = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=60)
    named = subprocess.run([sys.executable, "-c", code], env={**env, "FIBERRL_CONFIG": str(path)},
                           capture_output=True, text=True, timeout=60)
    assert here.stdout.strip() == named.stdout.strip() == "42.0", (here.stderr, named.stderr)


@check("`FIBER_<KEY>`")
def _environment(tmp_path):
    code = "import fiberrl.config as c; print(c.get_config().heartbeat_timeout)"
    done = subprocess.run([sys.executable, "-c", code],
                          env={**os.environ, "FIBERRL_HEARTBEAT_TIMEOUT": "33"},
                          capture_output=True, text=True, timeout=60)
    assert done.stdout.strip() == "33.0", done.stderr


@check("`backend`, `default_backend`")
def _backend_key(tmp_path):
    assert fiberrl.config.get_config().backend == "local"
    assert "default_backend" not in fiberrl.config.Config.keys()
    assert fiberrl.init(backend="local").backend == "local"


@check("`image`, `default_image`")
def _image_key(tmp_path):
    assert fiberrl.init(image="python:3.11-slim").image == "python:3.11-slim"
    with pytest.raises(ConfigError):
        fiberrl.init(default_image="python:3.11-slim")


@check("`log_level`")
def _log_level_key(tmp_path):
    assert fiberrl.init(log_level="DEBUG").log_level == "DEBUG"


@check("`log_file`")
def _log_file_key(tmp_path):
    with pytest.raises(ConfigError):
        fiberrl.init(log_file=str(tmp_path / "fiber.log"))
    proc = fiberrl.Process(target=print, args=("last words",))
    proc.start()
    proc.join(60)
    assert "last words" in proc.job_logs()


@check("`kubernetes_namespace`")
def _kubernetes_namespace_key(tmp_path):
    assert fiberrl.init(extra={"k8s_namespace": "rl"}).extra["k8s_namespace"] == "rl"


@check("`cpu_per_job`")
def _cpu_per_job_key(tmp_path):
    with fiberrl.Pool(2, workers_per_job=2) as pool:   # Slurm's; others run one per job
        assert pool.map(pool_helpers.square, range(6)) == [x * x for x in range(6)]
    with pytest.raises(ConfigError):
        fiberrl.init(cpu_per_job=2)


@check("`mem_per_job`")
def _mem_per_job_key(tmp_path):
    assert fiberrl.init(mem="512M").mem == "512M"
    with fiberrl.Pool(1, mem="256M") as pool:
        assert pool.apply(pool_helpers.square, (3,)) == 9


@check("`debug`, `ipc_active`, `ipc_admin_master_port`, `ipc_admin_worker_port`, "
       "`use_push_queue`, `merge_output`, `use_bash`")
def _internal_keys(tmp_path):
    for key in ("debug", "ipc_active", "ipc_admin_master_port", "ipc_admin_worker_port",
                "use_push_queue", "merge_output", "use_bash"):
        with pytest.raises(ConfigError, match=f"unknown fiberrl config key.*{key}"):
            fiberrl.init(**{key: True})
    assert fiberrl.init(log_level="debug").log_level == "debug"


# -- not carried over -------------------------------------------------------------------------
@check("`fiber.queues.SimpleQueuePush`")
def _simple_queue_push(tmp_path):
    import fiberrl.queues
    with pytest.raises(AttributeError):
        fiberrl.queues.SimpleQueuePush
    _simple_queue(tmp_path)


@check("`fiber.socket.Socket`, `fiber.queues.ZConnection`, `fiber.queues.LazyZConnection`")
def _sockets(tmp_path):
    import fiberrl.queues
    assert importlib.util.find_spec("fiberrl.socket") is None
    for name in ("ZConnection", "LazyZConnection"):
        assert not hasattr(fiberrl.queues, name)
    from fiberrl.connection import Client, Listener
    with Listener() as listener:
        client = Client(listener.address)
        server = listener.accept()
        client.send("signed")
        assert server.recv() == "signed"
        client.close()
        server.close()


@check("`fiber.pool.ZPool`, `fiber.pool.ResilientZPool`, `fiber.pool.ClassicPool`")
def _fiber_pools(tmp_path):
    import fiberrl.pool
    for name in ("ZPool", "ResilientZPool", "ClassicPool"):
        assert not hasattr(fiberrl.pool, name)
    _error_handling(tmp_path)


@check("`fiber.managers.AsyncListProxy`, `AsyncDictProxy`, `AsyncValueProxy`, "
       "`AsyncArrayProxy`, `AsyncBaseProxy`, `AsyncAutoProxy`, `MakeAsyncProxyType`")
def _async_proxy_types(tmp_path):
    from fiberrl.asyncproxy import asynchronous
    from fiberrl.managers import AsyncManager, ListProxy
    for name in ("AsyncListProxy", "AsyncDictProxy", "AsyncValueProxy", "AsyncArrayProxy",
                 "AsyncBaseProxy", "AsyncAutoProxy", "MakeAsyncProxyType"):
        assert not hasattr(fiberrl.managers, name)

    class ListsManager(AsyncManager):
        pass
    ListsManager.register("list", list, ListProxy)
    with ListsManager() as manager:
        items = manager.list()
        items.append(1).get(timeout=GET)
        assert items.count(1).get(timeout=GET) == 1
    with fiberrl.Manager() as manager:
        shared = asynchronous(manager.dict())
        shared.update({"a": 1}).get(timeout=GET)
        assert shared.get("a").get(timeout=GET) == 1


@check("`fiber.experimental.Ring`")
def _ring(tmp_path):
    # (tests/test_rl_distributed.py runs launch itself: two ranks, torch.distributed)
    import inspect
    distributed = importlib.import_module("rl.distributed")
    assert list(inspect.signature(distributed.launch).parameters)[:2] == ["fn", "world_size"]


@check("`fiber.backend.get_backend`, `fiber.core.Backend`")
def _backend(tmp_path):
    from fiberrl.backends import default_backend
    from fiberrl.backends.base import Backend
    assert isinstance(default_backend(), Backend)


@check("`fiber run`")
def _cli_run(tmp_path):
    script = tmp_path / "job.py"
    script.write_text("print('ran as a job')\n")
    done = subprocess.run([sys.executable, "-m", "fiberrl.cli", "run", str(script)],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert done.returncode == 0 and "ran as a job" in done.stdout, done.stderr


# -- the table and the checks ----------------------------------------------------------------
def test_every_row_of_the_table_has_a_check_and_every_check_a_row():
    rows = table_rows()
    assert len(rows) == len(set(rows)) >= 40
    assert sorted(set(rows) - set(CHECKS)) == [], "rows without a check"
    assert sorted(set(CHECKS) - set(rows)) == [], "checks without a row"


@pytest.mark.parametrize("row", table_rows())
def test_row(row, tmp_path):
    CHECKS[row](tmp_path)
