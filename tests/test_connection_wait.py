"""``fiberrl.connection.wait``: fiberrl connections (pending messages, end of file, a
peer that dies), process sentinels, the stdlib's connections and sockets, mixed."""
import multiprocessing
import os
import signal
import socket
import time

import pytest

import fiberrl
from fiberrl.connection import wait


def _send_later(conn, delay, obj):
    time.sleep(delay)
    conn.send(obj)


def _announce_and_hold(conn, ready):
    ready.send("up")   # this end is now active in this job, connected to the parent
    time.sleep(600)


def test_timeout_with_nothing_ready():
    a, b = fiberrl.Pipe()
    started = time.monotonic()
    assert wait([a], timeout=0.3) == []
    assert 0.25 <= time.monotonic() - started < 3


def test_pending_message_and_message_already_read_off_the_stream():
    a, b = fiberrl.Pipe()
    b.send("x")
    assert wait([a, b], timeout=5) == [a]
    assert a.poll(0)          # the message is now in the connection, not in a socket
    assert wait([a], timeout=0) == [a]
    assert a.recv() == "x"
    assert wait([a], timeout=0.1) == []


def test_end_of_file_is_ready():
    a, b = fiberrl.Pipe()
    b.close()
    assert wait([a], timeout=5) == [a]
    with pytest.raises(EOFError):
        a.recv()
    assert wait([a], timeout=0) == [a]   # stays ready, as a closed pipe does


def test_closed_connection_raises():
    a, b = fiberrl.Pipe()
    a.close()
    with pytest.raises(OSError):
        wait([a], timeout=0)


def test_message_from_another_process_wakes_the_wait():
    a, b = fiberrl.Pipe()
    proc = fiberrl.Process(target=_send_later, args=(b, 0.5, "late"))
    proc.start()
    try:
        assert wait([a], timeout=60) == [a]
        assert a.recv() == "late"
    finally:
        proc.join(30)
    assert proc.exitcode == 0


def test_peer_killed_without_sending_gives_end_of_file():
    a, b = fiberrl.Pipe()
    ready_r, ready_w = fiberrl.Pipe(duplex=False)
    proc = fiberrl.Process(target=_announce_and_hold, args=(b, ready_w))
    proc.start()
    b.close()   # the job holds the only copy of that end
    try:
        assert ready_r.recv() == "up"
        assert wait([a], timeout=0.3) == []
        os.kill(proc.pid, signal.SIGKILL)
        assert wait([a], timeout=30) == [a]
        with pytest.raises(EOFError):
            a.recv()
    finally:
        proc.kill()
        proc.join(30)


def test_mixed_objects():
    a, b = fiberrl.Pipe()
    std_r, std_w = multiprocessing.Pipe(duplex=False)
    s1, s2 = socket.socketpair()
    proc = fiberrl.Process(target=time.sleep, args=(0.3,))
    proc.start()
    try:
        objects = [a, std_r, s1, proc.sentinel]
        assert wait(objects, timeout=0) == []
        std_w.send("stdlib")
        s2.send(b"sock")
        assert wait(objects, timeout=5) == [std_r, s1]
        b.send("fiberrl")
        assert wait(objects, timeout=5) == [a, std_r, s1]
        assert std_r.recv() == "stdlib" and s1.recv(4) == b"sock" and a.recv() == "fiberrl"
        assert wait(objects, timeout=60) == [proc.sentinel]
    finally:
        proc.join(30)
        s1.close()
        s2.close()


def test_rejects_objects_without_a_descriptor():
    with pytest.raises(TypeError):
        wait([object()], timeout=0)


def test_stdlib_wait_is_not_what_fiberrl_uses():
    """popen waits on its sentinel without ``multiprocessing.connection.wait``, which
    code mapping ``multiprocessing`` to fiberrl turns into this module."""
    import fiberrl.popen
    assert "_wait_fds" not in vars(fiberrl.popen)
