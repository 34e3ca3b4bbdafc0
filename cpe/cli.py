"""Command line: ``python -m cpe evaluate FILE`` (and ``fiberrl cpe evaluate FILE``).

:func:`add_arguments` fills an ``evaluate`` parser, :func:`main` runs it on parsed
arguments, and :func:`register` attaches ``cpe evaluate`` to another program's
sub-parsers (the ``fiberrl.commands`` entry point).
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import sys
from typing import Any, Sequence

from cpe.evaluate import DEFAULT_N_BOOTSTRAP, evaluate
from cpe.io import FORMATS, load

logger = logging.getLogger(__name__)

_DESCRIPTION = (
    "Estimate the value of a target policy from a logged file (JSON lines, CSV or Parquet) "
    "with every applicable estimator and its bootstrap interval."
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the ``evaluate`` arguments to ``parser``."""
    parser.add_argument("file", metavar="FILE", help="logged data: .jsonl/.json, .csv or .parquet")
    parser.add_argument("--format", choices=FORMATS, default=None,
                        help="file format (default: from the file suffix)")
    parser.add_argument("--gamma", type=float, default=None,
                        help="discount factor for trajectories (default 1.0)")
    parser.add_argument("--estimators", default=None,
                        help="comma-separated estimators to run (default: all applicable)")
    parser.add_argument("--n-bootstrap", type=int, default=DEFAULT_N_BOOTSTRAP,
                        help=f"bootstrap replicates (default {DEFAULT_N_BOOTSTRAP}; 0 disables)")
    parser.add_argument("--seed", type=int, default=None, help="bootstrap seed")
    parser.add_argument("--confidence", type=float, default=0.95,
                        help="interval level (default 0.95)")
    parser.add_argument("--workers", type=int, default=1,
                        help="processes for the bootstrap (default 1: no pool)")
    parser.add_argument("--json", action="store_true", help="print machine-readable JSON")


def _clean(value: Any) -> Any:
    """Replace non-finite floats with ``None`` so the output is strict JSON."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    return value


def main(args: argparse.Namespace) -> int:
    """Run ``evaluate`` for parsed ``args``; returns the process exit status."""
    estimators = None
    if args.estimators:
        estimators = [name.strip() for name in args.estimators.split(",") if name.strip()]
    try:
        data = load(args.file, format=args.format, gamma=args.gamma)
        options = dict(estimators=estimators, n_bootstrap=args.n_bootstrap, seed=args.seed,
                       confidence=args.confidence)
        if args.workers > 1 and args.n_bootstrap > 0:
            import multiprocessing

            pool = multiprocessing.get_context("spawn").Pool(args.workers)
            try:
                report = evaluate(data, pool=pool, **options)
            finally:
                pool.close()
                pool.join()
        else:
            report = evaluate(data, **options)
    except (ValueError, FileNotFoundError) as exc:
        sys.stderr.write(f"error: {exc}\n")
        return 2
    if args.json:
        sys.stdout.write(json.dumps(_clean(report.to_dict()), indent=2) + "\n")
    else:
        sys.stdout.write(report.table() + "\n")
    return 0


def _add_evaluate(subparsers: Any) -> argparse.ArgumentParser:
    """Add the ``evaluate`` sub-command to ``subparsers``."""
    parser = subparsers.add_parser("evaluate", help="evaluate a policy from a logged file",
                                   description=_DESCRIPTION)
    add_arguments(parser)
    parser.set_defaults(func=main)
    return parser


def register(subparsers: Any) -> argparse.ArgumentParser:
    """Add a ``cpe`` command with an ``evaluate`` sub-command to ``subparsers``.

    The ``evaluate`` parser sets ``func=main`` as its default, so a host program can
    dispatch with ``args.func(args)``.
    """
    parser = subparsers.add_parser("cpe", help="counterfactual policy evaluation",
                                   description="Counterfactual policy evaluation.")
    commands = parser.add_subparsers(dest="cpe_command", metavar="COMMAND")
    commands.required = True
    _add_evaluate(commands)
    return parser


def build_parser() -> argparse.ArgumentParser:
    """Stand-alone parser for ``python -m cpe``."""
    parser = argparse.ArgumentParser(prog="python -m cpe",
                                     description="Counterfactual policy evaluation.")
    commands = parser.add_subparsers(dest="cpe_command", metavar="COMMAND")
    commands.required = True
    _add_evaluate(commands)
    return parser


def run(argv: Sequence[str] | None = None) -> int:
    """Parse ``argv`` (default: ``sys.argv[1:]``) and run the chosen command."""
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s: %(message)s")
    args = build_parser().parse_args(argv)
    return int(args.func(args))
