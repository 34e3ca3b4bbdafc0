"""``Inbox.take``, the pipe's hot path: a lone small message of the wanted kind comes back
as its payload, one of another kind goes to the pending messages; anything else (several
messages in one read, a large message, a second sender, the stream's end) is left to
``Inbox.receive`` with nothing lost and the order kept; a forged message drops the
stream before anything is used."""
import collections
import os
import socket
import struct
import threading

import pytest

from fiberrl._services.pipe_inbox import STREAM_DROPPED, Inbox
from fiberrl._services.pipe_outbox import Outbox
from fiberrl._wire.auth import Signer
from fiberrl._wire.framing import ONE_HEAD_FORMAT, write_signed
from fiberrl.errors import ForgedMessageError


@pytest.fixture
def lone():
    """An inbox with one sender stream over a Unix socket pair, and that sender."""
    key = os.urandom(32)
    ours, theirs = socket.socketpair()
    inbox = Inbox()
    assert inbox.attach(ours, key, b"")
    sender = Outbox(theirs, key, os.urandom(32))
    yield inbox, sender, key
    sender.close()
    inbox.close()


def _receive_all(inbox, into, count):
    """What take() left to receive(): read until ``count`` messages are in ``into``."""
    for _ in range(100):
        if len(into) >= count:
            return
        inbox.receive(into, 0.2)
    raise AssertionError(f"only {len(into)} of {count} messages arrived")


def test_a_lone_message_of_the_kind_comes_back_as_its_payload(lone):
    inbox, sender, _ = lone
    into = collections.deque()
    sender.send_small(b"o", b"step 1")
    assert inbox.take(b"o", into, 5.0) == b"step 1"
    sender.send_small(b"b", b"")
    assert inbox.take(b"b", into, 5.0) == b""
    assert not into


def test_nothing_within_the_timeout_is_none(lone):
    inbox, _, _ = lone
    into = collections.deque()
    assert inbox.take(b"o", into, 0.05) is None
    assert not into


def test_a_message_already_there_is_read_without_a_wait(lone, monkeypatch):
    """A reply that arrived before the ``recv`` costs one read: no ``epoll``, no spin."""
    inbox, sender, _ = lone
    sender.send_small(b"o", b"here already")

    def no_wait(timeout):
        raise AssertionError("take() waited for a message that was there")
    monkeypatch.setattr(inbox, "_events", no_wait)
    assert inbox.take(b"o", collections.deque(), 5.0) == b"here already"


def test_the_read_before_the_wait_backs_off_while_it_finds_nothing(lone):
    """A try that found nothing skips the next one (then 2, 4, ...); the message still
    comes through the wait, and a try that finds one tries at every wait again."""
    inbox, sender, _ = lone
    into = collections.deque()
    assert inbox.take(b"o", into, 0.01) is None          # tried, found nothing
    assert inbox._probe.skip == 1
    threading.Timer(0.05, sender.send_small, (b"o", b"late")).start()
    assert inbox.take(b"o", into, 5.0) == b"late"        # no try: it waited for it
    assert inbox._probe.skip == 0
    sender.send_small(b"o", b"early")
    assert inbox.take(b"o", into, 5.0) == b"early"       # tried, and found it
    assert inbox._probe.skip == 0 and inbox._probe._backoff == 0
    assert not into


def test_several_messages_in_one_read_all_go_to_the_general_path_in_order(lone):
    inbox, sender, _ = lone
    into = collections.deque()
    for i in range(5):
        sender.send_small(b"o", b"m%d" % i)
    assert inbox.take(b"o", into, 5.0) is None
    _receive_all(inbox, into, 5)
    assert [(kind, frames) for kind, frames in into] == [(b"o", [b"m%d" % i]) for i in range(5)]


def test_a_lone_message_of_another_kind_waits_in_the_pending_messages(lone):
    inbox, sender, _ = lone
    into = collections.deque()
    sender.send_small(b"b", b"raw bytes")
    assert inbox.take(b"o", into, 5.0) is None
    assert list(into) == [(b"b", [b"raw bytes"])]


def test_kind_none_takes_any_lone_message_into_the_pending_ones(lone):
    """``Connection.poll``'s wait: whatever comes is kept for the recv that follows."""
    inbox, sender, _ = lone
    into = collections.deque()
    sender.send_small(b"o", b"an object")
    assert inbox.take(None, into, 5.0) is None
    sender.send_small(b"b", b"")
    assert inbox.take(None, into, 5.0) is None
    assert list(into) == [(b"o", [b"an object"]), (b"b", [b""])]
    assert inbox.take(None, into, 0.05) is None and len(into) == 2


def test_a_large_message_arrives_whole_through_the_general_path(lone):
    inbox, sender, _ = lone
    into = collections.deque()
    data = os.urandom(3 << 20)   # larger than the scratch buffer: read in many pieces
    writer = threading.Thread(target=sender.send, args=(b"b", [b"", data]))
    writer.start()
    assert inbox.take(b"b", into, 5.0) is None   # began: not a lone small message
    while not into:
        assert inbox.take(b"b", into, 0.0) is None   # a message is begun: hands off
        inbox.receive(into, 0.5)
    writer.join()
    (kind, frames), = into
    assert kind == b"b" and bytes(frames[-1]) == data
    sender.send_small(b"o", b"after")   # and the hot path carries on after it
    assert inbox.take(b"o", collections.deque(), 5.0) == b"after"


def test_a_forged_message_drops_the_stream_before_anything_is_used(lone):
    inbox, sender, _ = lone
    into = collections.deque()
    head = struct.pack(ONE_HEAD_FORMAT + "QB", b"o", 1, 9 + 6, 0, 0) + b"forged"
    write_signed(sender.sock, Signer(b"\0" * 32), head)   # signed with another key
    with pytest.raises(ForgedMessageError):
        inbox.take(b"o", into, 5.0)
    assert not into
    assert sender.peer_hung_up()   # the inbox closed its end of the stream
    assert inbox.take(b"o", into, 0.05) is None   # no stream left to read
    assert inbox.receive(into, 0.05) == 0 and not into


def test_a_second_sender_turns_the_hot_path_off_and_receive_keeps_send_order(lone):
    inbox, sender, key = lone
    ours, theirs = socket.socketpair()
    assert inbox.attach(ours, key, b"")
    second = Outbox(theirs, key, os.urandom(32))
    into = collections.deque()
    sender.send_small(b"o", b"first")
    second.send_small(b"o", b"second")
    assert inbox.take(b"o", into, 5.0) is None
    _receive_all(inbox, into, 2)
    assert [frames[0] for _, frames in into] == [b"first", b"second"]
    second.close()


def test_the_streams_end_is_left_for_receive_to_report(lone):
    inbox, sender, _ = lone
    into = collections.deque()
    sender.send_small(b"o", b"last words")
    sender.close()
    got = inbox.take(b"o", into, 5.0)
    if got is None:   # the message and the end came as one event
        _receive_all(inbox, into, 1)
        got = into.popleft()[1][0]
    assert got == b"last words"
    assert inbox.take(b"o", into, 5.0) is None
    assert inbox.receive(into, 5.0) == STREAM_DROPPED and not into
