"""Service "spawn": hands each job its payload once and records the exit it reports.

A job started by :class:`fiberrl.popen.Popen` says hello (its pid and host) as the
first message of its watch stream to its parent (:mod:`fiberrl._runtime.liveness`)
and receives what it runs there (the pickled process object and what it needs to
import the user's modules); its last message there reports its exit code. A token is
good for one hello. A job thus opens no other stream to its parent unless its own
code uses something that lives there (a queue, a pipe...).
"""
from __future__ import annotations

import logging
import weakref
from typing import Any, Dict, List, Tuple

from .._runtime.liveness import job_watch
from .._runtime.runtime import Runtime, service

logger = logging.getLogger(__name__)


class SpawnService:
    """Payloads waiting for their job's hello, and the jobs' ``Popen`` objects."""

    def __init__(self, rt: Runtime) -> None:
        self.runtime = rt
        self.pending: Dict[str, tuple] = {}
        self.popens: "weakref.WeakValueDictionary[str, Any]" = weakref.WeakValueDictionary()
        watch = job_watch()
        watch.serve_jobs(self._hello, self._exit)
        watch.on_end(self._job_ended)

    def add(self, token: str, popen: Any, prep: dict, frames: list) -> None:
        """Keep ``popen``'s payload until its job says hello."""
        self.pending[token] = (prep, frames)
        self.popens[token] = popen

    def _job_ended(self, token: str) -> None:
        self.pending.pop(token, None)  # it died before it said hello: nobody will

    def _hello(self, token: str, pid: int, host: str) -> Tuple[dict, List[Any]]:
        entry = self.pending.pop(token, None)
        if entry is None:
            raise LookupError("unknown or already used job token")
        popen = self.popens.get(token)
        if popen is not None:
            popen._on_hello(pid=pid, host=host)
        return entry

    def _exit(self, token: str, code: int) -> None:
        popen = self.popens.get(token)
        if popen is not None:
            popen.reported_exit = code


def spawn_service() -> SpawnService:
    """This process's spawn service (starts the runtime if needed)."""
    return service("spawn", SpawnService)
