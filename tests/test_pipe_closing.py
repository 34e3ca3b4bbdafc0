"""Pipe ends closing, moving and ending: what was sent before a close or a move is
received, dropped ends close, and copies held elsewhere keep what is sent to them."""
import os
import time

import pytest

import fiberrl


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
    from fiberrl._services import pipe_closing   # where a copy releases its end

    reader, writer = fiberrl.Pipe(duplex=False)
    go, done = str(tmp_path / "go"), str(tmp_path / "done")
    sender = fiberrl.Process(target=_send_early_then_late, args=(writer, go, done))
    sender.start()
    writer.close()
    assert reader.recv() == "early"   # read here: its stream is attached here
    real_client_for = pipe_closing.client_for

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

    monkeypatch.setattr(pipe_closing, "client_for",
                        lambda address: _SenderWritesBeforeTheRelease(real_client_for(address)))
    out_r, out_w = fiberrl.Pipe(duplex=False)
    taker = fiberrl.Process(target=_receive_until_none, args=(reader, out_w))
    taker.start()
    monkeypatch.setattr(pipe_closing, "client_for", real_client_for)
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
