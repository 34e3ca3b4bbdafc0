"""Installs the multiprocessing -> fiberrl aliases at start-up in every process of a
CPython-suite run (the runner and each job it starts), see ``mp_alias``."""
import os

if os.environ.get("CPYTHON_SUITE_ALIAS") == "1":
    import mp_alias
    mp_alias.install()
