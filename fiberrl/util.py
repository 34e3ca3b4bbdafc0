"""``fiberrl.util``: the stdlib's ``multiprocessing.util``, logging to fiberrl's logger.

Process-local helpers keep the stdlib's meaning in a job (a job is a process):
``Finalize``, ``register_after_fork``, ``is_exiting``, ``get_temp_dir``,
``ForkAwareThreadLock``/``ForkAwareLocal``, ``close_all_fds_except``... are the
stdlib's own. The logging helpers use the ``fiberrl`` logger, the one
``fiberrl.get_logger()`` returns and that a job's lines are tagged with.
Private names (``_exit_function``...) are the stdlib's, looked up on use.
"""
from __future__ import annotations

import logging
from multiprocessing import util as _mp_util
from multiprocessing.util import (DEBUG, DEFAULT_LOGGING_FORMAT, INFO, MAXFD, NOTSET, SUBDEBUG,
                                  SUBWARNING, Finalize, ForkAwareLocal, ForkAwareThreadLock,
                                  abstract_sockets_supported, close_all_fds_except, close_fds,
                                  get_temp_dir, is_abstract_socket_namespace, is_exiting,
                                  register_after_fork, spawnv_passfds)
from typing import Any

from .log import get_logger, log_to_stderr

LOGGER_NAME = "fiberrl"

__all__ = ["sub_debug", "debug", "info", "sub_warning", "get_logger", "log_to_stderr",
           "get_temp_dir", "register_after_fork", "is_exiting", "Finalize",
           "ForkAwareThreadLock", "ForkAwareLocal", "close_all_fds_except", "SUBDEBUG",
           "SUBWARNING"]
_reexported = (DEBUG, DEFAULT_LOGGING_FORMAT, INFO, MAXFD, NOTSET, abstract_sockets_supported,
               close_fds, is_abstract_socket_namespace, spawnv_passfds)


def _log(level: int, msg: str, *args: Any) -> None:
    logging.getLogger(LOGGER_NAME).log(level, msg, *args, stacklevel=3)


def sub_debug(msg: str, *args: Any) -> None:
    """Log at the stdlib's SUBDEBUG level (5) to the fiberrl logger."""
    _log(SUBDEBUG, msg, *args)


def debug(msg: str, *args: Any) -> None:
    """Log at DEBUG to the fiberrl logger."""
    _log(DEBUG, msg, *args)


def info(msg: str, *args: Any) -> None:
    """Log at INFO to the fiberrl logger."""
    _log(INFO, msg, *args)


def sub_warning(msg: str, *args: Any) -> None:
    """Log at the stdlib's SUBWARNING level (25) to the fiberrl logger."""
    _log(SUBWARNING, msg, *args)


def __getattr__(name: str) -> Any:
    if name.startswith("_"):
        return getattr(_mp_util, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
