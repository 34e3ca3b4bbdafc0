"""The error contract every ``fiberrl`` command keeps.

- Bad input (a wrong argument, an unknown algorithm, env or backend, a missing
  extra, an output directory that would be clobbered) is reported *before any work
  starts* as one line ``<prog>: error: <message>`` on stderr, exit status 2.
- Ctrl-C ends the command with one line ``<prog>: interrupted``, exit status 130.
- Any other failure is one line ``<prog>: error: <Type>: <message>``, exit status 1.
- ``--debug`` (or ``FIBERRL_LOG_LEVEL=DEBUG``, or ``--log-level DEBUG``) adds the
  traceback.

Commands raise :class:`UsageError` for bad input; :class:`ArgumentParser` turns
argparse's own complaints into the same one line (no usage block), and
:func:`run_command` applies the contract around a command function.
"""
from __future__ import annotations

import argparse
import errno
import importlib.util
import logging
import os
import sys
import traceback
from typing import Any, Callable, NoReturn, Optional, Sequence

logger = logging.getLogger(__name__)

#: Exit status for bad input (argparse's own) and for Ctrl-C (128 + SIGINT).
USAGE_STATUS, INTERRUPTED_STATUS = 2, 130


class UsageError(Exception):
    """Bad input to a command: reported as one ``error:`` line, exit status 2."""


class ArgumentParser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose errors are one line naming the command (sub-parsers
    made from it inherit that)."""

    def error(self, message: str) -> NoReturn:
        """Print ``<prog>: error: <message>`` and a hint, then exit with status 2."""
        self.exit(USAGE_STATUS, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def debug_wanted(args: Optional[argparse.Namespace] = None) -> bool:
    """Whether tracebacks should be shown: ``--debug``, ``--log-level DEBUG`` or
    ``FIBERRL_LOG_LEVEL=DEBUG``."""
    if args is not None and (getattr(args, "debug", False)
                             or str(getattr(args, "log_level", "")).upper() == "DEBUG"):
        return True
    return os.environ.get("FIBERRL_LOG_LEVEL", "").upper() == "DEBUG"


def add_debug_argument(parser: argparse.ArgumentParser, top_level: bool = False) -> None:
    """Add ``--debug`` to ``parser``. On sub-parsers it has no default, so that
    ``fiberrl --debug train ...`` is not overwritten by the sub-parser's default."""
    parser.add_argument("--debug", action="store_true",
                        default=False if top_level else argparse.SUPPRESS,
                        help="show tracebacks of errors")


def add_debug_everywhere(subparsers: Any) -> None:
    """Add ``--debug`` to every parser under ``subparsers`` (recursively)."""
    for parser in subparsers.choices.values():
        if not any("--debug" in action.option_strings for action in parser._actions):
            add_debug_argument(parser)
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                add_debug_everywhere(action)


def command_prog(args: argparse.Namespace, default: str) -> str:
    """The name errors should carry, e.g. ``fiberrl train`` (set by :func:`set_prog`)."""
    return getattr(args, "_prog", None) or default


def set_prog(subparsers: Any) -> None:
    """Record each leaf parser's ``prog`` in its namespace defaults (recursively)."""
    for parser in subparsers.choices.values():
        parser.set_defaults(_prog=parser.prog)
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                set_prog(action)


def run_command(func: Callable[[argparse.Namespace], Any], args: argparse.Namespace,
                prog: str) -> int:
    """Run ``func(args)`` under the error contract of this module; its exit status."""
    debug = debug_wanted(args)
    try:
        return int(func(args) or 0)
    except UsageError as error:
        _report(prog, f"error: {error}", debug)
        return USAGE_STATUS
    except KeyboardInterrupt:
        _report(prog, "interrupted", debug)
        return INTERRUPTED_STATUS
    except BrokenPipeError as error:
        if error.errno != errno.EPIPE:   # fiberrl's own (a pipe's peer, a manager gone)
            return _failed(prog, error, debug)
        # the reader of our output left (``fiberrl ps | head``): stop quietly, as Unix
        # tools do, and keep Python's exit flush from failing on the same pipe
        _quiet_stdout()
        return BROKEN_PIPE_STATUS
    except Exception as error:  # noqa: BLE001 - the contract: one line, the traceback on demand
        return _failed(prog, error, debug)


def _failed(prog: str, error: BaseException, debug: bool) -> int:
    """Report ``error`` as the command's failure; its exit status."""
    hint = "" if debug else " (run with --debug for the traceback)"
    _report(prog, f"error: {type(error).__name__}: {error}{hint}", debug)
    return 1


#: the status of a command whose output pipe closed (128 + SIGPIPE, as a shell reports it)
BROKEN_PIPE_STATUS = 141


def _quiet_stdout() -> None:
    """Point stdout at /dev/null so that nothing more is written to a closed pipe."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):
        pass


def _report(prog: str, message: str, debug: bool) -> None:
    if debug:
        traceback.print_exc()
    first = str(message).strip().splitlines() or [""]
    sys.stderr.write(f"{prog}: {first[0]}\n")
    sys.stderr.flush()


def require_modules(modules: Sequence[str], extra: str, what: str) -> None:
    """Raise :class:`UsageError` naming ``pip install 'fiberrl[extra]'`` when one of
    ``modules`` cannot be imported here (checked without importing them)."""
    missing = [name for name in modules if importlib.util.find_spec(name) is None]
    if missing:
        raise UsageError(f"{what} needs {', '.join(missing)}, which is not installed: "
                         f"pip install 'fiberrl[{extra}]' (or bash scripts/install.sh {extra})")


def fail(message: str) -> NoReturn:
    """Raise :class:`UsageError` (a shorthand for command code)."""
    raise UsageError(message)
