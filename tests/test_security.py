"""No bytes from a peer without the run's secret are ever unpickled."""
import os
import pickle
import socket
import struct
import time
from concurrent.futures import ThreadPoolExecutor

import psutil
import pytest

import fiberrl


class _Evil:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))


def _echo_once(conn):
    conn.send(conn.recv())


def _listening_addresses():
    conns = psutil.Process().net_connections(kind="tcp")
    return [(c.laddr.ip, c.laddr.port) for c in conns if c.status == psutil.CONN_LISTEN]


def test_unauthenticated_pickles_are_dropped_everywhere(tmp_path):
    marker = str(tmp_path / "pwned")
    queue = fiberrl.Queue()
    a, b = fiberrl.Pipe()
    a.send("activate")  # make the pipe ends reachable too
    assert b.recv() == "activate"
    from fiberrl._runtime.runtime import runtime
    addresses = _listening_addresses()
    assert runtime().address in addresses  # every listener of this process gets the test

    evil = pickle.dumps(_Evil(marker))
    shapes = [evil, b"\0" * 32 + evil, os.urandom(16) + evil,
              os.urandom(16) + bytes([3]) + b"rpc" + os.urandom(32) + evil,
              struct.pack("!cIQ", b"m", 1, len(evil)) + evil + os.urandom(16)]

    def attempt(address, payload):
        with socket.create_connection(address, timeout=10) as sock:
            nonce = b""
            try:
                while len(nonce) < 16:
                    nonce += sock.recv(16 - len(nonce))
            except socket.timeout:
                # not a fiberrl listener (an earlier test's fake API server, say):
                # it gets the bytes anyway; fiberrl's own must greet at once
                assert address != runtime().address, "the runtime did not greet"
            sock.sendall(payload)
            # nothing more will come: a listener still waiting for the rest of a hello
            # sees the end now instead of after its own time limit
            sock.shutdown(socket.SHUT_WR)
            try:
                answer = sock.recv(1)
            except socket.timeout:
                answer = b""   # still waiting for a hello that makes sense
            assert answer != b"\x01", "a peer without the secret was let in"

    # every listener and shape at once: a foreign listener's silence (10 s) is waited
    # for once, not once per shape
    with ThreadPoolExecutor(len(addresses) * len(shapes)) as attempts:
        for done in [attempts.submit(attempt, address, payload)
                     for address in addresses for payload in shapes]:
            done.result()
    time.sleep(1.0)

    # the runtime still works, and nothing was unpickled
    assert b.poll(0.5) is False
    a.send("still fine")
    assert b.recv() == "still fine"
    proc = fiberrl.Process(target=_echo_once, args=(b,))
    proc.start()
    a.send([1, 2, 3])
    assert a.recv() == [1, 2, 3]
    proc.join(30)
    queue.put("ok")
    assert queue.get(timeout=5) == "ok"
    assert not os.path.exists(marker), "an unauthenticated pickle was unpickled"


def _put_one(queue):
    queue.put("from the child")


def _raw_attempts(address, family, evil, pipe_id):
    """Ways a peer without the secret could try to get bytes into a pipe stream.
    Returns what the acceptor answered to each (it must never acknowledge)."""
    def fresh():
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.settimeout(5)
        sock.connect(address)
        return sock

    frame = struct.pack("!cIQ", b"o", 1, len(evil)) + evil + os.urandom(16)
    answers = []
    for label in (f"pipe:{pipe_id}:0".encode(), f"pipe:{pipe_id}:1".encode(), b"rpc"):
        sock = fresh()
        nonce = sock.recv(16)
        assert len(nonce) == 16
        # a made-up proof for a real stream, then a message as a holder would send it
        sock.sendall(os.urandom(16) + bytes([len(label)]) + label + os.urandom(32) + frame)
        try:
            answers.append(sock.recv(1))
        except socket.timeout:   # still waiting for a hello that makes sense: no answer
            answers.append(b"")
        sock.close()
    for payload in (evil, frame, b"\0" * 200 + evil):   # no set-up at all
        sock = fresh()
        sock.sendall(payload)
        sock.close()
    return answers


def test_streams_ignore_peers_without_the_secret(tmp_path):
    marker = str(tmp_path / "pwned")
    evil = pickle.dumps(_Evil(marker))
    a, b = fiberrl.Pipe()
    proc = fiberrl.Process(target=_echo_once, args=(b,))
    proc.start()   # b is now active in the child: its streams go through its runtime
    a.send("first")
    assert a.recv() == "first"
    proc.join(30)

    from fiberrl._runtime.runtime import runtime
    from fiberrl._wire.sockets import unix_name
    targets = []
    address = runtime().address   # the one listener: rpc, pipes, watch streams
    targets.append((address, socket.AF_INET))
    if unix_name(address):
        targets.append((unix_name(address), socket.AF_UNIX))
    for address, family in targets:
        answers = _raw_attempts(address, family, evil, a._pipe_id)
        assert b"\x01" not in answers, f"{address} acknowledged a peer without the secret"
    time.sleep(0.5)

    c, d = fiberrl.Pipe()
    proc = fiberrl.Process(target=_echo_once, args=(d,))
    proc.start()
    c.send({"still": "fine"})
    assert c.recv() == {"still": "fine"}
    proc.join(30)
    queue = fiberrl.Queue()
    proc = fiberrl.Process(target=_put_one, args=(queue,))   # hub calls over the door
    proc.start()
    assert queue.get(timeout=30) == "from the child"
    proc.join(30)
    assert proc.exitcode == 0
    assert not os.path.exists(marker), "an unauthenticated pickle was unpickled"


def test_secret_is_in_the_environment_not_the_command_line():
    from fiberrl._wire.auth import SECRET_ENV, run_secret
    captured = {}

    class Spy(fiberrl.Process):
        pass

    from fiberrl.backends import default_backend
    backend = default_backend()
    original = backend.create_job

    def spy(spec):
        captured["spec"] = spec
        return original(spec)

    backend.create_job = spy
    try:
        proc = Spy(target=print, args=("",))
        proc.start()
        proc.join(30)
    finally:
        backend.create_job = original
    spec = captured["spec"]
    secret = run_secret().hex()
    assert spec.env[SECRET_ENV] == secret
    assert all(secret not in part for part in spec.command)


def test_a_secret_in_the_environment_that_is_not_hex_is_a_clear_config_error(monkeypatch):
    """A job receives the run's secret in ``FIBERRL_SECRET`` as hex; a value that is not
    (set by hand, or left from elsewhere) names the variable instead of failing each
    job start with ``fromhex``'s message."""
    from fiberrl._wire import auth
    from fiberrl.errors import ConfigError
    monkeypatch.setenv(auth.SECRET_ENV, "not hex")
    monkeypatch.setattr(auth, "_secret", None)
    with pytest.raises(ConfigError, match="FIBERRL_SECRET"):
        auth.run_secret()
    monkeypatch.setenv(auth.SECRET_ENV, "ab" * 32)
    assert auth.run_secret() == bytes.fromhex("ab" * 32)
