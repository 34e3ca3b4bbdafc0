"""Service "spawn": hands each job its payload once and records the exit it reports.

A job started by :class:`fiberrl.popen.Popen` calls ``spawn.hello(token, pid, host)``
on its parent's runtime as its first act and receives what it runs (the pickled
process object and what it needs to import the user's modules); it reports its
exit code with ``spawn.exit`` before it ends. A token is good for one hello.
"""
from __future__ import annotations

import logging
import weakref
from typing import Any, Dict

from .._runtime.liveness import job_watch
from .._runtime.rpc import Request
from .._runtime.runtime import Runtime, service

logger = logging.getLogger(__name__)


class SpawnService:
    """Payloads waiting for their job's hello, and the jobs' ``Popen`` objects."""

    def __init__(self, rt: Runtime) -> None:
        self.runtime = rt
        self.pending: Dict[str, tuple] = {}
        self.popens: "weakref.WeakValueDictionary[str, Any]" = weakref.WeakValueDictionary()
        rt.rpc.register("spawn", self)
        job_watch().on_end(self._job_ended)

    def add(self, token: str, popen: Any, prep: dict, frames: list) -> None:
        """Keep ``popen``'s payload until its job says hello."""
        self.pending[token] = (prep, frames)
        self.popens[token] = popen

    def _job_ended(self, token: str) -> None:
        self.pending.pop(token, None)  # it died before it said hello: nobody will

    def __call__(self, op: str, request: Request) -> None:
        token = request.args[0]
        if op == "hello":
            entry = self.pending.pop(token, None)
            if entry is None:
                request.fail(LookupError("unknown or already used job token"))
                return
            prep, frames = entry
            popen = self.popens.get(token)
            if popen is not None:
                popen._on_hello(pid=request.args[1], host=request.args[2])
            request.reply(prep, body=frames)
        elif op == "exit":
            popen = self.popens.get(token)
            if popen is not None:
                popen.reported_exit = request.args[1]
        else:
            request.fail(ValueError(f"unknown spawn op {op!r}"))


def spawn_service() -> SpawnService:
    """This process's spawn service (starts the runtime if needed)."""
    return service("spawn", SpawnService)
