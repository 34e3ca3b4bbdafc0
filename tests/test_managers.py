"""fiberrl.Manager and fiberrl.managers.BaseManager: servers that are jobs, proxies
shared by processes, a server killed mid-use, and unauthenticated clients."""
import os
import pickle
import re
import select
import signal
import socket
import struct
import threading
import time

import pytest

import fiberrl
from fiberrl.asyncproxy import AsyncManager, asynchronous, gather
from fiberrl._wire.sockets import unix_name as local_name
from fiberrl.managers import BaseManager, open_connection

import pool_helpers

pytestmark = pytest.mark.timeout(180)


class Counter:
    """A plain object to live in a manager server."""

    def __init__(self, start=0):
        self.total = start

    def add(self, n):
        self.total += n
        return self.total

    def fail(self):
        raise KeyError("no such thing")

    def where(self):
        return os.environ.get("FIBERRL_JOB_NAME")


class CounterManager(BaseManager):
    """A manager with one registered type."""


CounterManager.register("Counter", Counter)


class AsyncCounterManager(AsyncManager):
    """The same type, created as asynchronous proxies."""


AsyncCounterManager.register("Counter", Counter)


def _use_shared(shared, counter, queue):
    shared["child"] = os.getpid()
    shared_list = shared["list"]
    shared_list.append("from child")
    queue.put(counter.add(5))


@pytest.mark.any_backend
def test_manager_objects_are_shared_with_jobs(fiberrl_backend):
    with fiberrl.Manager() as manager:
        assert manager._process._popen.backend.name == fiberrl_backend  # the server is a job
        shared = manager.dict()
        shared["list"] = manager.list(["from parent"])
        queue = manager.Queue()
        with CounterManager() as counters:
            counter = counters.Counter(10)
            proc = fiberrl.Process(target=_use_shared, args=(shared, counter, queue))
            proc.start()
            assert queue.get(timeout=60) == 15
            proc.join(30)
            assert proc.exitcode == 0
            assert shared["child"] == proc.pid
            assert list(shared["list"]) == ["from parent", "from child"]
            assert counter.where().startswith("CounterManager")  # it runs in the server job


def test_manager_address_is_tcp_and_reachable():
    with CounterManager(address=("0.0.0.0", 0)) as manager:
        host, port = manager.address
        assert host != "0.0.0.0" and port > 0  # a wildcard bind reports a routable address
        assert manager.Counter().add(1) == 1


def _connect_and_add(address, authkey, results):
    manager = CounterManager(address=address, authkey=authkey)
    manager.connect()
    results.put(manager.Counter(100).add(1))


def test_connect_from_another_process_with_the_authkey():
    authkey = os.urandom(16)
    with CounterManager(authkey=authkey) as manager:
        results = fiberrl.Queue()
        proc = fiberrl.Process(target=_connect_and_add, args=(manager.address, authkey, results))
        proc.start()
        assert results.get(timeout=60) == 101
        proc.join(30)


def test_remote_exception_keeps_its_type():
    with CounterManager() as manager:
        with pytest.raises(KeyError, match="no such thing"):
            manager.Counter().fail()


@pytest.mark.any_backend
def test_server_killed_mid_use_raises_a_clear_error():
    manager = fiberrl.Manager()
    shared = manager.dict(a=1)
    queue = manager.Queue()
    blocked_error = []

    def blocked_get():
        try:
            queue.get()
        except Exception as exc:
            blocked_error.append(exc)

    waiter = threading.Thread(target=blocked_get)
    waiter.start()
    time.sleep(0.5)
    manager._process.kill()  # SIGKILL on the local backend; the backend's kill elsewhere
    waiter.join(30)
    assert not waiter.is_alive(), "a call blocked in the server hung after it died"
    assert isinstance(blocked_error[0], fiberrl.ManagerConnectionError)
    started = time.monotonic()
    with pytest.raises(fiberrl.ManagerConnectionError, match="is gone|cannot connect"):
        shared["a"]
    with pytest.raises(EOFError):  # what stdlib code catches keeps working
        shared["a"]
    with pytest.raises(BrokenPipeError):   # a stdlib proxy's send to a dead server
        shared["a"] = 1
    assert time.monotonic() - started < 10
    # once the owner knows its server's job ended, a call fails at once: it does not
    # dial an address that may be a gone container's (no route to host: 3 s per call)
    assert pool_helpers.wait_until(lambda: manager._process.exitcode is not None, 30)
    started = time.monotonic()
    for _ in range(3):
        with pytest.raises(fiberrl.ManagerConnectionError, match="is gone"):
            shared["a"]
    with pytest.raises(fiberrl.ManagerConnectionError, match="is gone"):
        manager.dict()
    assert time.monotonic() - started < 1.0
    manager.shutdown()
    manager.join(10)


@pytest.mark.parametrize("family,how", [("same-host", "queued"), ("tcp", "queued"),
                                         ("tcp", "accepted")])
def test_a_server_dying_during_the_handshake_is_reported_gone(family, how):
    """A server killed while a client connects: the client's connection was queued on a
    listener that then closed (reset), or accepted and closed (end of file) before the
    challenge. Either way the server is gone, not slow (seen on Slurm, where the client
    reconnected while the killed server was still closing its sockets)."""
    tcp = socket.create_server(("127.0.0.1", 0))
    address = tcp.getsockname()
    listener = tcp
    if family == "same-host":
        listener = socket.socket(socket.AF_UNIX)
        listener.bind(local_name(address))
        listener.listen(8)
    errors = []

    def connect():
        try:
            open_connection(address, authkey=b"k" * 32, timeout=20).close()
        except Exception as exc:
            errors.append(exc)

    client = threading.Thread(target=connect)
    client.start()
    try:
        assert select.select([listener], [], [], 10)[0], "the client did not connect"
        if how == "queued":
            listener.close()
        else:
            listener.accept()[0].close()
        client.join(15)
    finally:
        listener.close()
        tcp.close()
    assert not client.is_alive()
    assert isinstance(errors[0], fiberrl.ManagerConnectionError), errors
    assert isinstance(errors[0], EOFError)  # what stdlib code catches
    # (a TCP reset can come before connect() returns: then it "cannot connect")
    assert re.search("is gone|cannot connect", str(errors[0])), errors[0]


def test_wrong_authkey_is_refused():
    with CounterManager() as manager:
        with pytest.raises(fiberrl.AuthenticationError):
            open_connection(manager.address, authkey=b"not the run's key")
        assert manager.Counter().add(2) == 2  # the server is unharmed


class _Trap:
    """Unpickling this would create ``path``: proof that a payload was unpickled."""

    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return open, (self.path, "w")


def test_unauthenticated_bytes_are_never_unpickled(tmp_path):
    trap_file = tmp_path / "unpickled"
    payload = pickle.dumps(_Trap(str(trap_file)))
    with CounterManager() as manager:
        with socket.create_connection(manager.address, timeout=10) as sock:
            sock.sendall(struct.pack("!i", len(payload)) + payload)
            sock.settimeout(10)
            try:
                while sock.recv(4096):  # the server challenges, then hangs up on us
                    pass
            except OSError:
                pass
        time.sleep(0.5)
        assert not trap_file.exists()
        assert manager.Counter().add(3) == 3


def _failing_initializer():
    raise RuntimeError("cannot start")


def test_server_that_fails_to_start_raises_instead_of_hanging():
    manager = CounterManager()
    with pytest.raises(fiberrl.ProcessError, match="exited with code 1"):
        manager.start(initializer=_failing_initializer)


_SILENT_SERVER = """
import time
from fiberrl.managers import BaseManager

class Silent(BaseManager):
    @classmethod
    def _run_server(cls, registry, address, authkey, serializer, writer, *rest):
        writer.close()   # reports no address, serves nothing
        time.sleep(600)

if __name__ == "__main__":
    try:
        Silent().start()
    except Exception as exc:
        print(type(exc).__name__, exc, flush=True)
"""


def test_a_server_that_closes_its_pipe_without_an_address_does_not_hold_the_exit(tmp_path):
    """The start raised, and the program then waited for ever at its exit, joining a
    server that was still running (it was not killed)."""
    import subprocess
    import sys
    script = tmp_path / "silent.py"
    script.write_text(_SILENT_SERVER)
    started = time.monotonic()
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          timeout=60, cwd=tmp_path)
    assert done.returncode == 0 and time.monotonic() - started < 30, done
    assert "ProcessError" in done.stdout and "without reporting its address" in done.stdout


def test_lambda_arguments_travel_by_value():
    with fiberrl.Manager() as manager:
        shared = manager.list([3, 1, 2])
        shared.sort(key=lambda x: -x)
        assert list(shared) == [3, 2, 1]


def test_async_calls_return_futures_in_order():
    with AsyncCounterManager() as manager:
        counter = manager.Counter()
        futures = [counter.add(1) for _ in range(50)]
        assert gather(futures, timeout=60) == list(range(1, 51))
        with pytest.raises(KeyError):
            counter.fail().result(timeout=30)
        with pytest.raises(AttributeError):
            counter.no_such_method
        assert counter.sync.add(0) == 50


def test_asynchronous_wraps_any_proxy_and_fails_futures_when_the_server_dies():
    manager = fiberrl.Manager()
    queue = asynchronous(manager.Queue())
    pending = queue.get()  # blocks in the server until the server dies
    os.kill(manager._process.pid, signal.SIGKILL)
    with pytest.raises(fiberrl.ManagerConnectionError):
        pending.result(timeout=30)
    queue._close()
    manager.shutdown()
    manager.join(10)


@pytest.mark.any_backend
def test_manager_lock_held_by_a_dead_process_is_released():
    with fiberrl.Manager() as manager:
        lock = manager.Lock()
        proc = fiberrl.Process(target=_lock_and_die, args=(lock,))
        proc.start()
        proc.join(60)
        assert proc.exitcode == 7
        assert lock.acquire(timeout=15)
        lock.release()


def _lock_and_die(lock):
    lock.acquire()
    os._exit(7)


@pytest.fixture
def tcp_only(monkeypatch):
    """Make this process reach servers over TCP, as a client on another host does
    (the same-host abstract socket is not looked for)."""
    import fiberrl._wire.sockets
    monkeypatch.setattr(fiberrl._wire.sockets, "unix_name", lambda address: None)


def test_tcp_path_serves_and_reports_a_killed_server(tcp_only):
    manager = fiberrl.Manager()
    shared = manager.dict(a=1)
    conn = open_connection(manager.address)
    assert conn.fileno() >= 0
    sock = socket.socket(fileno=os.dup(conn.fileno()))
    try:
        assert sock.family == socket.AF_INET  # really TCP
        assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 1
    finally:
        sock.close()
        conn.close()
    shared["b"] = 2
    assert shared.copy() == {"a": 1, "b": 2}
    os.kill(manager._process.pid, signal.SIGKILL)
    with pytest.raises(fiberrl.ManagerConnectionError):
        shared["a"]
    manager.shutdown()
    manager.join(10)


def test_messages_after_the_handshake_are_signed_too(tmp_path):
    """A peer that passed the set-up (it holds the key) and then writes a pickle without
    the stream's MAC, as the stdlib's manager connections allow after their challenge,
    is dropped with nothing unpickled."""
    from fiberrl._wire.stream import open_stream
    trap_file = tmp_path / "unpickled"
    payload = pickle.dumps(("#TRAP", _Trap(str(trap_file))))
    with CounterManager() as manager:
        stream = open_stream(manager.address, "manager")
        stream.sock.setblocking(True)
        forged = struct.pack("!cIQ", b"m", 1, len(payload)) + payload + b"\0" * 16
        stream.sock.sendall(forged)
        stream.sock.settimeout(10)
        assert stream.sock.recv(4096) == b""   # the server hangs up on us
        stream.close()
        time.sleep(0.5)
        assert not trap_file.exists()
        assert manager.Counter().add(3) == 3
