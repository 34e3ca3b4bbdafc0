"""Backend registry: built-in backends plus the ``fiberrl.backends`` entry-point group.

The backend in use is chosen by ``fiberrl.init(backend=...)``, ``FIBERRL_BACKEND``,
the config file, or detection (inside a Kubernetes pod, inside a Slurm job), in that
order; ``local`` is the default.
"""
from __future__ import annotations

import importlib
import logging
import os
import sys
import threading
from typing import Callable, Dict, Optional

from ..config import backend_name, get_config, on_change
from ..errors import ConfigError
from .base import Backend, Job, JobSpec, JobState, JobStatus

__all__ = ["Backend", "Job", "JobSpec", "JobState", "JobStatus", "get_backend",
           "default_backend", "register_backend", "available_backends"]

logger = logging.getLogger(__name__)

# name -> "module:Class" for built-ins (imported lazily: their clients are extras)
_BUILTIN = {
    "local": "fiberrl.backends.local:LocalBackend",
    "slurm": "fiberrl.backends.slurm:SlurmBackend",
    "docker": "fiberrl.backends.docker:DockerBackend",
    "kubernetes": "fiberrl.backends.kubernetes:KubernetesBackend",
}
# name -> "module:function" checking the backend's ``extra`` settings when they are set
# (the module must not import the backend's client)
_SETTINGS_CHECKS = {
    "docker": "fiberrl.backends.docker_pid:check_mode",
    "kubernetes": "fiberrl.backends.kubernetes.pods:check_settings",
}
_registered: Dict[str, Callable[..., Backend]] = {}
_lock = threading.Lock()
_default: Optional[Backend] = None
_default_pid: Optional[int] = None


def register_backend(name: str, factory: Callable[..., Backend]) -> None:
    """Make ``factory(listen_host=...)`` available as ``fiberrl.init(backend=name)``."""
    _registered[name] = factory


def _entry_points() -> Dict[str, object]:
    if sys.version_info >= (3, 10):
        from importlib.metadata import entry_points
        return {ep.name: ep for ep in entry_points(group="fiberrl.backends")}
    from importlib.metadata import entry_points  # pragma: no cover
    return {ep.name: ep for ep in entry_points().get("fiberrl.backends", [])}


def available_backends() -> list:
    """Names of every backend fiberrl can load here."""
    return sorted(set(_BUILTIN) | set(_registered) | set(_entry_points()))


def get_backend(name: str, **kwargs) -> Backend:
    """Instantiate the backend called ``name``."""
    if name in _registered:
        return _registered[name](**kwargs)
    if name in _BUILTIN:
        module, cls = _BUILTIN[name].split(":")
        return getattr(importlib.import_module(module), cls)(**kwargs)
    eps = _entry_points()
    if name in eps:
        return eps[name].load()(**kwargs)
    raise ConfigError(f"unknown fiberrl backend {name!r}; available: {', '.join(available_backends())}")


def default_backend() -> Backend:
    """The backend of this process's configuration (created once per process)."""
    global _default, _default_pid
    with _lock:
        if _default is None or _default_pid != os.getpid():
            cfg = get_config()
            _default = get_backend(backend_name(), listen_host=cfg.listen_host)
            _default_pid = os.getpid()
        return _default


def reset_default_backend() -> None:
    """Forget the cached backend (after ``fiberrl.init`` changed the configuration)
    and let it free what only its new jobs would have used."""
    global _default
    with _lock:
        old, _default = (_default if _default_pid == os.getpid() else None), None
    if old is not None:
        try:
            old.retire()
        except Exception:
            logger.warning("retiring the %s backend failed", old.name, exc_info=True)


def _check_new_config(config) -> None:
    """Refuse an unknown backend when it is configured (not when it is first used)."""
    name = config.backend
    if name not in _BUILTIN and name not in _registered and name not in _entry_points():
        raise ConfigError(f"unknown fiberrl backend {name!r}; available: "
                          f"{', '.join(available_backends())}")
    check_settings = _SETTINGS_CHECKS.get(name)
    if check_settings is not None:
        module, func = check_settings.split(":")
        getattr(importlib.import_module(module), func)(config.extra)
    reset_default_backend()


on_change(_check_new_config)
