"""fiberrl's pool: the ``multiprocessing.Pool`` API with a pending table.

``pool.py`` is the API, ``tasks.py`` the tasks and result objects (``imap.py`` the
iterator of ``imap``), ``pending.py`` the pending table and retry budget,
``dispatch.py`` the I/O thread where idle workers pull work (``links.py`` its view of
one worker and the message that hands it tasks), ``supervisor.py`` the thread that starts, reaps and scales
workers, and ``worker.py`` the loop inside each worker job. Names are resolved
lazily, so a worker job imports only ``worker.py``.

The stdlib's names that keep their meaning here are the stdlib's own objects:
the pool states, the exception types a task error arrives with (its ``__cause__``
is a ``RemoteTraceback``; an unpicklable result is a ``MaybeEncodingError``), and
``ThreadPool`` (threads of this process, as in the stdlib).
"""
from multiprocessing.pool import (CLOSE, RUN, TERMINATE, ExceptionWithTraceback,
                                  MaybeEncodingError, RemoteTraceback, ThreadPool, mapstar,
                                  rebuild_exc, starmapstar)
from typing import Any

__all__ = ["Pool", "ThreadPool", "PoolStats", "ApplyResult", "AsyncResult", "MapResult",
           "IMapIterator", "IMapUnorderedIterator", "RemoteTraceback", "MaybeEncodingError",
           "ExceptionWithTraceback", "rebuild_exc", "mapstar", "starmapstar", "RUN", "CLOSE",
           "TERMINATE"]

_HOMES = {"Pool": "pool", "PoolStats": "pool", "ApplyResult": "tasks", "AsyncResult": "tasks",
          "MapResult": "tasks", "IMapIterator": "imap", "IMapUnorderedIterator": "imap"}


def __getattr__(name: str) -> Any:
    if name in _HOMES:
        import importlib
        return getattr(importlib.import_module(f".{_HOMES[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
