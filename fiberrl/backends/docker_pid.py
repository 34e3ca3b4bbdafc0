"""Which PID namespace a Docker job runs in (the ``docker_pid_namespace`` setting).

- ``run`` (default): one namespace per run, held by a small long-lived *holder*
  container (like Kubernetes' pause container) that the first job of the run starts;
  every job container joins it with ``pid_mode="container:<holder>"``. Pids are then
  unique among the run's jobs, ``os.getpid()`` in a job is the pid its parent reports
  as ``Process.pid``, and no container sees the host's processes (the jobs of one run
  do see, and may signal, each other, as processes of one host do).
- ``private``: Docker's default, a namespace per container; every job has the same
  small pid, so code that keys processes by pid (``concurrent.futures``) breaks.
- ``host``: the host's namespace (``pid_mode="host"``): host pids, and every
  container sees every process of the host.

The holder runs ``docker_python`` with the mounts of the job that started it (the
interpreter may live in one of them), under ``docker-init`` as its pid 1, which reaps
the zombies of every job (Docker adds no init to a container that joins another's
namespace, so a job's python
is neither pid 1 nor under an init of its own: signals act as on a host). When the
holder ends, the kernel kills every process of the namespace: its jobs end by
SIGKILL, and :meth:`PidNamespace.lost_reason` says why. The process that started the
holder removes it when it exits (or when fiberrl's configuration changes and none of
its jobs is alive); one left by a killed master exits by itself once no process of
the run has been in its namespace for ``IDLE_EXIT`` seconds. A later job of the run
then starts a new holder.
"""
from __future__ import annotations

import logging
import os
import re
import threading
import time
from multiprocessing import util as _mp_util
from typing import Any, Dict, Mapping, Optional, Set, Tuple

from ..errors import BackendError, ConfigError

logger = logging.getLogger(__name__)

MODES = ("run", "private", "host")
DEFAULT_MODE = "run"
HOLDER_ROLE = "pid-namespace"
IDLE_EXIT = 120.0
_IDLE_STEP = 5.0

#: the holder's one process besides its init: exit once nothing else has lived in the
#: namespace for IDLE_EXIT seconds (pid 1 is docker-init, the rest are the run's jobs)
_HOLDER_SCRIPT = (
    "import os, time\n"
    "idle = 0.0\n"
    f"while idle < {IDLE_EXIT}:\n"
    f"    time.sleep({_IDLE_STEP})\n"
    "    others = [p for p in os.listdir('/proc')\n"
    "              if p.isdigit() and int(p) not in (1, os.getpid())]\n"
    f"    idle = 0.0 if others else idle + {_IDLE_STEP}\n"
)


def check_mode(extra: Mapping[str, Any]) -> str:
    """The ``docker_pid_namespace`` setting of ``extra``; ConfigError for a bad value."""
    mode = extra.get("docker_pid_namespace", DEFAULT_MODE)
    if mode not in MODES:
        raise ConfigError(f"fiberrl setting 'docker_pid_namespace' must be one of "
                          f"{', '.join(repr(m) for m in MODES)}, got {mode!r}")
    return mode


def start_or_remove(client: Any, docker: Any, image: str, options: Dict[str, Any]) -> Any:
    """``client.containers.run(image, **options)``, except that a container created but
    refused at its start (a PID namespace whose holder ended, a bad mount) is removed
    before the error is raised: left behind, it would keep its name, and the next try
    under that name would fail with a 409 conflict."""
    container = client.containers.create(image, **options)
    try:
        container.start()
    except docker.errors.APIError:
        try:
            container.remove(force=True)
        except docker.errors.APIError as exc:
            logger.debug("could not remove container %s after its failed start: %s",
                         container.name, exc)
        raise
    return container


def holder_name(run: str) -> str:
    """The holder container's name for run ``run`` (one per run and dockerd)."""
    slug = re.sub(r"[^a-zA-Z0-9_.-]", "-", run).strip("-.")[:80] or "run"
    return f"fiberrl-pidns-{slug}"


_shared: Dict[Tuple[int, str, str], "PidNamespace"] = {}
_shared_lock = threading.Lock()


def shared(docker: Any, run: str, labels: Dict[str, str]) -> "PidNamespace":
    """This process's one :class:`PidNamespace` for ``run`` on the dockerd of
    ``DOCKER_HOST``: every Docker backend object of the process (``fiberrl.init`` makes
    a new one) shares it, so one that retires cannot remove a holder whose namespace
    another one's jobs live in."""
    key = (os.getpid(), run, os.environ.get("DOCKER_HOST", ""))
    with _shared_lock:
        found = _shared.get(key)
        if found is None:
            found = _shared[key] = PidNamespace(docker.from_env(timeout=60), docker, run,
                                                labels)
            # after the stdlib's exit handler has joined (or terminated) the children
            _mp_util.Finalize(found, found.remove, exitpriority=-10)
        return found


class PidNamespace:
    """The run's holder container on one dockerd: started on first use, joined by
    every job, removed by the process that started it when none of its jobs lives."""

    def __init__(self, client: Any, docker: Any, run: str, labels: Dict[str, str]) -> None:
        self._client, self._docker = client, docker
        self.name = holder_name(run)
        self._labels = labels
        self._lock = threading.Lock()
        self._id: Optional[str] = None
        self._owned: Optional[str] = None  # the id of the holder this process started
        self._live: Set[str] = set()  # this process's jobs in it, not yet seen ending

    def joined(self, job: str) -> None:
        """Job container ``job`` was started in the namespace."""
        with self._lock:
            self._live.add(job)

    def left(self, job: str) -> None:
        """Job container ``job`` was seen ending."""
        with self._lock:
            self._live.discard(job)

    def remove_if_idle(self) -> None:
        """Remove the holder now if none of this process's jobs lives in it."""
        with self._lock:
            ident = self._take_owned() if not self._live else None
        self._remove(ident)

    def pid_mode(self, image: str, python: str,
                 volumes: Optional[Dict[str, Any]] = None) -> str:
        """``container:<id>`` of a running holder, starting one if there is none (with
        ``volumes``, the job's mounts, in which ``python`` may live)."""
        with self._lock:
            if self._id is None or not self._running(self._id):
                self._id = self._ensure(image, python, volumes)
            return f"container:{self._id}"

    def forget(self) -> None:
        """The holder refused a job (it ended meanwhile): look it up again next time."""
        with self._lock:
            self._id = None

    def _running(self, ident: str) -> bool:
        try:
            return self._client.containers.get(ident).status == "running"
        except self._docker.errors.NotFound:
            return False
        except self._docker.errors.APIError as exc:
            logger.debug("inspect of pid-namespace holder %s: %s", ident, exc)
            return True  # let the job's own start say what is wrong

    def _ensure(self, image: str, python: str, volumes: Optional[Dict[str, Any]]) -> str:
        deadline = time.monotonic() + 30.0
        while True:
            try:
                found = self._client.containers.get(self.name)
                if found.status == "running":
                    return found.id
            except self._docker.errors.NotFound:
                found = None
            if found is None:
                try:
                    return self._start(image, python, volumes)
                except self._docker.errors.APIError as exc:
                    if exc.status_code != 409:  # 409: another process of the run made it
                        raise BackendError(f"dockerd refused the run's pid-namespace holder "
                                           f"{self.name}: {exc.explanation or exc}") from exc
            if time.monotonic() > deadline:
                raise BackendError(f"the run's pid-namespace holder {self.name} does not "
                                   f"run (state {getattr(found, 'status', 'unknown')!r})")
            time.sleep(0.2)  # an ended holder being removed, or one starting

    def _start(self, image: str, python: str, volumes: Optional[Dict[str, Any]]) -> str:
        started = time.monotonic()
        options = dict(command=[python, "-c", _HOLDER_SCRIPT], name=self.name, detach=True,
                       init=True, auto_remove=True, network_mode="none", labels=self._labels,
                       stdin_open=False)
        if volumes:
            options["volumes"] = volumes
        container = start_or_remove(self._client, self._docker, image, options)
        self._owned = container.id
        logger.info("started pid-namespace holder %s in %.2f s", self.name,
                    time.monotonic() - started)
        return container.id

    def lost_reason(self, ident: Optional[str]) -> Optional[str]:
        """Why a job that joined holder ``ident`` was killed, if that holder is gone."""
        if ident is None or self._running(ident):
            return None
        return (f"killed with the run's PID namespace: its holder container {self.name} "
                f"ended (docker_pid_namespace='run' puts every job of the run in it)")

    def remove(self) -> None:
        """Remove the holder if this process started it (its jobs die with it)."""
        with self._lock:
            ident = self._take_owned()
        self._remove(ident)

    def _take_owned(self) -> Optional[str]:
        """The holder this process started, forgotten (under the lock)."""
        ident, self._owned = self._owned, None
        if ident is not None and self._id == ident:
            self._id = None
        return ident

    def _remove(self, ident: Optional[str]) -> None:
        if ident is None:
            return
        try:
            self._client.containers.get(ident).remove(force=True)
            logger.debug("removed pid-namespace holder %s", self.name)
        except self._docker.errors.NotFound:
            pass
        except self._docker.errors.APIError as exc:  # e.g. its auto-removal under way
            logger.debug("removing pid-namespace holder %s: %s", self.name, exc)
