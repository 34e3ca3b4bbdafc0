"""fiberrl's pool: the ``multiprocessing.Pool`` API with a pending table.

``pool.py`` is the API, ``tasks.py`` the tasks and result objects, ``pending.py``
the pending table and retry budget, ``dispatch.py`` the I/O thread where idle
workers pull work, ``supervisor.py`` the thread that starts, reaps and scales
workers, and ``worker.py`` the loop inside each worker job.
"""
from .pool import Pool, PoolStats
from .tasks import ApplyResult, AsyncResult, IMapIterator, MapResult

__all__ = ["Pool", "PoolStats", "ApplyResult", "AsyncResult", "MapResult", "IMapIterator"]
