"""CPython 3.11's ``test_concurrent_futures`` process-pool tests, with the spawn
flavour's ``mp_context`` bound to fiberrl's context (``CF_SUITE_CONTEXT=spawn`` keeps
the stdlib's spawn context, for the baseline).

The test module is Debian's ``libpython3.11-testsuite`` file, copied by the runner
(``tests/test_concurrent_futures_suite.py``) into a directory on ``PYTHONPATH``, so
that jobs import the functions its tasks name (the stdlib's queue pickles them by
reference). Only the ``ProcessPoolSpawn*`` classes are collected here.
"""
import os

import fiberrl
import test_concurrent_futures as _cpython

if os.environ.get("CF_SUITE_CONTEXT", "fiberrl") == "fiberrl":
    def _fiberrl_context(self):
        return fiberrl.get_context()
    _cpython.ProcessPoolSpawnMixin.get_context = _fiberrl_context

for _name, _obj in list(vars(_cpython).items()):
    if _name.startswith("ProcessPoolSpawn") and isinstance(_obj, type):
        globals()[_name] = _obj
