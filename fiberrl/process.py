"""``fiberrl.Process``: a ``multiprocessing`` process whose body runs as a job.

The class reuses CPython's ``multiprocessing.process.BaseProcess`` (names, daemon
flag, ``_children`` bookkeeping, ``current_process()``, ``parent_process()`` and
``active_children()`` all behave exactly as in the stdlib); only the launch seam
``_Popen`` differs: it hands the process to :mod:`fiberrl.popen`, which asks the
backend for a job.
"""
from __future__ import annotations

import os
from multiprocessing import process as _mp_process
from typing import Any, Callable, Dict, Iterable, Mapping, Optional

from . import resources as _resources

current_process = _mp_process.current_process
parent_process = _mp_process.parent_process
active_children = _mp_process.active_children
BaseProcess = _mp_process.BaseProcess
AuthenticationString = _mp_process.AuthenticationString
ORIGINAL_DIR = _mp_process.ORIGINAL_DIR

__all__ = ["BaseProcess", "Process", "current_process", "active_children", "parent_process"]


_cleanup_at = {"size": 64}   # the number of children at which start() looks for ended ones


def _forget_ended_children() -> None:
    """Drop ended processes from the stdlib's set of children, as its ``start()`` does,
    but only when the set has doubled since the last look: asking every child at each
    start made starting n processes (a pool's workers) take n * n / 2 polls.
    ``active_children()`` still looks every time."""
    if len(_mp_process._children) >= _cleanup_at["size"]:
        _mp_process._cleanup()
        _cleanup_at["size"] = max(64, 2 * len(_mp_process._children))


class Process(_mp_process.BaseProcess):
    """A process object whose ``start()`` submits a job to the configured backend.

    Arguments are those of ``multiprocessing.Process`` plus optional resource hints
    ``cpu``, ``mem`` (bytes or ``"2G"``) and ``gpu``, and backend-specific ones such as
    ``time_limit`` or ``partition`` (see :mod:`fiberrl.resources`); they override
    hints set with ``@fiberrl.meta`` on the target.
    """

    _start_method = None  # the stdlib must not switch its own context in the job
    _fiberrl_start_method: Optional[str] = None  # the job's fiberrl.get_start_method()

    def __init__(self, group: None = None, target: Optional[Callable[..., Any]] = None,
                 name: Optional[str] = None, args: Iterable[Any] = (),
                 kwargs: Optional[Mapping[str, Any]] = None, *, daemon: Optional[bool] = None,
                 cpu: Optional[float] = None, mem: Any = None, gpu: Optional[int] = None,
                 **hints: Any) -> None:
        if target is not None and not callable(target):
            raise TypeError(f"Process target must be callable, got {type(target).__name__} {target!r:.80}")
        if kwargs is not None and not isinstance(kwargs, Mapping):
            raise TypeError(f"Process kwargs must be a mapping, got {type(kwargs).__name__}")
        super().__init__(group, target, name, tuple(args), dict(kwargs or {}), daemon=daemon)
        self._resources: Dict[str, Any] = {**_resources.hints_of(target),
                                           **_resources.validate(cpu, mem, gpu, **hints)}

    def __getstate__(self) -> dict:
        """What travels to the job: everything but the authkey when it is the run's
        secret, which the job receives once, in its environment."""
        state = dict(self.__dict__)
        config = state.get("_config")
        if config is not None and "authkey" in config:
            from ._wire.auth import run_secret
            if bytes(config["authkey"]) == run_secret():
                state["_config"] = {k: v for k, v in config.items() if k != "authkey"}
        return state

    def start(self) -> None:
        """Start the process as a job (the stdlib's ``start()``; its :attr:`sentinel`,
        a descriptor, is made only when first asked for: a pool of thousands of workers
        holds none)."""
        self._check_closed()
        assert self._popen is None, "cannot start a process twice"
        assert self._parent_pid == os.getpid(), \
            "can only start a process object created by current process"
        assert not _mp_process._current_process._config.get("daemon"), \
            "daemonic processes are not allowed to have children"
        _forget_ended_children()
        self._popen = self._Popen(self)
        # as the stdlib: no reference cycle through a target that refers to its process
        del self._target, self._args, self._kwargs
        _mp_process._children.add(self)

    @property
    def _sentinel(self) -> int:
        """What the stdlib's ``sentinel`` property returns: the job's, made on first use."""
        popen = self._popen
        if popen is None:
            raise AttributeError("_sentinel")   # the stdlib then says "process not started"
        return popen.sentinel

    @_sentinel.deleter
    def _sentinel(self) -> None:
        pass   # close() drops it with the Popen, which closes it

    @staticmethod
    def _Popen(process_obj: "Process"):
        from .popen import Popen
        return Popen(process_obj)

    def __repr__(self) -> str:
        """As the stdlib's, but never waiting: a job that has not connected yet (a
        pending cluster job) shows ``pid=None`` instead of blocking until it does."""
        popen = self._popen
        if popen is None or self._closed or not hasattr(popen, "known_pid"):
            return super().__repr__()
        code = popen.poll()
        parts = [type(self).__name__, f"name={self._name!r}", f"pid={popen.known_pid}",
                 f"parent={self._parent_pid}", "started" if code is None else "stopped"]
        if code is not None:   # signals by name, as the stdlib writes them
            parts.append(f"exitcode={_mp_process._exitcode_to_name.get(code, code)}")
        if self.daemon:
            parts.append("daemon")
        return f"<{' '.join(parts)}>"

    @property
    def job_id(self) -> Optional[str]:
        """The backend's id of this process's job (None before ``start()``)."""
        popen = self._popen
        job = getattr(popen, "job", None)
        return job.id if job is not None else None

    @property
    def exit_reason(self) -> str:
        """Why the job ended, as the backend tells it (empty while running or on success)."""
        popen = self._popen
        if popen is None or popen.poll() is None:
            return ""
        return popen.reason

    def job_logs(self, tail: int = 50) -> str:
        """The last ``tail`` lines of this job's output, as the backend kept them."""
        self._check_started()
        return self._popen.logs(tail)

    def _check_started(self) -> None:
        if self._popen is None:
            raise ValueError("process not started")


class SpawnProcess(Process):
    """``get_context("spawn").Process``: a job that reports ``"spawn"`` as its start method."""

    _fiberrl_start_method = "spawn"


class ForkProcess(Process):
    """``get_context("fork").Process``: a job (nothing of this process's memory is
    inherited) that reports ``"fork"`` as its start method."""

    _fiberrl_start_method = "fork"


class ForkServerProcess(Process):
    """``get_context("forkserver").Process``: a job that reports ``"forkserver"``."""

    _fiberrl_start_method = "forkserver"


def __getattr__(name: str) -> Any:
    """Private bookkeeping (``_children``, ``_dangling``, ``_cleanup``...) is the stdlib's:
    fiberrl's processes are ``BaseProcess`` objects and share it."""
    if name.startswith("_") and not name.startswith("__"):
        return getattr(_mp_process, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
