"""No bytes from a peer without the run's secret are ever unpickled."""
import os
import pickle
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
    a.send("activate")  # bind the pipe's inboxes too
    assert b.recv() == "activate"
    addresses = _listening_addresses()
    assert len(addresses) >= 3  # the hub and two pipe inboxes

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
