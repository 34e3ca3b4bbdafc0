"""The ``fiberrl`` command line.

Subcommands come from the ``fiberrl.commands`` entry-point group: each entry point
names a ``register(subparsers)`` function that adds its own subcommand and sets
``func`` on its parser (``cpe`` registers ``fiberrl cpe evaluate FILE`` this way).
"""
from __future__ import annotations

import argparse
import logging
import os
import sys
from typing import List, Optional

logger = logging.getLogger(__name__)


def _command_entry_points() -> list:
    from importlib.metadata import entry_points
    if sys.version_info >= (3, 10):
        return list(entry_points(group="fiberrl.commands"))
    return list(entry_points().get("fiberrl.commands", []))  # pragma: no cover


def _backends(args: argparse.Namespace) -> int:
    """``fiberrl backends``: each backend, ``*`` on the configured one, and what a
    backend that cannot run here is missing."""
    from ..backends import available_backends
    from ..backends.requirements import missing_requirement
    from ..config import get_config
    current = get_config().backend
    for name in available_backends():
        problem = missing_requirement(name)
        line = f"{'*' if name == current else ' '} {name}"
        print(f"{line:<14}  unavailable: {problem}" if problem else line)
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The parser with every registered subcommand."""
    from .. import __version__
    from .support import ArgumentParser, add_debug_argument
    parser = ArgumentParser(prog="fiberrl", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"fiberrl {__version__}")
    parser.add_argument("--log-level", default=None,
                        help="logging level (default WARNING, or FIBERRL_LOG_LEVEL)")
    add_debug_argument(parser, top_level=True)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    backends = sub.add_parser("backends", help="list the backends available here")
    backends.set_defaults(func=_backends)
    from . import jobs as cli_jobs
    cli_jobs.register(sub)
    for entry in _command_entry_points():
        try:
            entry.load()(sub)
        except Exception:  # a broken plugin must not break the whole command
            logger.exception("could not load fiberrl command %r", entry.name)
    from .support import add_debug_everywhere, set_prog
    add_debug_everywhere(sub)
    set_prog(sub)
    return parser


def main(argv: Optional[List[str]] = None) -> int:
    """Entry point of the ``fiberrl`` command."""
    from ..log import level_name
    from .support import INTERRUPTED_STATUS, run_command
    try:  # the subcommands' imports (torch, numpy) take a while: Ctrl-C may come here
        parser = build_parser()
    except KeyboardInterrupt:
        sys.stderr.write("fiberrl: interrupted\n")
        return INTERRUPTED_STATUS
    args = parser.parse_args(argv)
    source, level = (("--log-level", args.log_level) if args.log_level else
                     ("FIBERRL_LOG_LEVEL", os.environ.get("FIBERRL_LOG_LEVEL") or "WARNING"))
    try:
        level = level_name(level)
    except ValueError as exc:
        parser.error(f"{source}: {exc}")
    logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s")
    func = getattr(args, "func", None)
    if func is None:
        parser.print_help(sys.stderr)
        return 2
    return run_command(func, args, getattr(args, "_prog", None) or "fiberrl")


if __name__ == "__main__":
    sys.exit(main())
