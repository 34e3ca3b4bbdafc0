"""Exceptions of fiberrl.

The ``multiprocessing`` exception types are re-exported unchanged so that code
catching ``multiprocessing.TimeoutError`` keeps working; fiberrl adds errors that
carry what the cluster said about a job (exit code, signal, reason, log tail).
"""
from __future__ import annotations

import errno
import pickle
from multiprocessing import (AuthenticationError, BufferTooShort, ProcessError,
                             TimeoutError)
from typing import Optional

__all__ = ["ProcessError", "BufferTooShort", "TimeoutError", "AuthenticationError",
           "ConfigError", "BackendError", "JobFailedError", "TaskRetryError",
           "TaskDeserializationError", "PoolTerminatedError", "ManagerConnectionError",
           "OwnerGoneError", "ForgedMessageError", "SharedMemoryHostError", "NotHereError",
           "ForkServerError", "UnlockedReleaseError", "NotOwnerError",
           "NegativeSemaphoreError", "ClientGone"]


class ConfigError(ValueError):
    """A configuration key or value is invalid; the message lists the valid keys."""


class BackendError(ProcessError):
    """The cluster refused or failed an operation (submit, status, cancel)."""


class JobFailedError(ProcessError):
    """A job-backed process ended without running its target to completion.

    Attributes carry the backend's view: ``job_id``, ``exit_code``, ``reason``
    (e.g. ``"signal 9 (SIGKILL)"``, ``"OOMKilled"``, ``"TIMEOUT"``) and ``log_tail``.
    """

    def __init__(self, message: str, *, job_id: Optional[str] = None,
                 exit_code: Optional[int] = None, reason: Optional[str] = None,
                 log_tail: str = "") -> None:
        detail = message
        if job_id is not None:
            detail += f" [job {job_id}]"
        if reason:
            detail += f": {reason}"
        if log_tail:
            detail += "\n--- last lines of the job's log ---\n" + log_tail.rstrip()
        super().__init__(detail)
        self.job_id = job_id
        self.exit_code = exit_code
        self.reason = reason
        self.log_tail = log_tail


class TaskRetryError(JobFailedError):
    """A pool task whose workers died ``max_task_retries`` times while running it.

    ``task`` names the call and the input indices of its items (``map of f, items
    16-19 of the input``); ``deaths`` says how each of those workers ended.
    """

    def __init__(self, task: str, deaths: "list[str]") -> None:
        how = "; ".join(deaths)
        super().__init__(f"{task}: {len(deaths)} workers died while running it ({how}); "
                         "not retrying it again")
        self.task = task
        self.deaths = list(deaths)

    def __reduce__(self):
        return type(self), (self.task, self.deaths)


class TaskDeserializationError(pickle.UnpicklingError):
    """A pool task's function or arguments could not be unpickled in the worker."""

    def __init__(self, message: str, traceback_text: str = "") -> None:
        super().__init__(message, traceback_text)
        self.message = message
        self.traceback_text = traceback_text

    def __str__(self) -> str:
        if not self.traceback_text:
            return self.message
        return f"{self.message}\n\nWorker traceback:\n{self.traceback_text}"


class PoolTerminatedError(ProcessError):
    """The pool was terminated before this result was ready."""


class ManagerConnectionError(BrokenPipeError, EOFError):
    """The server behind a manager proxy (or a lock, event, value...) is unreachable.

    Raised instead of a bare ``EOFError``/``BrokenPipeError`` when the server's job
    died, shut down or its host was lost; it is both the ``BrokenPipeError`` (a
    ``ConnectionError``) and the ``EOFError`` the stdlib's proxies raise, so existing
    handlers keep working.
    """


class OwnerGoneError(ProcessError, ConnectionError):
    """The process that owns a shared object (a queue, a pipe's rendezvous, a lock's
    server) is gone: it exited, or its host became unreachable. Raised by the calls
    that needed it instead of hanging."""


class ForgedMessageError(ConnectionError, EOFError):
    """A peer on an authenticated stream sent a message that failed its MAC or was
    malformed: the stream is dropped and nothing in it is unpickled."""


class SharedMemoryHostError(ProcessError):
    """A shared-memory object (``Value``/``Array`` on one host, ``SharedMemory``) was
    received on a host other than the one whose memory holds it."""


class NotHereError(ConnectionRefusedError):
    """A listener answered that the service a stream asked for is not there (a pipe end
    that moved on, a pool that closed, a manager that stopped)."""


class ForkServerError(OSError):
    """The fork server could not start a job (the caller may exec it instead)."""


class UnlockedReleaseError(ValueError, RuntimeError):
    """Releasing a lock that is not locked: the ``ValueError`` of ``multiprocessing.Lock``
    and the ``RuntimeError`` of ``threading.Lock`` (and so of manager locks) at once."""


class NotOwnerError(AssertionError, RuntimeError):
    """Releasing a recursive lock, or waiting on or notifying a condition, that the
    caller does not hold: the ``AssertionError`` of ``multiprocessing.RLock`` and
    ``Condition`` and the ``RuntimeError`` of ``threading``'s (and so of a manager's)
    at once."""


class NegativeSemaphoreError(OSError, ValueError):
    """A semaphore made with a negative value: the ``OSError`` (``EINVAL``) of
    ``multiprocessing.Semaphore`` and the ``ValueError`` of ``threading``'s (and so of
    a manager's) at once."""

    @classmethod
    def of(cls, value: object) -> "NegativeSemaphoreError":
        """The error for initial value ``value``."""
        return cls(errno.EINVAL, f"semaphore initial value must be >= 0, got {value!r}")


class ClientGone(ConnectionAbortedError):
    """The client a blocked call was made for disconnected; the call is abandoned."""
