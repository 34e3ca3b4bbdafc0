"""fiberrl.parent_watch: a job's watch over its parent returns when told, and rides out
a dropped stream while the parent is still there."""
import os
import threading
import time

from fiberrl import parent_watch
from fiberrl.hub import get_hub


def _run(watch, where):
    sentinel_r, sentinel_w = os.pipe()
    stop_r, stop_w = os.pipe()
    thread = threading.Thread(target=watch, args=(where, 5.0, sentinel_w, stop_r), daemon=True)
    thread.start()
    return thread, sentinel_r, stop_w


def _door_channels(hub):
    return set(hub.door._channels.values())


def _wait_for_new(hub, known):
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        new = _door_channels(hub) - known
        if new:
            return new.pop()
        time.sleep(0.02)
    return None


def test_stream_watch_reconnects_and_stops_when_told():
    hub = get_hub()
    before = _door_channels(hub)
    thread, sentinel_r, stop_w = _run(parent_watch.watch_over_stream, hub.door.address)
    first = _wait_for_new(hub, before)
    assert first is not None, "the watcher never connected to the door"
    # the hub drops the watcher's stream (as if it had hiccuped): the watcher comes back
    hub.call_soon(lambda: first.sock.shutdown(2))
    assert _wait_for_new(hub, before | {first}) is not None, "the watcher did not reconnect"
    os.write(stop_w, b"x")
    thread.join(5)
    assert not thread.is_alive()
    os.set_blocking(sentinel_r, False)
    try:
        os.read(sentinel_r, 1)
        raise AssertionError("the parent sentinel fired although the parent is alive")
    except BlockingIOError:
        pass  # nothing to read and not closed: the parent still counts as alive


def test_zmq_watch_stops_when_told():
    thread, _, stop_w = _run(parent_watch.watch_over_zmq, get_hub().address)
    time.sleep(0.3)
    os.write(stop_w, b"x")
    thread.join(5)
    assert not thread.is_alive()
