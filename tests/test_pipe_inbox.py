"""A pipe end's Inbox on its own: merging several senders' streams by send time, the
clocks those times come from, and closing."""
import collections
import os
import socket
import time

import pytest

from fiberrl._services import pipe_inbox
from fiberrl._services.pipe_inbox import Inbox
from fiberrl._services.pipe_stamp import STAMP
from fiberrl._wire.stream import Stream


@pytest.fixture
def two_senders():
    """An inbox with two attached streams (the merging path) and their sending ends."""
    inbox = Inbox()
    senders = []
    for _ in range(2):
        ours, theirs = socket.socketpair()
        key_out, key_in = os.urandom(32), os.urandom(32)
        assert inbox.attach(theirs, key_out, b"")
        senders.append(Stream(ours, key_out, key_in))
    yield inbox, senders
    for stream in senders:
        stream.close()
    inbox.close()


def _stamped(sent_at, body):
    return [STAMP.pack(sent_at, 0) + body]


def _receive(inbox, count, seconds=2.0):
    got = collections.deque()
    deadline = time.monotonic() + seconds
    while len(got) < count and time.monotonic() < deadline:
        inbox.receive(got, 0.1)
    return [frames[0] for _, frames in got]


@pytest.mark.parametrize("earlier_on_first", [True, False])
def test_messages_from_several_senders_come_in_the_order_they_were_sent(two_senders,
                                                                        earlier_on_first):
    """Two processes that send to one end in turn (a lock or a barrier between their
    sends) are read in that order even when both streams are readable at once: the
    inbox merges what one poll brought by send time (CPython's Barrier test_thousand
    failed once on this: 514 before 513)."""
    inbox, senders = two_senders
    now = pipe_inbox.clock_ns()
    first, second = senders if earlier_on_first else senders[::-1]
    first.send(b"o", _stamped(now, b"sent first"))
    second.send(b"o", _stamped(now + 1000, b"sent second"))
    time.sleep(0.05)   # both streams readable before the one poll
    got = collections.deque()
    inbox.receive(got, 1.0)
    inbox.drain(got)
    assert [frames[0] for _, frames in got] == [b"sent first", b"sent second"]


@pytest.mark.parametrize("skew", ["far_ahead", "far_behind"])
def test_a_sender_whose_clock_is_off_is_neither_held_back_nor_lost(two_senders, skew):
    """Messages from several senders are merged by send time. A sender on another host
    stamps them with its own clock: one far ahead held its messages back for as long
    as it was ahead (a hang), so a message counts as sent no later than it was read."""
    inbox, senders = two_senders
    off_clock = (1 << 64) - 1 if skew == "far_ahead" else 0
    senders[0].send(b"o", _stamped(off_clock, b"from the other host"))
    senders[1].send(b"o", _stamped(pipe_inbox.clock_ns(), b"from this host"))
    assert sorted(_receive(inbox, 2)) == [b"from the other host", b"from this host"]


def test_one_senders_messages_keep_their_order_when_its_clock_is_set_back(two_senders,
                                                                          monkeypatch):
    """Merging by send time must not reorder one sender's messages when its wall clock
    steps back between two sends (NTP), nor local deliveries when this host's does."""
    inbox, senders = two_senders
    now = pipe_inbox.clock_ns()
    senders[0].send(b"o", _stamped(now, b"first"))
    senders[0].send(b"o", _stamped(now - 10**10, b"second, 10 s 'earlier'"))
    real_clock = pipe_inbox.clock_ns
    inbox.deliver_local(b"o", [b"local first"])
    monkeypatch.setattr(pipe_inbox, "clock_ns", lambda: real_clock() - 10**10)
    inbox.deliver_local(b"o", [b"local second"])
    monkeypatch.setattr(pipe_inbox, "clock_ns", real_clock)
    bodies = _receive(inbox, 4)
    assert len(bodies) == 4, bodies
    assert bodies.index(b"first") < bodies.index(b"second, 10 s 'earlier'")
    assert bodies.index(b"local first") < bodies.index(b"local second")


def test_an_inbox_closed_twice_closes_no_descriptor_it_no_longer_owns():
    """A second close of an inbox (or a wake-up after its close) must not touch the
    numbers its wake-up pipe had: they may belong to another file by then."""
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
