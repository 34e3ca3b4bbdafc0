"""Resource hints: ``@fiberrl.meta(cpu=2, mem="4G", gpu=1)`` on a process or pool target.

Hints travel with the target into the :class:`~fiberrl.backends.base.JobSpec`; each
backend maps them onto its own requests (Slurm ``--cpus-per-task/--mem/--gres``,
container limits, pod resources). Explicit ``Process``/``Pool`` arguments win over
hints on the function, which win over the config defaults.
"""
from __future__ import annotations

import re
from typing import Any, Callable, Dict, Optional, TypeVar, Union

F = TypeVar("F", bound=Callable[..., Any])
_ATTR = "__fiberrl_meta__"
_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def parse_mem(value: Union[None, int, float, str]) -> Optional[int]:
    """``"512M"`` / ``"2G"`` / ``"2Gi"`` / ``"2GiB"`` / ``2048`` (bytes) -> bytes (units are
    powers of 1,024 however spelt); ``None`` stays ``None``."""
    if value is None:
        return None
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if value <= 0:
            raise ValueError(f"mem must be positive, got {value!r}")
        return int(value)
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*(?:([KMGT])i?)?B?\s*", str(value), re.IGNORECASE)
    if not match:
        raise ValueError(f"cannot read memory size {value!r}; use bytes or e.g. '512M', '2G'")
    return int(float(match.group(1)) * _UNITS[(match.group(2) or "").upper()])


#: hints beyond cpu/mem/gpu that some backend understands (see each backend's docs);
#: ``workers_per_job``: Slurm forks that many workers from one job (see
#: :mod:`fiberrl.backends.slurm.warm`), other backends ignore it
BACKEND_HINTS = ("time_limit", "partition", "account", "qos", "sbatch_options",
                 "workers_per_job")


def validate(cpu: Optional[float] = None, mem: Any = None, gpu: Optional[int] = None,
             **extra: Any) -> Dict[str, Any]:
    """Check hint values and normalize them (mem to bytes); unknown names are a TypeError."""
    unknown = sorted(set(extra) - set(BACKEND_HINTS))
    if unknown:
        raise TypeError(f"unknown resource hint(s) {unknown}; valid: cpu, mem, gpu, "
                        f"{', '.join(BACKEND_HINTS)}")
    if cpu is not None and (not isinstance(cpu, (int, float)) or cpu <= 0):
        raise ValueError(f"cpu must be a positive number, got {cpu!r}")
    if gpu is not None and (not isinstance(gpu, int) or gpu < 0):
        raise ValueError(f"gpu must be a non-negative integer, got {gpu!r}")
    per_job = extra.get("workers_per_job")
    if per_job is not None and (isinstance(per_job, bool) or not isinstance(per_job, int)):
        raise TypeError(f"workers_per_job must be a positive int, got {per_job!r}")
    if per_job is not None and per_job < 1:
        raise ValueError(f"workers_per_job must be at least 1, got {per_job!r}")
    hints = {"cpu": cpu, "mem": parse_mem(mem), "gpu": gpu, **extra}
    return {k: v for k, v in hints.items() if v is not None}


def meta(cpu: Optional[float] = None, mem: Any = None, gpu: Optional[int] = None, *,
         memory: Optional[float] = None, **extra: Any) -> Callable[[F], F]:
    """Decorator attaching resource hints to a function used as a process target.

    ``memory`` is Uber Fiber's name for the memory hint, in megabytes
    (``@meta(memory=1000)`` is ``@meta(mem="1000M")``); give ``mem`` or ``memory``."""
    if memory is not None:
        if mem is not None:
            raise TypeError("give mem or memory (Uber Fiber's name, in megabytes), not both")
        if isinstance(memory, bool) or not isinstance(memory, (int, float)) or memory <= 0:
            raise ValueError(f"memory (megabytes) must be a positive number, got {memory!r}")
        mem = int(memory * _UNITS["M"])
    hints = validate(cpu, mem, gpu, **extra)

    def decorate(fn: F) -> F:
        setattr(fn, _ATTR, {**getattr(fn, _ATTR, {}), **hints})
        return fn

    return decorate


def hints_of(fn: Any) -> Dict[str, Any]:
    """The hints attached to ``fn`` by :func:`meta` (empty if none)."""
    return dict(getattr(fn, _ATTR, {}) or {})
