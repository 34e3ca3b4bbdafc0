"""Logging set-up for jobs: every line a worker logs carries its job's name."""
from __future__ import annotations

import logging
import os
from typing import Any

_FORMAT = "%(asctime)s %(levelname)s [{job} pid %(process)d] %(name)s: %(message)s"
_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


def level_name(level: Any) -> str:
    """The ``logging`` level name of ``level`` (a name in any case, or a standard level's
    number, as an int or digits); ``ValueError`` naming the levels when ``logging`` knows
    no such level."""
    if isinstance(level, str) and level.strip().isdigit():
        level = int(level)
    name = logging.getLevelName(level) if isinstance(level, int) else str(level).strip().upper()
    if not isinstance(logging.getLevelName(name), int):
        raise ValueError(f"unknown log level {level!r}; one of {', '.join(_LEVELS)}")
    return name


def configure_worker(level: str, job_name: str) -> None:
    """Configure the ``fiberrl`` logger of a job process (to stderr, which the backend keeps)."""
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter(_FORMAT.format(job=job_name)))
    root = logging.getLogger("fiberrl")
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    root.propagate = False
    os.environ.setdefault("FIBERRL_JOB_NAME", job_name)


def get_logger() -> logging.Logger:
    """The ``fiberrl`` logger (the counterpart of ``multiprocessing.get_logger``)."""
    return logging.getLogger("fiberrl")


def log_to_stderr(level: int = logging.INFO) -> logging.Logger:
    """Send the ``fiberrl`` logger's records to stderr and return it."""
    logger = get_logger()
    if not any(isinstance(h, logging.StreamHandler) for h in logger.handlers):
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("[%(levelname)s/%(processName)s] %(message)s"))
        logger.addHandler(handler)
    logger.setLevel(level)
    return logger
