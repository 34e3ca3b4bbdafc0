"""A stdlib ``Connection`` relayed to a job on another host
(``fiberrl/_services/connection_relay.py``): the job's end speaks the stdlib's
``Connection`` API over the owner's relay. Here the job's side runs in this process
or in a local job, taking the relay's ticket as a job of a remote backend would."""
import multiprocessing
import os
import signal
import threading
import time

import pytest

import fiberrl
from fiberrl._services.connection_relay import RelayedConnection, rebuild, relay


def _relayed(conn):
    return rebuild(*relay(conn, None), conn.readable, conn.writable)


def test_messages_objects_poll_and_end_of_file_cross_the_relay():
    reader, writer = multiprocessing.Pipe(duplex=False)
    far_reader = _relayed(reader)
    assert isinstance(far_reader, RelayedConnection)
    assert far_reader.readable and not far_reader.writable
    assert far_reader.poll(0.05) is False
    writer.send_bytes(b"hello")
    writer.send({"x": [1, 2.5]})
    assert far_reader.poll(5)
    assert far_reader.recv_bytes() == b"hello"
    assert far_reader.recv() == {"x": [1, 2.5]}
    threading.Timer(0.3, writer.send_bytes, (b"late",)).start()
    started = time.monotonic()
    assert far_reader.recv_bytes() == b"late"          # blocks until it comes
    assert time.monotonic() - started >= 0.2
    buf = bytearray(10)
    writer.send_bytes(b"abc")
    assert far_reader.recv_bytes_into(buf, 2) == 3 and buf[2:5] == b"abc"
    with pytest.raises(OSError, match="write-only|read-only"):
        far_reader.send_bytes(b"no")
    writer.close()
    reader.close()   # the relay holds its own duplicate: the pipe is still readable there
    with pytest.raises(EOFError):
        far_reader.recv_bytes()
    far_reader.close()
    assert far_reader.closed
    with pytest.raises(OSError):
        far_reader.poll()


def test_the_writing_end_and_its_errors():
    reader, writer = multiprocessing.Pipe(duplex=False)
    far_writer = _relayed(writer)
    far_writer.send_bytes(b"0123456789", 2, 3)
    far_writer.send([1, "two"])
    assert reader.recv_bytes() == b"234"
    assert reader.recv() == [1, "two"]
    with pytest.raises(ValueError):
        far_writer.send_bytes(b"abc", 5)
    with pytest.raises(OSError, match="has no file descriptor here"):
        far_writer.fileno()
    reader.close()
    with pytest.raises(OSError, match="BrokenPipeError"):
        far_writer.send_bytes(b"into a closed pipe")
    far_writer.close()


def test_a_ticket_is_taken_once():
    reader, _writer = multiprocessing.Pipe(duplex=False)
    address, ticket = relay(reader, None)
    first = rebuild(address, ticket, True, False)
    with pytest.raises(fiberrl.errors.NotHereError):
        rebuild(address, ticket, True, False)
    first.close()


def _take_one_then_wait(address, ticket, out):
    conn = rebuild(address, ticket, True, False)
    out.put(conn.recv_bytes())
    conn.recv_bytes()   # waits here until it is killed


def test_a_job_that_dies_while_waiting_takes_no_message_with_it():
    """Its relay stops reading the pipe once the job's stream ends, so the next message
    goes to the next reader, not into a dead job."""
    reader, writer = multiprocessing.Pipe(duplex=False)
    out = fiberrl.SimpleQueue()
    job = fiberrl.Process(target=_take_one_then_wait, args=(*relay(reader, None), out))
    job.start()
    writer.send_bytes(b"first")
    assert out.get() == b"first"
    time.sleep(0.5)            # the job now waits for a second message
    os.kill(job.pid, signal.SIGKILL)
    job.join(30)
    time.sleep(1.0)            # its relay notices the stream's end within a slice
    writer.send_bytes(b"second")
    assert reader.poll(5) and reader.recv_bytes() == b"second"
