"""Pipe and Connection: order, bytes, EOF, errors, peers in other processes."""
import array
import time

import pytest

import fiberrl
from fiberrl import BufferTooShort


def _echo(conn):
    for msg in iter(conn.recv, None):
        conn.send(msg)
    conn.close()


def _hold(conn, ready):
    ready.send("up")
    time.sleep(600)


def _count_to(conn, n):
    for i in range(n):
        conn.send(i)


def _collect(conn, n, out):
    out.send([conn.recv() for _ in range(n)])


@pytest.mark.any_backend
def test_order_is_preserved_between_processes():
    a, b = fiberrl.Pipe()
    proc = fiberrl.Process(target=_count_to, args=(b, 5000))
    proc.start()
    assert [a.recv() for _ in range(5000)] == list(range(5000))
    proc.join(30)


@pytest.mark.any_backend
def test_pipe_between_two_children():
    a, b = fiberrl.Pipe()
    result_r, result_w = fiberrl.Pipe(duplex=False)
    procs = [fiberrl.Process(target=_count_to, args=(a, 100)),
             fiberrl.Process(target=_collect, args=(b, 100, result_w))]
    for proc in procs:
        proc.start()
    assert result_r.recv() == list(range(100))
    for proc in procs:
        proc.join(30)


def _report_received_types(conn, out):
    out.send([type(conn.recv_bytes()), type(conn.recv_bytes()), conn.recv()])


def test_messages_kept_for_an_end_not_yet_active_arrive_as_bytes():
    """What was sent before the receiving end was active anywhere waits in the
    rendezvous's mailbox; recv_bytes still returns ``bytes``, as the stdlib's does."""
    a, b = fiberrl.Pipe()
    a.send_bytes(b"kept for b")
    a.send_bytes(b"")
    a.send({"kept": True})
    result_r, result_w = fiberrl.Pipe(duplex=False)
    proc = fiberrl.Process(target=_report_received_types, args=(b, result_w))
    proc.start()
    assert result_r.recv() == [bytes, bytes, {"kept": True}]
    proc.join(30)


def test_echo_objects_bytes_and_eof_after_close():
    a, b = fiberrl.Pipe()
    proc = fiberrl.Process(target=_echo, args=(b,))
    proc.start()
    b.close()  # the parent's copy of a sent end: not an EOF for `a`
    a.send({"k": [1, 2.5]})
    assert a.recv() == {"k": [1, 2.5]}
    big = b"z" * (16 << 20)
    a.send(big)
    assert a.recv() == big
    a.send(None)
    with pytest.raises(EOFError):
        a.recv()
    proc.join(30)


@pytest.mark.any_backend
def test_eof_when_the_peer_process_is_killed():
    a, b = fiberrl.Pipe()
    ready_r, ready_w = fiberrl.Pipe(duplex=False)
    proc = fiberrl.Process(target=_hold, args=(b, ready_w))
    proc.start()
    assert ready_r.recv() == "up"
    proc.kill()  # SIGKILL on the local backend; the backend's kill elsewhere
    started = time.monotonic()
    with pytest.raises(EOFError):
        a.recv()
    # a container's address vanishes with it: a connect there waits out ARP (3 s or
    # more) before it fails, so the end must learn of the death without one
    assert time.monotonic() - started < 3
    proc.join(10)


def test_send_bytes_slices_and_recv_bytes_into():
    a, b = fiberrl.Pipe()
    a.send_bytes(b"abcdefgh", 2, 3)
    assert b.recv_bytes() == b"cde"
    arr = array.array("i", [1, 2, 3])
    a.send_bytes(arr)
    buf = array.array("i", [0] * 5)
    assert b.recv_bytes_into(buf, 4) == 12
    assert list(buf) == [0, 1, 2, 3, 0]
    a.send_bytes(b"x" * 100)
    with pytest.raises(BufferTooShort) as info:
        b.recv_bytes_into(bytearray(10))
    assert info.value.args[0] == b"x" * 100
    with pytest.raises(ValueError):
        a.send_bytes(b"abc", 4)


def test_closed_and_one_way_connections_raise_oserror():
    reader, writer = fiberrl.Pipe(duplex=False)
    with pytest.raises(OSError):
        reader.send(1)
    with pytest.raises(OSError):
        writer.recv()
    writer.close()
    assert writer.closed
    with pytest.raises(OSError):
        writer.send(1)
    with pytest.raises(EOFError):
        reader.recv()


def test_poll_timeouts():
    a, b = fiberrl.Pipe()
    started = time.monotonic()
    assert a.poll(0.2) is False
    assert 0.15 < time.monotonic() - started < 2
    b.send(1)
    assert a.poll() is True and a.recv() == 1


def _echo_kinds(conn):
    """Echo objects as objects and bytes as bytes, telling them apart by a tag."""
    while True:
        assert conn.poll(30)
        tag = conn.recv()
        if tag == "stop":
            return
        if tag == "bytes":
            assert conn.poll(30)
            conn.send_bytes(conn.recv_bytes())
        else:
            conn.send(tag)


def test_a_poll_that_waits_takes_the_short_way_and_keeps_kinds_order_and_its_timeout():
    """A waiting poll between processes reads a lone message itself (``Inbox.take``
    with any kind): it is kept for the recv of either kind that follows, in order, and
    the poll still returns within its own timeout when nothing comes."""
    a, b = fiberrl.Pipe()
    proc = fiberrl.Process(target=_echo_kinds, args=(b,))
    proc.start()
    for i in range(50):
        a.send(("object", i))
        a.send("bytes")
        a.send_bytes(b"raw %d" % i)
        assert a.poll(30) and a.poll(30)   # a second poll finds the first one's message
        assert a.recv() == ("object", i)
        assert a.poll(30)
        assert a.recv_bytes() == b"raw %d" % i
    assert a._peer_loc is not None and not a._suspect   # connected: the short way is open
    started = time.monotonic()
    assert a.poll(1.5) is False   # its short wait is part of the timeout, not added to it
    assert 1.4 < time.monotonic() - started < 2.4
    a.send("stop")
    proc.join(30)
    assert proc.exitcode == 0
    assert a.poll(30)   # the end of file counts as something to read
    with pytest.raises(EOFError):
        a.recv()


def _stream_for(conn, seconds):
    """Send numbers one by one for ``seconds``, then None."""
    until, i = time.monotonic() + seconds, 0
    while time.monotonic() < until:
        conn.send(i)
        i += 1
        time.sleep(0.001)
    conn.send(None)


def test_an_end_that_only_receives_learns_where_its_peer_is():
    """A consumer that never sends used to take the general receive for every message
    of a steady stream: each wait found a message before it had cause to ask where the
    peer is, and only a send or an empty wait asks. It now asks (at most every 0.2 s)
    and then takes the short way, with nothing lost or reordered."""
    a, b = fiberrl.Pipe()
    proc = fiberrl.Process(target=_stream_for, args=(b, 1.0))
    proc.start()
    got = []
    while True:
        item = a.recv()
        if item is None:
            break
        got.append(item)
    assert got == list(range(len(got))) and len(got) > 100
    assert a._peer_loc is not None and not a._suspect   # connected: the short way is open
    proc.join(30)
    assert proc.exitcode == 0


class _ExitWhenUnpickled:
    """An argument whose unpickling ends the job: it dies before its later arguments
    (a pipe end) are rebuilt."""

    def __reduce__(self):
        import os
        return os._exit, (3,)


def _never_runs(*args):
    raise AssertionError("the job should have died while unpickling its arguments")


def test_eof_when_the_job_a_pipe_end_was_sent_to_dies_before_receiving_it():
    a, b = fiberrl.Pipe()
    proc = fiberrl.Process(target=_never_runs, args=(_ExitWhenUnpickled(), b))
    proc.start()
    b.close()  # as with the stdlib: the parent's copy closed, the job's died with it
    proc.join(30)
    assert proc.exitcode == 3
    assert a.poll(20), "recv would hang: the only other copy of the end died in transit"
    with pytest.raises(EOFError):
        a.recv()


def _echo_slowly(conn, delay, n):
    for _ in range(n):
        msg = conn.recv_bytes()
        time.sleep(delay)
        conn.send_bytes(msg)


def test_waiting_for_a_slow_peer_sleeps_instead_of_spinning():
    # a receiver polls briefly before it sleeps (pipe_inbox); a peer that takes 20 ms
    # per answer must be waited for asleep, not with a core busy the whole time
    a, b = fiberrl.Pipe()
    proc = fiberrl.Process(target=_echo_slowly, args=(b, 0.02, 26))
    proc.start()
    a.send_bytes(b"warm-up")
    assert a.recv_bytes() == b"warm-up"
    cpu, wall = time.process_time(), time.monotonic()
    for _ in range(25):
        a.send_bytes(b"ping")
        assert a.recv_bytes() == b"ping"
    cpu, wall = time.process_time() - cpu, time.monotonic() - wall
    proc.join(30)
    assert wall >= 0.5
    assert cpu < 0.25 * wall, f"waiting {wall:.2f} s took {cpu:.2f} s of CPU"


def _use_then_pass_on(conn, out):
    conn.send("from the child")
    grandchild = fiberrl.Process(target=_count_to, args=(conn, 3))
    grandchild.start()
    grandchild.join(30)
    out.send("child done")


def test_eof_only_after_every_copy_is_closed():
    reader, writer = fiberrl.Pipe(duplex=False)
    done_r, done_w = fiberrl.Pipe(duplex=False)
    writer.send("from the parent")  # used here, then handed on: still held here
    proc = fiberrl.Process(target=_use_then_pass_on, args=(writer, done_w))
    proc.start()
    assert done_r.recv() == "child done"
    proc.join(30)
    got = [reader.recv() for _ in range(5)]
    assert got == ["from the parent", "from the child", 0, 1, 2]
    assert not reader.poll(0.3)  # the parent's copy still counts: no EOF yet
    writer.close()
    with pytest.raises(EOFError):
        reader.recv()


@pytest.mark.any_backend
def test_sending_to_a_killed_peer_raises_broken_pipe():
    a, b = fiberrl.Pipe()
    ready_r, ready_w = fiberrl.Pipe(duplex=False)
    proc = fiberrl.Process(target=_hold, args=(b, ready_w))
    proc.start()
    assert ready_r.recv() == "up"
    a.send("reaches the child")   # the stream to the child is open
    proc.kill()
    started = time.monotonic()
    with pytest.raises(BrokenPipeError):
        for _ in range(50):
            a.send_bytes(b"x" * 1000)
            time.sleep(0.05)
    # sent before the job watch hears of the death, a connect to the address of a
    # killed container would wait out ARP (3 s and more): the first waits a moment only
    assert time.monotonic() - started < 3
    proc.join(10)


def test_ends_in_one_process_never_block_each_other():
    # a stdlib pipe would block the sender once the socket buffer is full
    a, b = fiberrl.Pipe()
    chunk = b"m" * (1 << 20)
    for _ in range(32):
        a.send_bytes(chunk)
    assert all(b.recv_bytes() == chunk for _ in range(32))


def _send_after(conn, delay):
    time.sleep(delay)
    conn.send("late")


def test_fileno_is_a_pollable_descriptor():
    from multiprocessing.connection import wait
    a, b = fiberrl.Pipe()
    proc = fiberrl.Process(target=_send_after, args=(b, 0.5))
    proc.start()
    assert wait([a], timeout=0.1) == []
    assert wait([a], timeout=20) == [a]
    assert a.recv() == "late"
    proc.join(30)


def test_fileno_counts_messages_already_read_off_the_stream():
    from multiprocessing.connection import wait
    a, b = fiberrl.Pipe()
    b.send(1)
    b.send(2)
    assert a.poll(5)      # both arrive together; poll keeps them
    assert wait([a], timeout=1) == [a]
    assert a.recv() == 1
    assert wait([a], timeout=1) == [a]
    assert a.recv() == 2
    assert wait([a], timeout=0.1) == []


def _close_and_exit(conn):
    conn.send("closing")
    conn.close()


@pytest.mark.parametrize("end_to_close", [0, 1])
def test_sending_to_a_closed_end_raises_broken_pipe_every_time(end_to_close):
    # the stdlib raises BrokenPipeError at once, and again on every later send
    ends = fiberrl.Pipe()
    closed, sender = ends[end_to_close], ends[1 - end_to_close]
    closed.close()
    for _ in range(3):
        with pytest.raises(BrokenPipeError):
            sender.send(1)
    with pytest.raises(BrokenPipeError):
        sender.send_bytes(b"x")


def test_sending_to_an_end_used_then_closed_raises_broken_pipe():
    a, b = fiberrl.Pipe()
    a.send("before")
    assert b.recv() == "before"
    b.close()
    for _ in range(3):
        with pytest.raises(BrokenPipeError):
            a.send("after")


def test_sending_to_an_end_its_child_closed_raises_broken_pipe():
    a, b = fiberrl.Pipe()
    proc = fiberrl.Process(target=_close_and_exit, args=(b,))
    proc.start()
    b.close()
    assert a.recv() == "closing"
    proc.join(30)
    assert proc.exitcode == 0
    for _ in range(3):
        with pytest.raises(BrokenPipeError):
            a.send("after")


def test_an_end_closed_by_another_thread_ends_a_waiting_recv_with_oserror():
    """A thread blocked in recv() while another thread of its process closes the end
    gets OSError (it got AttributeError from the torn-down inbox before)."""
    import threading
    a, b = fiberrl.Pipe()
    proc = fiberrl.Process(target=_hold, args=(b, b))   # says "up", then never sends again
    proc.start()
    try:
        assert a.recv() == "up"   # active and connected: the waiting recv takes the short path
        errors = []

        def wait_for_a_message():
            try:
                a.recv()
            except BaseException as exc:   # noqa: BLE001 - the type is what is tested
                errors.append(exc)

        waiter = threading.Thread(target=wait_for_a_message)
        waiter.start()
        time.sleep(0.3)
        a.close()
        waiter.join(10)
        assert not waiter.is_alive()
        assert len(errors) == 1 and type(errors[0]) is OSError, errors
    finally:
        proc.kill()
        proc.join(30)


def _close_the_senders_end_then_serve(own, senders, ready):
    senders.close()   # as gymnasium's AsyncVectorEnv workers do, first thing
    ready.send("closed")
    try:
        own.send(("echo", own.recv()))
        own.recv()
    except EOFError:
        ready.send("eof")


def _a_job_that_closed_its_copy_of_mine():
    """``(mine, ready, job)``: a job that was sent both ends and has closed its copy of
    ``mine``, which was never used here."""
    mine, theirs = fiberrl.Pipe()
    ready_r, ready_w = fiberrl.Pipe(duplex=False)
    proc = fiberrl.Process(target=_close_the_senders_end_then_serve,
                           args=(theirs, mine, ready_w))
    proc.start()
    theirs.close()
    assert ready_r.recv() == "closed"
    return mine, ready_r, proc


def test_a_job_closing_its_copy_of_the_senders_end_unused_ends_nothing():
    # the stdlib's fork: the child closes its duplicate of the parent's end, the parent's
    # own copy keeps the pipe open. The parent's copy here was sent on and never used
    # before the job closed its copy (a parent busy starting other jobs)
    mine, ready_r, proc = _a_job_that_closed_its_copy_of_mine()
    mine.send("hello")
    assert mine.recv() == ("echo", "hello")
    mine.close()   # now the last copy of that end: the job gets EOF
    assert ready_r.recv() == "eof"
    proc.join(30)
    assert proc.exitcode == 0


def test_closing_the_senders_copy_after_the_job_closed_its_copy_unused_is_eof():
    mine, ready_r, proc = _a_job_that_closed_its_copy_of_mine()
    mine.close()   # never used here: its EOF was owed since the job closed its copy
    assert ready_r.poll(20), "the job waits forever for an end no copy of which is open"
    assert ready_r.recv() == "eof"
    proc.join(30)
