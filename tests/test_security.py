"""No bytes from a peer without the run's secret are ever unpickled."""
import os
import pickle
import socket
import struct
import time

import psutil
import zmq

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
    return [f"tcp://{c.laddr.ip}:{c.laddr.port}" for c in conns if c.status == psutil.CONN_LISTEN]


def test_unauthenticated_pickles_are_dropped_everywhere(tmp_path):
    marker = str(tmp_path / "pwned")
    queue = fiberrl.Queue()
    a, b = fiberrl.Pipe()
    a.send("activate")  # start the pipe acceptor too
    assert b.recv() == "activate"
    addresses = _listening_addresses()
    assert len(addresses) >= 2  # the hub and the pipe acceptor

    evil = pickle.dumps(_Evil(marker))
    shapes = [[evil], [b"\0" * 32, evil], [b"\0" * 32, evil, evil],
              [os.urandom(32), pickle.dumps(("queue", "put", 1, "x", True, None)), evil]]
    ctx = zmq.Context.instance()
    for address in addresses:
        for kind in (zmq.DEALER, zmq.PUSH):
            sock = ctx.socket(kind)
            sock.setsockopt(zmq.LINGER, 1000)
            sock.setsockopt(zmq.SNDTIMEO, 1000)  # a socket-type mismatch never connects
            sock.connect(address)
            for frames in shapes:
                try:
                    sock.send_multipart(frames)
                except zmq.Again:
                    pass
            sock.close()
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
    for attach in (f"{pipe_id}:0".encode(), f"{pipe_id}:1".encode(), b"x:0"):
        sock = fresh()
        nonce = sock.recv(16)
        assert len(nonce) == 16
        # a made-up proof for a real pipe end, then a message as a holder would send it
        sock.sendall(os.urandom(16) + os.urandom(32) + bytes([len(attach)]) + attach + frame)
        answers.append(sock.recv(1))
        sock.close()
    for payload in (evil, frame, b"\0" * 200 + evil):   # no set-up at all
        sock = fresh()
        sock.sendall(payload)
        sock.close()
    return answers


def test_streams_ignore_peers_without_the_secret(tmp_path):
    from fiberrl.pipe_inbox import current_acceptor
    marker = str(tmp_path / "pwned")
    evil = pickle.dumps(_Evil(marker))
    a, b = fiberrl.Pipe()
    proc = fiberrl.Process(target=_echo_once, args=(b,))
    proc.start()   # b is now active in the child: its streams go through acceptors
    a.send("first")
    assert a.recv() == "first"
    proc.join(30)

    from fiberrl.hub import get_hub
    targets = []
    for location in (current_acceptor().location, get_hub().door.address):  # pipes, hub
        host, _, port = location["tcp"].rpartition(":")
        targets.append(((host.strip("[]"), int(port)), socket.AF_INET))
        if location["unix"]:
            targets.append((location["unix"].removeprefix("unix:"), socket.AF_UNIX))
    for address, family in targets:
        assert _raw_attempts(address, family, evil, a._pipe_id) == [b"", b"", b""]
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
    from fiberrl import transport
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
    secret = transport.secret().hex()
    assert spec.env[transport.SECRET_ENV] == secret
    assert all(secret not in part for part in spec.command)
