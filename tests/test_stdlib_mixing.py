"""fiberrl objects in the stdlib's own processes, and the stdlib's connections in
fiberrl jobs: each works, or fails at once saying why (never a silent hang)."""
import multiprocessing
import multiprocessing.connection
import os
import pickle

import pytest

import fiberrl
from fiberrl import AuthenticationError
from fiberrl.backends import default_backend

SPAWN = multiprocessing.get_context("spawn")


# -- fiberrl objects in a stdlib spawn process -------------------------------------------
def _echo_once(conn):
    conn.send(("child got", conn.recv()))


def _put_and_exit(queue, item):
    queue.put(item)   # the process exits at once: the put must still arrive


def _unpickle_and_report(payload, report):
    try:
        pickle.loads(payload).send("unexpected")
        report.send("no error")
    except Exception as exc:
        report.send((type(exc).__name__, str(exc)))


def test_fiberrl_pipe_end_in_a_stdlib_spawn_process():
    a, b = fiberrl.Pipe()
    child = SPAWN.Process(target=_echo_once, args=(b,))
    child.start()
    try:
        a.send("hi")
        assert a.poll(60)
        assert a.recv() == ("child got", "hi")
    finally:
        child.join(60)
    assert child.exitcode == 0


@pytest.mark.parametrize("factory", ["SimpleQueue", "Queue"])
def test_fiberrl_queue_put_by_a_stdlib_process_that_exits_at_once(factory):
    queue = getattr(fiberrl, factory)()
    child = SPAWN.Process(target=_put_and_exit, args=(queue, {"from": "stdlib child"}))
    child.start()
    child.join(60)
    assert child.exitcode == 0
    reader = queue._reader
    assert fiberrl.connection.wait([reader], timeout=30) == [reader]
    assert queue.get() == {"from": "stdlib child"}


def test_stdlib_process_with_another_key_fails_at_once():
    """The run's secret travels as the stdlib's authkey; a child given another key
    cannot use fiberrl's objects, and is told so at once."""
    a, b = fiberrl.Pipe()
    payload = pickle.dumps(b)
    report_r, report_w = SPAWN.Pipe(duplex=False)
    child = SPAWN.Process(target=_unpickle_and_report, args=(payload, report_w))
    child.authkey = b"not the run's secret"
    child.start()
    try:
        assert report_r.poll(60), "the child neither worked nor failed"
        name, message = report_r.recv()
        assert name == AuthenticationError.__name__ and "refused the key" in message
    finally:
        child.join(60)


# -- stdlib connections in fiberrl jobs ----------------------------------------------------
def _reply_on(conn):
    conn.send(("job got", conn.recv()))


@pytest.mark.any_backend
def test_stdlib_connection_sent_to_a_job():
    """On this host the job borrows the descriptor; on a backend whose jobs may run on
    other hosts the connection is relayed (fiberrl/_services/connection_relay.py)."""
    a, b = multiprocessing.Pipe()
    proc = fiberrl.Process(target=_reply_on, args=(b,))
    proc.start()
    try:
        a.send("hello")
        assert a.poll(60)
        assert a.recv() == ("job got", "hello")
    finally:
        proc.join(60)
    assert proc.exitcode == 0


def test_stdlib_connection_sent_through_a_fiberrl_queue():
    """Not with a process's arguments: lent until a process on this host takes it."""
    a, b = multiprocessing.Pipe()
    queue = fiberrl.SimpleQueue()
    proc = fiberrl.Process(target=_reply_from_queue, args=(queue,))
    proc.start()
    try:
        queue.put(b)
        a.send(42)
        assert a.poll(60)
        assert a.recv() == ("job got", 42)
    finally:
        proc.join(60)
    assert proc.exitcode == 0


def _reply_from_queue(queue):
    _reply_on(queue.get())


def test_closed_stdlib_connection_cannot_be_sent():
    a, b = multiprocessing.Pipe()
    b.close()
    proc = fiberrl.Process(target=_reply_on, args=(b,))
    with pytest.raises((OSError, pickle.PicklingError), match="closed"):
        proc.start()


def _reply_on_socket(sock):
    data = sock.recv(16)
    sock.sendall(b"job got " + data)
    sock.close()


def test_socket_sent_to_a_job():
    import socket
    ours, theirs = socket.socketpair()
    proc = fiberrl.Process(target=_reply_on_socket, args=(theirs,))
    if not default_backend().shares_host:
        with pytest.raises(TypeError, match="file descriptor of this host"):
            proc.start()
        return
    proc.start()
    try:
        ours.settimeout(60)
        ours.sendall(b"ping")
        assert ours.recv(64) == b"job got ping"
    finally:
        proc.join(60)
        ours.close()
        theirs.close()
    assert proc.exitcode == 0


# -- reduction.send_handle / recv_handle over fiberrl pipes ----------------------------------
def _write_to_received_fd(conn, data):
    fd = fiberrl.reduction.recv_handle(conn)
    os.write(fd, data)
    os.close(fd)


def test_send_handle_over_a_fiberrl_pipe(tmp_path):
    """A fiberrl pipe end is not a Unix socket, so the descriptor is lent and its ticket
    sent as a message (CPython's test_fd_transfer, which failed before)."""
    conn, child_conn = fiberrl.Pipe()
    proc = fiberrl.Process(target=_write_to_received_fd, args=(child_conn, b"written by the job"))
    proc.start()
    target = tmp_path / "out"
    with open(target, "wb") as fh:
        fiberrl.reduction.send_handle(conn, fh.fileno(), proc.pid)
    proc.join(60)
    assert proc.exitcode == 0
    assert target.read_bytes() == b"written by the job"


def test_recv_handle_of_a_message_without_a_descriptor_raises():
    a, b = fiberrl.Pipe()
    a.send("not a descriptor")
    with pytest.raises(RuntimeError, match="file descriptor"):
        fiberrl.reduction.recv_handle(b)


def test_send_handle_over_a_stdlib_socket_pipe_is_the_stdlibs():
    a, b = multiprocessing.Pipe()
    r, w = os.pipe()
    fiberrl.reduction.send_handle(a, w, None)
    received = fiberrl.reduction.recv_handle(b)
    os.write(received, b"x")
    assert os.read(r, 1) == b"x"
    for fd in (r, w, received):
        os.close(fd)
