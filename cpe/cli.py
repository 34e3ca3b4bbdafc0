"""Command line: ``python -m cpe evaluate FILE`` (and ``fiberrl cpe evaluate FILE``).

:func:`add_arguments` fills an ``evaluate`` parser, :func:`main` runs it on parsed
arguments, and :func:`register` attaches ``cpe evaluate`` to another program's
sub-parsers (the ``fiberrl.commands`` entry point).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import math
import sys
from pathlib import Path
from typing import Any, Sequence

from cpe.bandit import BANDIT_ESTIMATORS
from cpe.evaluate import DEFAULT_N_BOOTSTRAP, evaluate
from cpe.io import FORMATS
from cpe.loading import load
from cpe.sequential import SEQUENTIAL_ESTIMATORS

logger = logging.getLogger(__name__)

#: rows x bootstrap replicates from which ``--workers`` pays: the smallest size measured
#: where the command with 2 or 4 workers beat one (50,000 rows x 200 replicates, JSON
#: lines, 16 idle cores; docs/rl.md has the table). The workers start while the data
#: loads, which hides their start; below this the bootstrap runs in this process.
POOL_MIN_WORK = 10_000_000

_DESCRIPTION = (
    "Estimate the value of a target policy from logged data (JSON lines, CSV, Parquet, or "
    "the directory fiberrl workflow timeline writes) with every applicable estimator and "
    "its bootstrap interval."
)

_EPILOG = f"""fields (one record per decision; the data pipeline's names):
  required     action (index or name), reward, action_probability (the logging
               policy's probability of the action; logged_propensity is accepted too)
  target       target_probs (list of K probabilities), or --target-policy with
               state_features (map) and optional possible_actions (list)
  optional     reward_estimates (list of K; bandit dm, dr)
  trajectories mdp_id, sequence_number, optional q_estimates (list of K; dm, dr, wdr, magic)

estimators:
  bandit logs  {", ".join(BANDIT_ESTIMATORS)}
  trajectories {", ".join(SEQUENTIAL_ESTIMATORS)}

example:
  fiberrl workflow timeline --input logs.jsonl --out data/t --gamma 0.9
  fiberrl cpe evaluate data/t --target-policy runs/x/policy.pt --temperature 0.1
"""

def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {text}")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the ``evaluate`` arguments to ``parser``."""
    parser.add_argument("file", metavar="PATH",
                        help="logged data: .jsonl/.json, .csv, .parquet, or a Timeline directory")
    parser.add_argument("--format", choices=FORMATS, default=None,
                        help="input format (default: from the suffix; a directory is a Timeline)")
    parser.add_argument("--target-policy", default=None, metavar="POLICY",
                        help="the policy to evaluate, instead of the data's target_probs: "
                             "'uniform' (over the possible actions) or an exported policy.pt / "
                             "policy.onnx (its softmax propensities)")
    parser.add_argument("--temperature", type=float, default=1.0,
                        help="softmax temperature of an exported --target-policy (default 1.0)")
    parser.add_argument("--gamma", type=float, default=None,
                        help="discount factor for trajectories (default: a Timeline's gamma, "
                             "else 1.0)")
    parser.add_argument("--estimators", default=None,
                        help="comma-separated estimators to run (default: all applicable; "
                             "see below)")
    parser.add_argument("--n-bootstrap", type=int, default=DEFAULT_N_BOOTSTRAP,
                        help=f"bootstrap replicates (default {DEFAULT_N_BOOTSTRAP}; 0 disables)")
    parser.add_argument("--seed", type=int, default=None, help="bootstrap seed")
    parser.add_argument("--confidence", type=float, default=0.95,
                        help="interval level (default 0.95)")
    parser.add_argument("--workers", type=_positive_int, default=1,
                        help="fiberrl pool workers for the bootstrap (default 1: in this "
                             "process). They start while the data loads and pay only with "
                             "free cores and enough work: from rows x replicates >= "
                             f"{POOL_MIN_WORK:,} (50,000 rows at the default "
                             f"{DEFAULT_N_BOOTSTRAP} replicates); below that the bootstrap "
                             "runs in this process, with a note on stderr")
    parser.add_argument("--backend", default=None, help="fiberrl backend of the workers")
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
    """Run ``evaluate`` for parsed ``args``; returns the process exit status. Bad input
    raises :class:`fiberrl.cli.support.UsageError` (one line, exit status 2)."""
    from fiberrl.cli.support import UsageError
    estimators = None
    if args.estimators:
        estimators = [name.strip() for name in args.estimators.split(",") if name.strip()]
    if args.target_policy not in (None, "uniform") and not Path(args.target_policy).is_file():
        raise UsageError(f"--target-policy {args.target_policy}: no such file (give 'uniform' "
                         "or an exported policy.pt/policy.onnx)")
    if args.n_bootstrap < 0 or args.n_bootstrap == 1:
        raise UsageError(f"--n-bootstrap must be 0 (no intervals) or at least 2, got {args.n_bootstrap}")
    if not 0.0 < args.confidence < 1.0:
        raise UsageError(f"--confidence must lie in (0, 1), got {args.confidence}")
    if not args.temperature > 0:
        raise UsageError(f"--temperature must be positive, got {args.temperature}")
    if args.gamma is not None and not 0.0 <= args.gamma <= 1.0:
        raise UsageError(f"--gamma must lie in [0, 1], got {args.gamma}")
    if getattr(args, "backend", None):
        from fiberrl.cli.jobs import check_backend
        check_backend(args.backend)
    if not Path(args.file).exists():  # before any worker starts
        raise UsageError(f"{args.file}: no such file or directory")
    wants_pool = args.workers > 1 and args.n_bootstrap > 0
    try:
        # the workers start (and import numpy and cpe) while the data loads
        with (_start_pool(args.workers, getattr(args, "backend", None)) if wants_pool
              else contextlib.nullcontext(None)) as pool:
            data = load(args.file, format=args.format, gamma=args.gamma,
                        target_policy=args.target_policy, temperature=args.temperature)
            options = dict(estimators=estimators, n_bootstrap=args.n_bootstrap, seed=args.seed,
                           confidence=args.confidence)
            evaluate(data, **{**options, "n_bootstrap": 0})  # settings checked first
            if pool is not None and not workers_pay(data.n, args.n_bootstrap, args.workers):
                sys.stderr.write(f"{getattr(args, '_prog', None) or 'cpe evaluate'}: note: "
                                 f"{data.n:,} rows x {args.n_bootstrap} replicates is too "
                                 f"little work for {args.workers} workers to pay off (from "
                                 f"{POOL_MIN_WORK:,}); running the bootstrap in this "
                                 "process\n")
                pool.terminate()
                pool = None
            if pool is not None:
                from fiberrl.backends import default_backend
                report = evaluate(data, pool=pool, same_host=default_backend().shares_host,
                                  **options)
            else:
                report = evaluate(data, **options)
    except (ValueError, FileNotFoundError) as exc:
        raise UsageError(str(exc)) from exc
    if args.json:
        sys.stdout.write(json.dumps(_clean(report.to_dict()), indent=2) + "\n")
    else:
        sys.stdout.write(report.table() + "\n")
    return 0


def workers_pay(rows: int, n_bootstrap: int, workers: int) -> bool:
    """Whether a bootstrap of ``rows`` x ``n_bootstrap`` is large enough for a pool of
    ``workers`` to beat this process alone (see :data:`POOL_MIN_WORK`)."""
    return workers > 1 and rows * n_bootstrap >= POOL_MIN_WORK


def _start_pool(workers: int, backend: str | None) -> Any:
    """A ``fiberrl.Pool`` of ``workers`` whose workers import the bootstrap's modules
    as they start (it returns at once; they start in the background)."""
    import fiberrl
    if backend:
        fiberrl.init(backend=backend)
    return fiberrl.Pool(workers, initializer=_warm_up)


def evaluate_on_pool(data: Any, options: dict, workers: int, backend: str | None,
                     same_host: bool | None = None) -> Any:
    """:func:`cpe.evaluate` with its bootstrap on a ``fiberrl.Pool`` of ``workers``,
    started here (the bench's view; the command starts it before loading the data).

    ``same_host`` (default: whether the backend's jobs share this host) sends the
    features through one shared file instead of a copy per worker."""
    from fiberrl.backends import default_backend
    with _start_pool(workers, backend) as pool:
        if same_host is None:
            same_host = default_backend().shares_host
        return evaluate(data, pool=pool, same_host=same_host, **options)


def _warm_up() -> None:
    """Pool initializer: import what a bootstrap chunk needs (numpy, cpe) at start."""
    import cpe.bootstrap  # noqa: F401


def _add_evaluate(subparsers: Any) -> argparse.ArgumentParser:
    """Add the ``evaluate`` sub-command to ``subparsers``."""
    parser = subparsers.add_parser("evaluate", help="evaluate a policy from logged data",
                                   description=_DESCRIPTION, epilog=_EPILOG,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
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
    from fiberrl.cli.support import ArgumentParser
    parser = ArgumentParser(prog="python -m cpe", description="Counterfactual policy evaluation.")
    commands = parser.add_subparsers(dest="cpe_command", metavar="COMMAND")
    commands.required = True
    _add_evaluate(commands)
    return parser


def run(argv: Sequence[str] | None = None) -> int:
    """Parse ``argv`` (default: ``sys.argv[1:]``) and run the chosen command."""
    from fiberrl.cli.support import run_command
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s: %(message)s")
    args = build_parser().parse_args(argv)
    return run_command(args.func, args, "python -m cpe evaluate")
