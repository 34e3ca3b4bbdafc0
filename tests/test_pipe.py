"""Pipe and Connection: order, bytes, EOF, errors, peers in other processes."""
import array
import os
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
    assert time.monotonic() - started < 10
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


def test_sending_to_a_killed_peer_raises_broken_pipe():
    a, b = fiberrl.Pipe()
    ready_r, ready_w = fiberrl.Pipe(duplex=False)
    proc = fiberrl.Process(target=_hold, args=(b, ready_w))
    proc.start()
    assert ready_r.recv() == "up"
    a.send("reaches the child")   # the stream to the child is open
    proc.kill()
    proc.join(10)
    with pytest.raises(BrokenPipeError):
        for _ in range(50):
            a.send_bytes(b"x" * 1000)
            time.sleep(0.05)


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


def test_messages_from_several_senders_come_in_the_order_they_were_sent():
    """Two processes that send to one end in turn (a lock or a barrier between their
    sends) are read in that order even when both streams are readable at once: the
    inbox merges what one poll brought by send time (CPython's Barrier test_thousand
    failed once on this: 514 before 513)."""
    import collections
    import os
    import socket as socket_mod
    import time as time_mod

    from fiberrl._services.pipe_inbox import _STAMP, Inbox, _clock_ns
    from fiberrl._wire.stream import Stream

    for earlier_on_first in (True, False):
        inbox = Inbox()
        senders = []
        for _ in range(2):
            ours, theirs = socket_mod.socketpair()
            key_out, key_in = os.urandom(32), os.urandom(32)
            assert inbox.attach(theirs, key_out, b"")
            senders.append(Stream(ours, key_out, key_in))
        now = _clock_ns()
        first, second = senders if earlier_on_first else senders[::-1]
        first.send(b"o", [_STAMP.pack(now, 0) + b"sent first"])
        second.send(b"o", [_STAMP.pack(now + 1000, 0) + b"sent second"])
        time_mod.sleep(0.05)   # both streams readable before the one poll
        got = collections.deque()
        inbox.receive(got, 1.0)
        inbox.drain(got)
        assert [frames[0] for _, frames in got] == [b"sent first", b"sent second"]
        for stream in senders:
            stream.close()
        inbox.close()


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


def _send_and_close_when_told(writer, go_path, done_path, then_exit):
    while not os.path.exists(go_path):
        time.sleep(0.005)
    writer.send("the address")
    writer.close()
    open(done_path, "w").close()
    if not then_exit:
        time.sleep(600)


@pytest.mark.parametrize("then_exit", [False, True], ids=["writer_lives", "writer_exits"])
def test_a_message_sent_just_before_the_last_close_is_received_before_eof(tmp_path, then_exit):
    # A manager server sends its address and closes its end; its parent saw EOF instead
    # of the address when the send and the close fell between the parent's look at its
    # streams and its question to the rendezvous (which then said "closed"). Here the
    # writer is told to send and close exactly in that window.
    reader, writer = fiberrl.Pipe(duplex=False)
    assert not reader.poll(0)   # active before the writer's job: it watches the rendezvous
    go, done = str(tmp_path / "go"), str(tmp_path / "done")
    proc = fiberrl.Process(target=_send_and_close_when_told, args=(writer, go, done, then_exit))
    proc.start()
    writer.close()
    real_collect = reader._collect

    def collect_then_let_the_writer_finish(timeout):
        real_collect(timeout)
        if not reader._pending and not os.path.exists(go):
            open(go, "w").close()
            while not os.path.exists(done):
                time.sleep(0.005)
            if then_exit:
                proc.join(30)
            reader._last_lookup = 0.0   # ask the rendezvous at once

    reader._collect = collect_then_let_the_writer_finish
    try:
        assert reader.poll(30)
        assert reader.recv() == "the address"
        with pytest.raises(EOFError):
            reader.recv()
    finally:
        proc.kill()
        proc.join(10)


@pytest.mark.parametrize("skew", ["far_ahead", "far_behind"])
def test_a_sender_whose_clock_is_off_is_neither_held_back_nor_lost(skew):
    """Messages from several senders are merged by send time. A sender on another host
    stamps them with its own clock: one far ahead held its messages back for as long
    as it was ahead (a hang), so a message counts as sent no later than it was read."""
    import collections
    import os
    import socket as socket_mod
    import time as time_mod

    from fiberrl._services import pipe_inbox
    from fiberrl._services.pipe_inbox import _STAMP, Inbox
    from fiberrl._wire.stream import Stream

    inbox = Inbox()
    senders = []
    for _ in range(2):
        ours, theirs = socket_mod.socketpair()
        key_out, key_in = os.urandom(32), os.urandom(32)
        assert inbox.attach(theirs, key_out, b"")
        senders.append(Stream(ours, key_out, key_in))
    off_clock = (1 << 64) - 1 if skew == "far_ahead" else 0
    senders[0].send(b"o", [_STAMP.pack(off_clock, 0) + b"from the other host"])
    senders[1].send(b"o", [_STAMP.pack(pipe_inbox._clock_ns(), 0) + b"from this host"])
    got = collections.deque()
    deadline = time_mod.monotonic() + 2.0
    while len(got) < 2 and time_mod.monotonic() < deadline:
        inbox.receive(got, 0.1)
    assert sorted(frames[0] for _, frames in got) == [b"from the other host",
                                                      b"from this host"]
    for stream in senders:
        stream.close()
    inbox.close()


def test_one_senders_messages_keep_their_order_when_its_clock_is_set_back():
    """Merging by send time must not reorder one sender's messages when its wall clock
    steps back between two sends (NTP), nor local deliveries when this host's does."""
    import collections
    import os
    import socket as socket_mod

    from fiberrl._services import pipe_inbox
    from fiberrl._services.pipe_inbox import _STAMP, Inbox
    from fiberrl._wire.stream import Stream

    inbox = Inbox()
    senders = []
    for _ in range(2):   # two streams: the merging path
        ours, theirs = socket_mod.socketpair()
        key_out, key_in = os.urandom(32), os.urandom(32)
        assert inbox.attach(theirs, key_out, b"")
        senders.append(Stream(ours, key_out, key_in))
    now = pipe_inbox._clock_ns()
    senders[0].send(b"o", [_STAMP.pack(now, 0) + b"first"])
    senders[0].send(b"o", [_STAMP.pack(now - 10**10, 0) + b"second, 10 s 'earlier'"])
    real_clock = pipe_inbox._clock_ns
    try:
        inbox.deliver_local(b"o", [b"local first"])
        pipe_inbox._clock_ns = lambda: real_clock() - 10**10
        inbox.deliver_local(b"o", [b"local second"])
    finally:
        pipe_inbox._clock_ns = real_clock
    got = collections.deque()
    deadline = time.monotonic() + 2.0
    while len(got) < 4 and time.monotonic() < deadline:
        inbox.receive(got, 0.1)
    bodies = [frames[0] for _, frames in got]
    assert len(bodies) == 4, bodies
    assert bodies.index(b"first") < bodies.index(b"second, 10 s 'earlier'")
    assert bodies.index(b"local first") < bodies.index(b"local second")
    for stream in senders:
        stream.close()
    inbox.close()


def _send_early_then_late(writer, go_path, done_path):
    writer.send("early")
    while not os.path.exists(go_path):
        time.sleep(0.002)
    for i in range(10):
        writer.send(("late", i))
    open(done_path, "w").close()
    writer.send(None)


def _receive_until_none(reader, out):
    out.send(list(iter(reader.recv, None)))


def test_messages_sent_while_a_receiving_end_moves_to_another_process_are_not_lost(
        tmp_path, monkeypatch):
    # An end that was read here and is then sent to a job gives its unread messages back
    # to the rendezvous. Messages its sender wrote into the old stream after that (and
    # before the stream closed) were lost: 50-280 of 3,000 in 3 of 20 runs. Here the
    # sender writes exactly then.
    from fiberrl import connection as connection_module

    reader, writer = fiberrl.Pipe(duplex=False)
    go, done = str(tmp_path / "go"), str(tmp_path / "done")
    sender = fiberrl.Process(target=_send_early_then_late, args=(writer, go, done))
    sender.start()
    writer.close()
    assert reader.recv() == "early"   # read here: its stream is attached here
    real_client_for = connection_module.client_for

    class _SenderWritesBeforeTheRelease:
        def __init__(self, client):
            self._client = client

        def call(self, service, op, *args, **kwargs):
            if op == "release" and not os.path.exists(go):
                open(go, "w").close()
                give_up = time.monotonic() + 1.0   # a sender refused waits for the release
                while not os.path.exists(done) and time.monotonic() < give_up:
                    time.sleep(0.005)
            return self._client.call(service, op, *args, **kwargs)

        def __getattr__(self, name):
            return getattr(self._client, name)

    monkeypatch.setattr(connection_module, "client_for",
                        lambda address: _SenderWritesBeforeTheRelease(real_client_for(address)))
    out_r, out_w = fiberrl.Pipe(duplex=False)
    taker = fiberrl.Process(target=_receive_until_none, args=(reader, out_w))
    taker.start()
    monkeypatch.setattr(connection_module, "client_for", real_client_for)
    reader.close()
    out_w.close()
    try:
        assert out_r.poll(30)
        assert out_r.recv() == [("late", i) for i in range(10)]
    finally:
        for proc in (sender, taker):
            proc.join(10)
            if proc.is_alive():
                proc.kill()


@pytest.mark.parametrize("how", ["close", "drop"])
def test_an_end_that_sent_before_its_peer_was_used_gives_eof_when_closed_or_dropped(how):
    """A message sent before the receiving end is used waits at the rendezvous; the
    sender then has no stream, and its close must still reach the receiver, which is
    in use by then. Dropping the end unclosed closes it too, as the stdlib's connection
    is closed when collected."""
    import gc

    reader, writer = fiberrl.Pipe(duplex=False)
    writer.send("kept for the reader")
    assert reader.recv() == "kept for the reader"
    if how == "close":
        writer.close()
    else:
        del writer
        gc.collect()
    assert reader.poll(10), "the close never reached the receiver"
    with pytest.raises(EOFError):
        reader.recv()


def test_a_dropped_receiving_end_makes_sends_fail_with_broken_pipe():
    import gc

    first, second = fiberrl.Pipe()
    second.send("used")
    assert first.recv() == "used"
    del first
    gc.collect()
    with pytest.raises(BrokenPipeError):
        for _ in range(100):
            second.send("to nobody")
            time.sleep(0.05)


_INHERITED = []


def _drop_the_inherited_copies():
    import gc
    own = fiberrl.Pipe()   # ends of its own: this process closes what it drops
    _INHERITED.clear()
    gc.collect()
    time.sleep(0.3)   # time for a close, were one (wrongly) queued
    own[0].close()
    own[1].close()


def test_a_fork_child_dropping_the_copies_it_inherited_closes_nothing():
    """A stdlib fork child of a fiberrl process inherits its connection objects; it
    dropping them must not close the parent's ends (the parent's descriptors stay open
    when a stdlib fork child closes its copies)."""
    import multiprocessing as std

    def make():
        reader, writer = fiberrl.Pipe(duplex=False)
        writer.send("before")
        assert reader.recv() == "before"
        _INHERITED.extend([reader, writer])

    make()
    child = std.get_context("fork").Process(target=_drop_the_inherited_copies)
    child.start()
    child.join(30)
    assert child.exitcode == 0
    reader, writer = _INHERITED
    writer.send("after")
    assert reader.poll(10) and reader.recv() == "after"
    assert not reader.poll(0.5)
    _INHERITED.clear()


def _poll_then_exit(reader):
    reader.poll(5)


def test_sends_to_an_end_whose_user_exited_are_kept_for_the_copy_still_held():
    """CPython's TestPoll.test_boundaries: a job polls its copy of the reading end and
    exits while the parent still holds the copy it passed on. As with a kernel pipe,
    whose buffer waits for a descriptor still open, every send succeeds and the parent's
    copy reads the messages in order (the job's exit could make a later send raise
    BrokenPipeError, or lose it, before)."""
    reader, writer = fiberrl.Pipe(duplex=False)
    proc = fiberrl.Process(target=_poll_then_exit, args=(reader,))
    proc.start()
    time.sleep(1.0)   # the job's copy is active
    writer.send_bytes(b"first")
    proc.join(30)
    assert proc.exitcode == 0
    for i in range(3):
        writer.send_bytes(b"later %d" % i)
    assert [reader.recv_bytes() for _ in range(4)] == [b"first", b"later 0", b"later 1",
                                                       b"later 2"]


def test_an_inbox_closed_twice_closes_no_descriptor_it_no_longer_owns():
    """A second close of an inbox (or a wake-up after its close) must not touch the
    numbers its wake-up pipe had: they may belong to another file by then."""
    from fiberrl._services.pipe_inbox import Inbox

    inbox = Inbox()
    inbox.close()
    other_r, other_w = os.pipe()   # likely takes the numbers the inbox had
    try:
        inbox.close()
        inbox.wake()
        os.write(other_w, b"still open")
        assert os.read(other_r, 100) == b"still open"
    finally:
        os.close(other_r)
        os.close(other_w)
