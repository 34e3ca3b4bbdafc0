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
