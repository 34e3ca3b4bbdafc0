"""Map every ``multiprocessing`` import to fiberrl, for CPython's own test suite.

:func:`install` imports fiberrl and each of its stdlib-named submodules first (they
bind the stdlib's modules they build on), then puts them in ``sys.modules`` under
the stdlib's names: from then on ``import multiprocessing``, ``import
multiprocessing.pool``, ``from multiprocessing import util`` anywhere in the process
give fiberrl's modules. It also installs a meta-path finder for any
``multiprocessing.<name>`` that fiberrl has and that was not imported yet.

A module fiberrl does not provide (``multiprocessing.resource_tracker``,
``multiprocessing.resource_sharer``...) stays the stdlib's. Tripwires record any
object of the stdlib's own process, queue or pool classes created afterwards to
the file named by ``CPYTHON_SUITE_TRIPWIRE`` (one line each, from any job too).
"""
import importlib
import importlib.abc
import importlib.util
import os
import sys

SUBMODULES = ("connection", "pool", "managers", "queues", "synchronize", "sharedctypes", "dummy",
              "dummy.connection", "shared_memory", "util", "reduction", "process", "context",
              "heap")


#: the stdlib's per-host helpers that fiberrl does not replace: they stay the stdlib's
STDLIB_ONLY = ("resource_tracker", "resource_sharer", "spawn", "forkserver", "popen_fork",
               "popen_spawn_posix", "popen_forkserver")


class _AliasFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds ``multiprocessing.X`` as ``fiberrl.X`` when the latter exists."""

    def find_spec(self, name, path=None, target=None):
        if name != "multiprocessing" and not name.startswith("multiprocessing."):
            return None
        ours = "fiberrl" + name[len("multiprocessing"):]
        if importlib.util.find_spec(ours) is None:
            return None
        return importlib.util.spec_from_loader(name, self)

    def create_module(self, spec):
        return importlib.import_module("fiberrl" + spec.name[len("multiprocessing"):])

    def exec_module(self, module):
        """The fiberrl module is already executed."""


def _tripwire(cls, label):
    original = cls.__init__

    def __init__(self, *args, **kwargs):
        if type(self) is cls or label.endswith("*"):
            with open(os.environ["CPYTHON_SUITE_TRIPWIRE"], "a") as sink:
                sink.write(f"{os.getpid()} {label} {type(self).__qualname__}\n")
        original(self, *args, **kwargs)
    cls.__init__ = __init__


#: the stdlib's classes under tripwire, by name (for the runner's check that they fire)
STDLIB_CLASSES = {}


def _set_tripwires():
    if not os.environ.get("CPYTHON_SUITE_TRIPWIRE"):
        return
    import multiprocessing.context as ctx
    import multiprocessing.pool as pool
    import multiprocessing.queues as queues
    for cls in (ctx.Process, ctx.SpawnProcess, ctx.ForkProcess, ctx.ForkServerProcess):
        _tripwire(cls, "stdlib-process*")
        STDLIB_CLASSES[cls.__name__] = cls
    for cls in (queues.Queue, queues.JoinableQueue, queues.SimpleQueue, pool.Pool):
        _tripwire(cls, "stdlib-" + cls.__name__)
        STDLIB_CLASSES[cls.__name__] = cls


def install():
    """Alias the stdlib's names to fiberrl's modules in this process (idempotent)."""
    if getattr(sys.modules.get("multiprocessing"), "__name__", "") == "fiberrl":
        return
    _set_tripwires()  # on the stdlib's classes, before the names move
    import fiberrl
    for name in STDLIB_ONLY:  # reachable as multiprocessing.<name> after the switch
        setattr(fiberrl, name, importlib.import_module("multiprocessing." + name))
    modules = {"multiprocessing": fiberrl}
    for sub in SUBMODULES:
        modules["multiprocessing." + sub] = importlib.import_module("fiberrl." + sub)
    sys.modules.update(modules)
    sys.meta_path.insert(0, _AliasFinder())
