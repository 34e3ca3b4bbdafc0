"""Services a process offers on its runtime (see :mod:`fiberrl._runtime.rpc`)."""
