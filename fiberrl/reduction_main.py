"""Functions of the parent's main script, sent by value: one namespace per job.

A job does not run the parent's main script (``if __name__ == "__main__"`` code and
functions defined at the prompt could not be found there by name), so functions of
``__main__`` travel by value (cloudpickle), each pickle bringing the globals they use.
Left at that, every function unpickled in a job would get a fresh globals dict, and
a global assigned in the job would be seen by that one function only:
``ProcessPoolExecutor(initializer=init)`` whose ``init`` sets a global for the tasks
would leave the tasks seeing the parent's value.

So, as with the stdlib, where the child's ``__main__`` is one module of its own,
every by-value function of the main script that a job receives lives in one namespace
of that job: its stand-in for the parent's script (``fiberrl.spawn``), where
functions pickled by reference are found too. A global name first comes from the first pickle that brings it; from then
on the job's own value is kept (what an initializer, a task's ``global`` statement or
an earlier target assigned), and a later pickle's copy of it is ignored, as a stdlib
child does not see the parent's later assignments either.
"""
from __future__ import annotations

import sys
import threading
from typing import Any, Dict

from cloudpickle import cloudpickle as _cloudpickle_impl

#: module names whose functions this applies to
MAIN_NAMES = ("__main__", "__mp_main__")

_namespaces: Dict[str, Dict[str, Any]] = {}
_lock = threading.Lock()


def is_main_function(func: Any) -> bool:
    """Whether ``func`` (sent by value) belongs to the parent's main script."""
    return getattr(func, "__globals__", {}).get("__name__") in MAIN_NAMES


def make_function(code: Any, base_globals: Dict[str, Any], name: Any, argdefs: Any,
                  closure: Any) -> Any:
    """cloudpickle's ``_make_function``, in this process's one namespace for the main
    script (made from the first pickle's module attributes)."""
    main = sys.modules.get("__main__")
    if getattr(main, "is_parent_main", False):   # a job: the stand-in for the parent's script
        namespace = main.__dict__
    else:
        with _lock:
            namespace = _namespaces.setdefault("__main__", dict(base_globals))
    return _cloudpickle_impl._make_function(code, namespace, name, argdefs, closure)


def set_function_state(func: Any, state: Any) -> None:
    """cloudpickle's ``_function_setstate``, except that a global already in the
    namespace keeps its value here (module doc)."""
    attributes, slots = state
    namespace = func.__globals__
    with _lock:
        slots["__globals__"] = {key: value for key, value in slots["__globals__"].items()
                                if key not in namespace}
        _cloudpickle_impl._function_setstate(func, (attributes, slots))


__all__ = ["MAIN_NAMES", "is_main_function", "make_function", "set_function_state"]
