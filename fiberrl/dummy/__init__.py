"""``fiberrl.dummy``: the ``multiprocessing`` API over threads of this process.

It is the stdlib's ``multiprocessing.dummy`` itself: threads share this process's
memory, so nothing here becomes a job and nothing differs from the stdlib.
"""
from multiprocessing.dummy import (Array, Barrier, BoundedSemaphore, Condition, DummyProcess,
                                   Event, JoinableQueue, Lock, Manager, Namespace, Pipe, Pool,
                                   Process, Queue, RLock, Semaphore, Value, active_children,
                                   current_process, freeze_support, shutdown)

__all__ = ["Process", "current_process", "active_children", "freeze_support", "Lock", "RLock",
           "Semaphore", "BoundedSemaphore", "Condition", "Event", "Barrier", "Queue", "Manager",
           "Pipe", "Pool", "JoinableQueue"]
_unused = (Array, DummyProcess, Namespace, Value, shutdown)  # re-exported as in the stdlib
