"""Command line of the data pipeline: ``fiberrl workflow ...`` (and ``python -m rl
workflow ...``)::

    workflow generate  --env ID --episodes N --epsilon E --seed S --out PATH [--format F]
    workflow timeline  --input PATH [PATH ...] --out DIR --gamma G [--workers W] [--backend B]
    workflow normalize --input DIR --out spec.json [--override ID=TYPE ...] [--workers W]

:func:`register_workflow` adds the ``workflow`` subcommand to another program's
sub-parsers; each leaf parser sets ``func(args) -> exit status``. Bad input exits
with status 2 and one ``error:`` line on stderr naming the file, line or row and field.
"""
from __future__ import annotations

import argparse
import json
import logging
import sys
from typing import Dict, NoReturn

from fiberrl.cli.support import UsageError

from .schema import FORMATS, LoggedDataError

logger = logging.getLogger(__name__)

_ERRORS = (LoggedDataError, ValueError, FileNotFoundError, FileExistsError)


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text}")
    return value


def _scale_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--workers", type=_positive, default=1,
                        help="pool workers (default 1: run in this process)")
    parser.add_argument("--backend", default=None,
                        help="fiberrl backend of the workers (local, slurm, docker, kubernetes)")
    parser.add_argument("--format", choices=FORMATS, default=None,
                        help="input format (default: from each file's suffix)")
    parser.add_argument("--reward-metric", default=None,
                        help="the metric used as reward when rewards are maps of metrics")
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")


def _init_backend(args: argparse.Namespace) -> None:
    if args.backend:
        import fiberrl
        fiberrl.init(backend=args.backend)


def _fail(error: Exception) -> NoReturn:
    """Bad input: one ``fiberrl workflow STEP: error:`` line, exit status 2
    (:mod:`fiberrl.cli.support`)."""
    raise UsageError(str(error)) from error


def run_generate(args: argparse.Namespace) -> int:
    """``workflow generate``: write logged episodes of an env."""
    from .generate import generate_logged_data
    try:
        summary = generate_logged_data(args.env, args.episodes, args.epsilon, args.out,
                                       seed=args.seed, format=args.format)
    except _ERRORS as error:
        _fail(error)
    sys.stdout.write(f"wrote {summary['rows']} logged rows of {args.episodes} episodes of "
                     f"{args.env} to {args.out}\n")
    return 0


def run_timeline_command(args: argparse.Namespace) -> int:
    """``workflow timeline``: logged rows -> Timeline Parquet shards."""
    from .sharding import run_timeline
    try:
        _init_backend(args)
        metadata = run_timeline(args.input, args.out, args.gamma, workers=args.workers,
                                reward_metric=args.reward_metric,
                                reward_horizon=args.reward_horizon, shards=args.shards,
                                format=args.format, overwrite=args.overwrite,
                                progress=not args.no_progress)
    except _ERRORS as error:
        _fail(error)
    sys.stdout.write(f"wrote {metadata['rows']} transitions of {metadata['mdps']} MDPs in "
                     f"{len(metadata['shards'])} shards to {args.out}\n")
    return 0


def _overrides(args: argparse.Namespace) -> Dict[str, str]:
    overrides: Dict[str, str] = {}
    if args.overrides:
        with open(args.overrides, encoding="utf-8") as handle:
            loaded = json.load(handle)
        if not isinstance(loaded, dict):
            raise ValueError(f"{args.overrides}: expected a JSON object of feature id -> type")
        overrides.update({str(k): str(v) for k, v in loaded.items()})
    for item in args.override or ():
        feature, sep, kind = item.partition("=")
        if not sep or not feature or not kind:
            raise ValueError(f"--override expects FEATURE=TYPE, got {item!r}")
        overrides[feature] = kind
    return overrides


def run_normalize(args: argparse.Namespace) -> int:
    """``workflow normalize``: sample features, identify types, write the spec."""
    from .identify import IdentifyOptions, identify_features
    from .sampling import sample_features
    from .spec import save_spec
    try:
        _init_backend(args)
        overrides = _overrides(args)
        samples, counts = sample_features(args.input, field=args.field, size=args.sample_size,
                                          seed=args.seed, workers=args.workers,
                                          reward_metric=args.reward_metric, format=args.format,
                                          progress=not args.no_progress)
        if not samples:
            raise ValueError(f"no values of {args.field!r} in {args.input}")
        options = IdentifyOptions(max_enum_values=args.max_enum_values, quantiles=args.quantiles,
                                  clamp=args.clamp)
        spec = identify_features(samples, overrides, counts, options, field=args.field)
        save_spec(spec, args.out)
    except (*_ERRORS, json.JSONDecodeError) as error:
        _fail(error)
    kinds: Dict[str, int] = {}
    for params in spec["features"].values():
        kinds[params["type"]] = kinds.get(params["type"], 0) + 1
    summary = ", ".join(f"{n} {kind}" for kind, n in sorted(kinds.items()))
    sys.stdout.write(f"wrote the spec of {len(spec['features'])} features ({summary}) to "
                     f"{args.out}\n")
    return 0


def register_workflow(subparsers) -> argparse.ArgumentParser:
    """Add ``workflow {generate,timeline,normalize}`` to ``subparsers``; returns the
    ``workflow`` parser."""
    from .sampling import DEFAULT_SAMPLE_SIZE
    from .spec import DEFAULT_CLAMP, FEATURE_TYPES
    from .timeline import DEFAULT_REWARD_HORIZON
    workflow = subparsers.add_parser("workflow", help="Horizon-style data pipeline: logged data "
                                     "-> transitions -> normalization spec")
    steps = workflow.add_subparsers(dest="workflow_command", metavar="STEP")
    steps.required = True   # without one: a one-line usage error, exit status 2

    gen = steps.add_parser("generate", help="write logged rows of an env under epsilon-greedy")
    gen.add_argument("--env", required=True, help="gymnasium id, e.g. rl/Gridworld-v0, CartPole-v1")
    gen.add_argument("--episodes", type=_positive, required=True, help="episodes to log")
    gen.add_argument("--epsilon", type=float, default=1.0,
                     help="exploration rate of the logging policy (default 1.0: uniform random)")
    gen.add_argument("--seed", type=int, default=0, help="seed of env and policy (default 0)")
    gen.add_argument("--out", required=True, help="output file (.jsonl, .csv or .parquet)")
    gen.add_argument("--format", choices=FORMATS, default=None,
                     help="output format (default: from the suffix)")
    gen.set_defaults(func=run_generate)

    tl = steps.add_parser("timeline", help="turn logged rows into training transitions")
    tl.add_argument("--input", nargs="+", required=True,
                    help="logged files, directories or glob patterns")
    tl.add_argument("--out", required=True, help="output directory of Parquet shards")
    tl.add_argument("--gamma", type=float, required=True, help="discount of episode_value")
    tl.add_argument("--reward-horizon", type=int, default=DEFAULT_REWARD_HORIZON,
                    help=f"steps ahead kept in reward_timeline (default {DEFAULT_REWARD_HORIZON}; "
                         "-1: all)")
    tl.add_argument("--shards", type=_positive, default=None,
                    help="output shards (default: from the input size and workers)")
    tl.add_argument("--overwrite", action="store_true", help="replace an earlier output")
    _scale_arguments(tl)
    tl.set_defaults(func=run_timeline_command)

    norm = steps.add_parser("normalize", help="identify feature types and write a spec")
    norm.add_argument("--input", nargs="+", required=True,
                      help="a Timeline output directory, or logged files")
    norm.add_argument("--out", required=True, help="the spec file to write (JSON)")
    norm.add_argument("--field", default="state_features",
                      help="the feature map column (default state_features)")
    norm.add_argument("--sample-size", type=_positive, default=DEFAULT_SAMPLE_SIZE,
                      help=f"values sampled per feature (default {DEFAULT_SAMPLE_SIZE})")
    norm.add_argument("--seed", type=int, default=0, help="sampling seed (default 0)")
    norm.add_argument("--override", action="append", metavar="FEATURE=TYPE",
                      help=f"force a feature's type ({', '.join(FEATURE_TYPES)}); repeatable")
    norm.add_argument("--overrides", metavar="FILE", help="JSON object of feature id -> type")
    norm.add_argument("--max-enum-values", type=_positive, default=10,
                      help="most distinct integers of an enum feature (default 10)")
    norm.add_argument("--quantiles", type=_positive, default=20,
                      help="intervals of a quantile feature (default 20)")
    norm.add_argument("--clamp", type=float, default=DEFAULT_CLAMP,
                      help=f"bound of normalized outputs (default {DEFAULT_CLAMP})")
    _scale_arguments(norm)
    norm.set_defaults(func=run_normalize)

    train = steps.add_parser("train", help="timeline -> normalization -> offline training "
                             "with CPE -> export, from a config file")
    train.add_argument("--config", required=True, help="workflow config (TOML or JSON)")
    train.add_argument("--resume", action="store_true",
                       help="continue training from the newest checkpoint (needed when the "
                            "config's out already holds a run)")
    train.add_argument("--no-progress", action="store_true", help="no progress bars")
    train.set_defaults(func=run_train)
    return workflow


def run_train(args: argparse.Namespace) -> int:
    """``workflow train``: the whole offline workflow from a config file."""
    from ..offline.workflow import check_config, load_config, run_workflow
    try:
        config = load_config(args.config)
        if args.resume:
            config.training.resume = True
        check_config(config)
        summary = run_workflow(config, progress=not args.no_progress)
    except (*_ERRORS, FileNotFoundError) as error:
        _fail(error)
    cpe = (summary.get("cpe") or {}).get("sequential", {})
    dr = cpe.get("dr", {})
    parts = [f"trained {len(summary['epochs'])} epochs into {config.out}",
             f"td_loss {summary['td_loss']:.5f}"]
    if dr:
        parts.append(f"CPE (sequential DR) {dr['value']:.4f} [{dr['ci_low']:.4f}, {dr['ci_high']:.4f}]")
    if summary.get("eval_mean") is not None:
        parts.append(f"evaluation mean {summary['eval_mean']:.1f}")
    parts.append("exported " + ", ".join(summary["exported"].values()))
    sys.stdout.write("; ".join(parts) + "\n")
    return 0
