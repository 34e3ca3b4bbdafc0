"""fiberrl.stream: signed messages of every size arrive whole, in order, writable."""
import select
import threading

import numpy as np
import pytest

from fiberrl.stream import UNIX, Listener, StreamConnection, unix_supported


def _connected_pair(host):
    listener = Listener(host)
    box = {}
    connector = threading.Thread(
        target=lambda: box.setdefault("conn", StreamConnection(listener.address, 10)))
    connector.start()
    select.select([listener], [], [], 10)
    channel = listener.accept()
    while not channel.authenticated:   # the connector's proof arrives
        select.select([channel], [], [], 10)
        assert channel.on_readable() == []
    connector.join(10)
    return listener, channel, box["conn"]


def _drain(channel, count):
    got = []
    while len(got) < count:
        select.select([channel], [], [], 10)
        got.extend(channel.on_readable())
    return got


@pytest.mark.parametrize("host", ["127.0.0.1", UNIX])
def test_small_and_large_messages_arrive_whole_and_in_order(host):
    if host == UNIX and not unix_supported():
        pytest.skip("no abstract Unix sockets here")
    listener, channel, conn = _connected_pair(host)
    big = np.arange(3 * (1 << 20) // 8, dtype=np.float64)
    sent = [(("small", 1), []), (("big", 2), [big, b"tail" * 1000]), (("after", 3), [b"x"])]
    writer = threading.Thread(target=lambda: [conn.send(h, b) for h, b in sent])
    writer.start()
    got = _drain(channel, 3)
    writer.join(10)
    assert [h for h, _ in got] == [h for h, _ in sent]
    arr = np.frombuffer(got[1][1][0], dtype=np.float64)
    assert np.array_equal(arr, big) and bytes(got[1][1][1]) == b"tail" * 1000
    assert not got[1][1][0].readonly   # numpy users may write into what they get
    replies = []
    reader = threading.Thread(target=lambda: replies.append(conn.recv(timeout=10)))
    reader.start()
    channel.send(("reply",), [big])    # and the other way, into the blocking end
    while channel.wants_write:
        select.select([], [channel], [], 10)
        channel.on_writable()
    reader.join(10)
    header, buffers = replies[0]
    assert header == ("reply",) and np.array_equal(np.frombuffer(buffers[0]), big)
    conn.close()
    channel.close()
    listener.close()
