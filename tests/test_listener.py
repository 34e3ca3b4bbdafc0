"""``fiberrl.connection.Listener``/``Client``: the stdlib's API, always authenticated
(``authkey=None`` is the run's secret), TCP and Unix sockets, jobs as clients."""
import multiprocessing.connection as std_connection
import os
import pickle
import socket
import threading

import pytest

import fiberrl
from fiberrl import AuthenticationError
from fiberrl.connection import Client, Listener, wait


class _Boom:
    """Unpickling this writes a file: proof that a payload was (not) unpickled."""

    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


def _client_job(address, family):
    with Client(address, family) as conn:
        conn.send(("hello from job", os.getpid()))
        assert conn.recv() == "bye"


def _serve_once(listener, out):
    with listener.accept() as conn:
        out.append(conn.recv())
        conn.send_bytes(b"pong")


@pytest.mark.parametrize("family,address", [("AF_INET", ("127.0.0.1", 0)), ("AF_UNIX", None)])
def test_round_trip_with_the_default_key(family, address):
    with Listener(address, family) as listener:
        assert listener.last_accepted is None
        got = []
        server = threading.Thread(target=_serve_once, args=(listener, got))
        server.start()
        with Client(listener.address, family) as conn:
            conn.send({"ping": 1})
            assert conn.recv_bytes() == b"pong"
        server.join(10)
        assert got == [{"ping": 1}]
        assert listener.last_accepted is not None
        bound = listener.address
    if family == "AF_UNIX":
        assert not os.path.exists(bound)


def test_a_job_is_a_client_with_the_runs_secret():
    with Listener(("127.0.0.1", 0), "AF_INET") as listener:
        proc = fiberrl.Process(target=_client_job, args=(listener.address, "AF_INET"))
        proc.start()
        try:
            with listener.accept() as conn:
                assert wait([conn], timeout=60) == [conn]
                message, pid = conn.recv()
                assert message == "hello from job" and pid != os.getpid()
                conn.send("bye")
        finally:
            proc.join(60)
        assert proc.exitcode == 0


def test_wrong_key_is_refused_both_ways():
    with Listener(("127.0.0.1", 0), authkey=b"right") as listener:
        errors = []

        def accept():
            try:
                listener.accept()
            except AuthenticationError as exc:
                errors.append(exc)

        server = threading.Thread(target=accept)
        server.start()
        with pytest.raises(AuthenticationError):
            Client(listener.address, authkey=b"wrong")
        server.join(10)
        assert len(errors) == 1


def test_unauthenticated_bytes_are_never_unpickled(tmp_path):
    marker = tmp_path / "unpickled"
    with Listener(("127.0.0.1", 0)) as listener:
        errors = []

        def accept():
            try:
                listener.accept().recv()   # without the challenge this would unpickle
            except (AuthenticationError, EOFError, OSError) as exc:
                errors.append(exc)

        server = threading.Thread(target=accept)
        server.start()
        payload = pickle.dumps(_Boom(str(marker)))
        with socket.create_connection(listener.address, timeout=5) as sock:
            try:
                sock.recv(1024)   # the challenge; answer it with a pickle instead
            except socket.timeout:
                pass
            sock.sendall(len(payload).to_bytes(4, "big") + payload)
            try:
                sock.recv(1024)
            except OSError:
                pass
        server.join(10)
    assert errors and not marker.exists()


def test_stdlib_peer_with_the_same_key_interoperates():
    key = b"shared key"
    with Listener(("127.0.0.1", 0), authkey=key) as listener:
        got = []
        server = threading.Thread(target=_serve_once, args=(listener, got))
        server.start()
        with std_connection.Client(listener.address, authkey=key) as conn:
            conn.send("from the stdlib")
            assert conn.recv_bytes() == b"pong"
        server.join(10)
    assert got == ["from the stdlib"]


def test_empty_or_bad_key_is_refused():
    with pytest.raises(ValueError):
        Listener(("127.0.0.1", 0), authkey=b"")
    with pytest.raises(TypeError):
        Client(("127.0.0.1", 1), authkey="text")


def test_client_returns_before_accept_in_the_same_thread():
    """The stdlib allows this without a key; fiberrl always authenticates, in the
    listener's own thread, so it still works."""
    with Listener("\0fiberrl-test-%d" % os.getpid()) as listener:
        with Client(listener.address) as client:
            with listener.accept() as served:
                client.send(1729)
                assert served.recv() == 1729
    with pytest.raises(OSError):
        listener.accept()
