"""``fiberrl.dummy.connection``: the stdlib's in-process connections (over queues)."""
from multiprocessing.dummy.connection import Client, Connection, Listener, Pipe, families

__all__ = ["Client", "Listener", "Pipe"]
_unused = (Connection, families)  # re-exported as in the stdlib
