"""Task functions for test_pool_arg_cache.py (workers import this module by name)."""
import os
import time

import numpy as np

from fiberrl.pool.worker import cached_arg_bytes


def total(array, pause=0.0):
    """The sum of ``array`` (float64), this worker's pid and its cached bytes; modifies
    ``array`` in place afterwards (a task's arguments are its own)."""
    if pause:
        time.sleep(pause)
    result = float(array.astype(np.float64).sum())
    array += 1
    return result, os.getpid(), cached_arg_bytes()


def probe(pause):
    """This worker's pid and cached bytes, after ``pause`` seconds."""
    time.sleep(pause)
    return os.getpid(), cached_arg_bytes()


def tensor_total(tensor):
    """The sum of a torch ``tensor`` and this worker's pid; modifies it in place
    afterwards (a task's arguments are its own)."""
    result = float(tensor.double().sum())
    tensor += 1
    return result, os.getpid()


def receipt(array, pause=0.0):
    """The sum of ``array``, this worker's pid, its receipt counters (bytes copied in
    from its stream, entries mapped from host memory) and the inodes of the host
    segments it holds; modifies ``array`` in place afterwards (its own copy)."""
    from fiberrl.pool.worker import ARG_COUNTERS, cached_arg_segments
    if pause:
        time.sleep(pause)
    result = float(array.astype(np.float64).sum())
    array += 1
    return result, os.getpid(), dict(ARG_COUNTERS), sorted(cached_arg_segments().values())


def held_segments(pause):
    """This worker's pid and the inodes of the host segments it holds, after ``pause`` s."""
    from fiberrl.pool.worker import cached_arg_segments
    time.sleep(pause)
    return os.getpid(), sorted(cached_arg_segments().values())


def refuse_mapping():
    """Pool initializer: this worker cannot map host segments any more (the probe at its
    start, which has no data, still opens), as if /proc were closed to it."""
    from fiberrl.pool import segments

    attach = segments.Segment.attach.__func__

    def refused(cls, ref):
        if ref[3] > 0:
            raise OSError("mapping refused (test)")
        return attach(cls, ref)

    segments.Segment.attach = classmethod(refused)


def pretend_host(counter_path):
    """Pool initializer: this worker's host name becomes ``pretend-<n // 2>``, n counting
    the workers that ran this (two workers a "host"), as if they ran on other machines."""
    import fcntl
    import socket
    with open(counter_path, "a+") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        fh.seek(0)
        count = len(fh.read())
        fh.write("x")
    name = f"pretend-{count // 2}"
    socket.gethostname = lambda: name


def receipt_on_host(array, pause=0.0):
    """:func:`receipt` and this worker's host name."""
    import socket
    return (*receipt(array, pause), socket.gethostname())


def read_or_write(array, write):
    """The sum of ``array`` as it arrived, and this worker's task mappings (made, lent
    again); with ``write``, changes ``array`` in place afterwards (its own copy)."""
    from fiberrl.pool.segments import ARG_MAPPINGS
    result = float(array.astype(np.float64).sum())
    if write:
        array[::4096] += 1   # a few pages
    return result, os.getpid(), dict(ARG_MAPPINGS)
