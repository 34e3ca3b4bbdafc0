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
    parser.add_argument("--env", required=True, help="gymnasium id, e.g. CartPole-v1")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--total-steps", type=int, default=100_000, help="training env steps")
    parser.add_argument("--workers", type=int, default=0,
                        help="ES: pool workers; the others: fiberrl processes stepping the envs "
                             "(0: in this process)")
    parser.add_argument("--num-envs", type=int, default=None,
                        help="envs of step-driven algorithms (PPO: 4, the others: 1)")
    parser.add_argument("--backend", default=None, help="fiberrl backend (default: config)")
    parser.add_argument("--out", required=True, help="output directory")
    parser.add_argument("--eval-every", type=int, default=None,
                        help="env steps between evaluations (default total/20)")
    parser.add_argument("--eval-episodes", type=int, default=10)
    parser.add_argument("--resume", action="store_true", help="continue from OUT's last checkpoint")
    parser.add_argument("--stop-on-solve", action="store_true",
                        help="stop at the first evaluation at or above the env's reward threshold")
    parser.add_argument("--set", dest="settings", action="append", type=_parse_setting, default=[],
                        metavar="KEY=VALUE", help="algorithm setting (JSON value), repeatable")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.add_argument("--ranks", type=int, default=1,
                        help="data-parallel learner ranks, one fiberrl process each (ppo, td3, ddpg)")
    parser.add_argument("--devices", choices=("cpu", "cuda"), default=None,
                        help="cpu (gloo, default) or cuda (one GPU per rank, NCCL)")
    parser.set_defaults(func=train_command)


def train_command(args: argparse.Namespace) -> int:
    """Run ``train`` for parsed ``args``."""
    from .train import TrainSpec, algorithm_names, train
    if args.algo not in algorithm_names():
        logger.error("unknown algorithm %r; choose one of %s", args.algo, ", ".join(algorithm_names()))
        return 2
    overrides: Dict[str, Any] = dict(args.settings)
    spec = TrainSpec(algo=args.algo, env=args.env, out=args.out, seed=args.seed,
                     total_steps=args.total_steps, workers=args.workers, num_envs=args.num_envs,
                     backend=args.backend, eval_every=args.eval_every,
                     eval_episodes=args.eval_episodes, resume=args.resume,
                     stop_on_solve=args.stop_on_solve,
                     progress=False if args.no_progress else None, overrides=overrides,
                     ranks=args.ranks, devices=args.devices)
    summary = train(spec)
    sys.stdout.write(f"{args.algo} on {args.env}: evaluation mean {summary['eval_mean']:.2f} "
                     f"± {summary['eval_std']:.2f} after {summary['env_steps']} env steps "
                     f"({summary['wall_s']:.1f} s); solved at {summary['solved_at_steps']}; "
                     f"outputs in {args.out}\n")
    return 0


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
    parser = argparse.ArgumentParser(prog="python -m rl", description="fiberrl's RL commands")
    parser.add_argument("--log-level", default="WARNING")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    commands.required = True
    _add_commands(commands)
    return parser


def run(argv: Optional[Sequence[str]] = None) -> int:
    """``python -m rl``: parse ``argv`` and run the chosen command."""
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(levelname)s %(name)s: %(message)s")
    return int(args.func(args) or 0)


def main(argv: Optional[List[str]] = None) -> int:
    """Alias of :func:`run`."""
    return run(argv)
