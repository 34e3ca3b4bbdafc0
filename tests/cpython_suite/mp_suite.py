"""CPython's ``_test_multiprocessing`` with every ``multiprocessing`` name fiberrl's.

Imported by the runner (and by jobs, which import test classes by name) after
``mp_alias.install()``; the suite's own ``install_tests_in_module_dict`` builds
the process, thread and manager flavours of each test class here.
"""
import mp_alias

mp_alias.install()

import test._test_multiprocessing as _cpython  # noqa: E402

_cpython.install_tests_in_module_dict(globals(), "spawn")
