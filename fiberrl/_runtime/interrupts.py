"""Ctrl-C while a job starts: held until the job can take it quietly.

A terminal's Ctrl-C sends SIGINT to its whole foreground process group: the master
and every local job it started (as with the stdlib, whose children share the group).
An interpreter that gets SIGINT while it is still starting (``site``, ``runpy``
importing the fiberrl package, unpickling the process) prints a ``KeyboardInterrupt``
traceback from wherever it was, one per job.

So a local job starts with SIGINT *blocked*: the signal mask survives ``fork`` and
``exec``, so the launcher blocks it in its own thread around the launch
(:func:`held`), and the fork server keeps it blocked for the jobs it forks. A Ctrl-C
during start-up stays pending. ``fiberrl.spawn`` calls :func:`release` just before the
process's target runs: if a Ctrl-C came meanwhile the job exits quietly with
:data:`INTERRUPTED_EXIT` (the master got the same Ctrl-C and ends the run); if not,
SIGINT is unblocked and the target sees ``KeyboardInterrupt`` as a stdlib child does.
Once the target has returned, :func:`hold` blocks it again for the job's own exit.

Rejected alternatives: jobs in their own process group (the terminal's Ctrl-C, and
Ctrl-Z, would no longer reach a user's ``Process``, which the stdlib's children do
get); a handler installed by the entry module (the interpreter's own start-up runs
before any of our code: measured, tracebacks came from ``site``); ``SIG_IGN`` in a
``preexec_fn`` (unsafe with threads, and it turns off ``vfork``).

Threads inherit the mask of the thread that starts them, so a job's runtime threads
keep SIGINT blocked and the main thread alone takes it, where Python handles it.

A program that ignores SIGINT (started in the background by a non-interactive shell,
by ``nohup``, or after ``signal.signal(SIGINT, SIG_IGN)``) has jobs that ignore it
too, as the stdlib's children do: an exec'd job inherits the disposition (and Python
then installs no ``KeyboardInterrupt`` handler), and a job forked by the fork server
is told it (:func:`ignored` in the parent, :func:`take_as` in the job).
"""
from __future__ import annotations

import contextlib
import signal
from typing import Iterator

#: exit status of a job interrupted by Ctrl-C (128 + SIGINT, as a shell reports it)
INTERRUPTED_EXIT = 130

_MASKS = hasattr(signal, "pthread_sigmask")
_SIGINT = {signal.SIGINT}


@contextlib.contextmanager
def held() -> Iterator[None]:
    """Block SIGINT in this thread for the block: a process launched inside it starts
    with SIGINT blocked. The previous mask is restored after (a Ctrl-C that came
    meanwhile is then delivered to this process as usual)."""
    if not _MASKS:
        yield
        return
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, _SIGINT)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def ignored() -> bool:
    """Whether this process ignores SIGINT (a job it starts then ignores it too)."""
    return signal.getsignal(signal.SIGINT) is signal.SIG_IGN


def take_as(parent_ignored: bool) -> None:
    """In a job forked by the fork server or given to a spare: the SIGINT disposition an exec'd job of the
    same parent would start with, ignored if the parent ignored it, else Python's
    ``KeyboardInterrupt`` handler. (Main thread only, as ``signal.signal`` is.)"""
    signal.signal(signal.SIGINT, signal.SIG_IGN if parent_ignored else signal.default_int_handler)


def hold() -> None:
    """Block SIGINT in this thread until :func:`release`."""
    if _MASKS:
        signal.pthread_sigmask(signal.SIG_BLOCK, _SIGINT)


def release() -> bool:
    """Unblock SIGINT in this thread. Returns False, leaving SIGINT blocked, when a
    Ctrl-C came while it was held and this process would act on it: the caller should
    then end quietly. (A process that ignores SIGINT, as one started in the
    background by a shell does, goes on.)"""
    if not _MASKS:
        return True
    if not ignored() and signal.SIGINT in signal.sigpending():
        return False
    try:
        # pending signals' handlers run inside this call: a Ctrl-C that came after
        # the check above surfaces here
        signal.pthread_sigmask(signal.SIG_UNBLOCK, _SIGINT)
    except KeyboardInterrupt:
        hold()
        return False
    return True
