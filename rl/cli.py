"""Command line: ``fiberrl train ALGO ...`` (also ``python -m rl train ...``).

``register`` attaches the commands to the ``fiberrl`` program (the
``fiberrl.commands`` entry point); :func:`run` is ``python -m rl``.
"""
from __future__ import annotations

import argparse
import json
import logging
import sys
from typing import Any, Dict, List, Optional, Sequence

logger = logging.getLogger(__name__)


def _parse_setting(text: str) -> tuple:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"--set takes KEY=VALUE, got {text!r}")
    try:
        return key, json.loads(value)
    except json.JSONDecodeError:
        return key, value


def add_train_arguments(parser: argparse.ArgumentParser) -> None:
    """The arguments of ``train``."""
    parser.add_argument("algo", metavar="ALGO",
                        help="algorithm: es, ppo, dqn, parametric_dqn, ddpg or td3")
    parser.add_argument("--env", help="gymnasium id, e.g. CartPole-v1 (required)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--total-steps", type=int, default=100_000, help="training env steps")
    parser.add_argument("--workers", type=int, default=0,
                        help="ES: pool workers; the others: fiberrl processes stepping the envs "
                             "(0: in this process)")
    parser.add_argument("--num-envs", type=int, default=None,
                        help="envs of step-driven algorithms (PPO: 4, the others: 1)")
    parser.add_argument("--backend", default=None, help="fiberrl backend (default: config)")
    parser.add_argument("--out", default=None,
                        help="output directory (default runs/ALGO-ENV-TIMESTAMP); one that "
                             "already holds a run needs --resume")
    parser.add_argument("--eval-every", type=int, default=None,
                        help="env steps between evaluations (default total/20)")
    parser.add_argument("--eval-episodes", type=int, default=10)
    parser.add_argument("--resume", action="store_true",
                        help="continue the run in --out from its last checkpoint")
    parser.add_argument("--stop-on-solve", action="store_true",
                        help="stop at the first evaluation at or above the env's reward threshold")
    parser.add_argument("--set", dest="settings", action="append", type=_parse_setting, default=[],
                        metavar="KEY=VALUE", help="algorithm setting (JSON value), repeatable")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.add_argument("--ranks", type=int, default=1,
                        help="data-parallel learner ranks, one fiberrl process each (ppo, td3, ddpg)")
    parser.add_argument("--devices", choices=("cpu", "cuda"), default=None,
                        help="cpu (gloo, default) or cuda (one GPU per rank, NCCL)")
    population = parser.add_argument_group(
        "population-based training (step-driven algorithms; each member a fiberrl process)")
    population.add_argument("--population", type=int, default=None, metavar="N",
                            help="train N members at once (PBT; --total-steps counts per member)")
    population.add_argument("--pbt-interval", type=int, default=None, metavar="STEPS",
                            help="env steps between a member's exploit decisions (default "
                                 "total/10); 0: a random search of the same members")
    population.add_argument("--search", action="append", default=[], metavar="KEY=SPEC",
                            help="a hyperparameter's space, repeatable: loguniform:LOW:HIGH, "
                                 "uniform:LOW:HIGH, int:LOW:HIGH or choice:V1,V2,... (default: "
                                 "the algorithm's own space)")
    population.add_argument("--pbt-quantile", type=float, default=0.25, metavar="Q",
                            help="the bottom Q of the members copy the top Q (default 0.25)")
    population.add_argument("--pbt-resample", type=float, default=0.25, metavar="P",
                            help="explore resamples a value with probability P, else perturbs "
                                 "it x0.8/x1.2 (default 0.25)")
    parser.set_defaults(func=train_command)


def _population_checks(args: argparse.Namespace, overrides: Dict[str, Any]) -> Any:
    """The search space of ``--population`` (None without it); every population option
    checked, bad ones as :class:`fiberrl.cli.support.UsageError`."""
    from fiberrl.cli.support import UsageError
    if args.population is None:
        for flag, value, default in (("--pbt-interval", args.pbt_interval, None),
                                     ("--search", args.search, []),
                                     ("--pbt-quantile", args.pbt_quantile, 0.25),
                                     ("--pbt-resample", args.pbt_resample, 0.25)):
            if value != default:
                raise UsageError(f"{flag} needs --population N")
        return None
    from .pbt import space as spaces
    from .preflight import algorithm_defaults
    if args.population < 2:
        raise UsageError("--population must be at least 2")
    if args.pbt_interval is not None and args.pbt_interval < 0:
        raise UsageError("--pbt-interval must be 0 (random search) or more env steps")
    if not 0.0 < args.pbt_quantile <= 0.5:
        raise UsageError("--pbt-quantile must be in (0, 0.5]")
    if not 0.0 <= args.pbt_resample <= 1.0:
        raise UsageError("--pbt-resample must be in [0, 1]")
    for flag, clash in (("--ranks > 1", args.ranks > 1), ("--stop-on-solve", args.stop_on_solve),
                        ("--eval-every", args.eval_every is not None)):
        if clash:
            raise UsageError(f"{flag} cannot be used with --population (members evaluate at "
                             "every report, each --pbt-interval env steps)")
    if args.algo not in spaces.SEARCHABLE:
        raise UsageError(f"{args.algo} cannot train as a population; step-driven algorithms "
                         f"can: {', '.join(sorted(spaces.SEARCHABLE))}")
    try:
        search = spaces.parse_search(args.search) if args.search else None
        if search is not None:
            spaces.check_space(args.algo, search, algorithm_defaults(args.algo))
    except ValueError as error:
        raise UsageError(str(error)) from None
    both = sorted(set(search or {}) & set(overrides))
    if both:
        raise UsageError(f"{', '.join(both)}: given to both --set and --search; choose one")
    return search


def train_command(args: argparse.Namespace) -> int:
    """Run ``train`` for parsed ``args``: every check first (:mod:`rl.preflight`), then
    the run; bad input raises :class:`fiberrl.cli.support.UsageError`."""
    from pathlib import Path
    from . import preflight
    from fiberrl.cli.support import UsageError
    preflight.check_algorithm(args.algo)
    if not args.env:
        raise UsageError("--env is required (a gymnasium id, e.g. CartPole-v1)")
    for name in ("total_steps", "eval_episodes", "ranks", "num_envs", "eval_every"):
        value = getattr(args, name)   # (the last two: None for the algorithm's default)
        if value is not None and value < 1:
            raise UsageError(f"--{name.replace('_', '-')} must be at least 1")
    if args.workers < 0:
        raise UsageError("--workers must be 0 or more")
    from .train import DATA_PARALLEL
    if args.ranks > 1 and args.algo not in DATA_PARALLEL:
        raise UsageError(f"--ranks > 1 is available for {', '.join(DATA_PARALLEL)}, not {args.algo}")
    if args.ranks > 1 and args.stop_on_solve:
        raise UsageError("--stop-on-solve cannot be used with --ranks > 1 (only rank 0 evaluates)")
    preflight.check_env(args.algo, args.env)
    overrides = preflight.check_settings(args.algo, args.settings)
    search = _population_checks(args, overrides)
    preflight.check_backend(args.backend)
    preflight.check_devices(args.devices, args.ranks, args.backend)
    out = Path(args.out) if args.out else preflight.default_out(args.algo, args.env)
    preflight.check_out(out, args.resume, f"each run gets runs/{args.algo}-ENV-TIMESTAMP")
    from .train import TrainSpec, train
    spec = TrainSpec(algo=args.algo, env=args.env, out=out, seed=args.seed,
                     total_steps=args.total_steps, workers=args.workers, num_envs=args.num_envs,
                     backend=args.backend, eval_every=args.eval_every,
                     eval_episodes=args.eval_episodes, resume=args.resume,
                     stop_on_solve=args.stop_on_solve,
                     progress=False if args.no_progress else None, overrides=overrides,
                     ranks=args.ranks, devices=args.devices)
    if args.population is not None:
        from .pbt import PopulationSpec, train_population
        population = PopulationSpec(spec, population=args.population, interval=args.pbt_interval,
                                    search=search, quantile=args.pbt_quantile,
                                    resample_probability=args.pbt_resample)
        try:
            summary = train_population(population)
        except ValueError as error:  # a --resume of another population
            raise UsageError(str(error)) from error
        sys.stdout.write(population_line(args.algo, args.env, summary, out) + "\n")
        return 0
    try:
        summary = train(spec)
    except ValueError as error:  # settings the algorithm itself rejects (ranges, combinations)
        raise UsageError(str(error)) from error
    sys.stdout.write(result_line(args.algo, args.env, summary, out) + "\n")
    return 0


def population_line(algo: str, env: str, summary: Dict[str, Any], out: Any) -> str:
    """The line a population run ends with: the best member's evaluation, exploits,
    dropped members and where the outputs are."""
    size, best = summary["population_size"], summary["best_member"]
    mode = "PBT" if summary["mode"] == "pbt" else "random search"
    dropped = len(summary["dropped"])
    return (f"{algo} on {env}, {mode} of {size} members x {summary['member_steps']} env steps: "
            f"best member {best}, evaluation mean {summary['eval_mean']:.2f} ± "
            f"{summary['eval_std'] or 0.0:.2f}; {summary['exploits']} exploits"
            f"{f', {dropped} dropped' if dropped else ''} ({summary['wall_s']:.1f} s); "
            f"outputs in {out}")


def result_line(algo: str, env: str, summary: Dict[str, Any], out: Any) -> str:
    """The line ``fiberrl train`` ends with: the final evaluation, when (or whether) the
    env's reward threshold was reached, and where the outputs are."""
    mean, std = summary.get("eval_mean"), summary.get("eval_std")
    result = ("no evaluation" if mean is None
              else f"evaluation mean {mean:.2f} ± {std or 0.0:.2f}")
    solved, threshold = summary.get("solved_at_steps"), summary.get("reward_threshold")
    if solved is not None:
        verdict = f"solved (reward threshold {threshold:g}) at {solved} env steps"
    elif threshold is not None:
        verdict = f"not solved (reward threshold {threshold:g} not reached)"
    else:
        verdict = f"{env} has no reward threshold"
    return (f"{algo} on {env}: {result} after {summary['env_steps']} env steps "
            f"({summary['wall_s']:.1f} s); {verdict}; outputs in {out}")


def _add_commands(subparsers: Any) -> None:
    train_parser = subparsers.add_parser("train", help="train an RL algorithm on an env",
                                         description="Train an RL algorithm; write TensorBoard "
                                         "events, curve.png, checkpoints and summary.json to --out.")
    add_train_arguments(train_parser)
    try:
        from .data.cli import register_workflow
    except ImportError:  # the data pipeline needs its optional dependencies
        logger.debug("rl.data is unavailable; no workflow command", exc_info=True)
    else:
        register_workflow(subparsers)


def register(subparsers: Any) -> None:
    """Add ``train`` (and ``workflow``) to the ``fiberrl`` program's sub-parsers."""
    _add_commands(subparsers)


def build_parser() -> argparse.ArgumentParser:
    """Stand-alone parser for ``python -m rl``."""
    from fiberrl.cli.support import (ArgumentParser, add_debug_argument, add_debug_everywhere,
                                     set_prog)
    parser = ArgumentParser(prog="python -m rl", description="fiberrl's RL commands")
    parser.add_argument("--log-level", default=None)
    add_debug_argument(parser, top_level=True)
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    commands.required = True
    _add_commands(commands)
    add_debug_everywhere(commands)
    set_prog(commands)
    return parser


def run(argv: Optional[Sequence[str]] = None) -> int:
    """``python -m rl``: parse ``argv`` and run the chosen command under the error
    contract of :mod:`fiberrl.cli.support`."""
    import os
    from fiberrl.cli.support import run_command
    args = build_parser().parse_args(argv)
    level = (args.log_level or os.environ.get("FIBERRL_LOG_LEVEL") or "WARNING").upper()
    logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s")
    return run_command(args.func, args, getattr(args, "_prog", None) or "python -m rl")


def main(argv: Optional[List[str]] = None) -> int:
    """Alias of :func:`run`."""
    return run(argv)
