"""``fiberrl workflow train --config FILE``: logged data -> Timeline -> normalization ->
offline training with CPE every epoch -> exported policy, in one command.

The config is TOML (JSON works too), one table per step; every key is optional
except ``data.input`` (or a ``[generate]`` table that writes the input first) and
``out``. Paths are relative to the config file. Example (``configs/gridworld_offline.toml``)::

    out = "runs/gridworld-offline"

    [generate]                 # optional: log an env under epsilon-greedy first
    env = "rl/Gridworld-v0"
    episodes = 2000
    epsilon = 0.5

    [data]
    gamma = 0.9                # discount per sequence-number step
    workers = 2                # pool workers of the Timeline and sampling steps
    action_names = ["L", "R", "U", "D"]

    [model]                    # rl.algos.dqn.DQN settings
    hidden = [64, 64]
    lr = 0.001

    [training]                 # rl.offline.trainer.OfflineSettings, plus ranks
    epochs = 10
    temperature = 0.01
    ranks = 1                  # data-parallel ranks (torch.distributed, one fiberrl process each)

    [export]
    formats = ["torchscript", "onnx"]

Outputs in ``out``: ``logs.parquet`` (when generated), ``timeline/``, ``spec.json``,
``checkpoints/``, ``tb/``, ``summary.json`` and ``policy.pt`` / ``policy.onnx``.
"""
from __future__ import annotations

import copy
import json
import logging
import math
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

from .trainer import OfflineSettings

logger = logging.getLogger(__name__)

TABLES = ("generate", "data", "model", "training", "export")


@dataclass
class GenerateConfig:
    """``[generate]``: logged rows of an env under an epsilon-greedy policy."""

    env: str = "rl/Gridworld-v0"
    episodes: int = 1000
    epsilon: float = 0.5
    seed: int = 0


@dataclass
class DataConfig:
    """``[data]``: the Timeline and normalization steps."""

    input: Optional[str] = None        # logged rows (files, directories or globs)
    gamma: float = 0.99
    workers: int = 1
    backend: Optional[str] = None
    shards: Optional[int] = None       # Timeline output shards (>= ranks)
    action_names: Optional[List[str]] = None  # action order (default: sorted names)
    overrides: Dict[str, str] = field(default_factory=dict)  # feature id -> type
    sample_size: int = 10_000


@dataclass
class TrainingConfig(OfflineSettings):
    """``[training]``: :class:`~rl.offline.trainer.OfflineSettings` plus the ranks."""

    ranks: int = 1
    devices: Optional[str] = None      # None/"cpu" or "cuda"
    rank_resources: Dict[str, Any] = field(default_factory=lambda: {"mem": "2G"})  # per rank job


@dataclass
class ExportConfig:
    """``[export]``: which files to write."""

    formats: List[str] = field(default_factory=lambda: ["torchscript", "onnx"])


@dataclass
class WorkflowConfig:
    """The whole workflow (see the module docstring)."""

    out: Path
    data: DataConfig
    training: TrainingConfig
    export: ExportConfig
    model: Dict[str, Any] = field(default_factory=dict)
    generate: Optional[GenerateConfig] = None


def _build(cls: type, table: Dict[str, Any], where: str) -> Any:
    valid = {f.name for f in fields(cls)}
    unknown = sorted(set(table) - valid)
    if unknown:
        raise ValueError(f"{where}: unknown keys {unknown}; valid keys: {sorted(valid)}")
    return cls(**table)


def load_config(path: Path) -> WorkflowConfig:
    """Read and check a workflow config; relative paths become relative to its folder."""
    path = Path(path)
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".json":
        raw = json.loads(text)
    else:
        try:
            import tomllib
        except ImportError:  # Python < 3.11
            import tomli as tomllib
        raw = tomllib.loads(text)
    unknown = sorted(set(raw) - set(TABLES) - {"out"})
    if unknown:
        raise ValueError(f"{path}: unknown keys {unknown}; valid: {['out', *TABLES]}")
    if "out" not in raw:
        raise ValueError(f"{path}: 'out' (the output directory) is required")
    base = path.parent
    data = _build(DataConfig, raw.get("data", {}), f"{path} [data]")
    generate = _build(GenerateConfig, raw["generate"], f"{path} [generate]") if "generate" in raw else None
    if data.input is None and generate is None:
        raise ValueError(f"{path}: give [data] input, or a [generate] table to make the input")
    if data.input is not None:
        data.input = str(base / data.input)
    training = _build(TrainingConfig, raw.get("training", {}), f"{path} [training]")
    export = _build(ExportConfig, raw.get("export", {}), f"{path} [export]")
    bad = sorted(set(export.formats) - {"torchscript", "onnx"})
    if bad:
        raise ValueError(f"{path} [export]: unknown formats {bad}; valid: torchscript, onnx")
    return WorkflowConfig(out=base / raw["out"], data=data, training=training, export=export,
                          model=dict(raw.get("model", {})), generate=generate)


#: export format -> (modules it needs, the fiberrl extra that installs them)
EXPORT_NEEDS = {"onnx": (("onnx", "onnxscript"), "export")}


def check_config(config: WorkflowConfig) -> None:
    """What must hold before any work starts: the extras the export formats need are
    installed, the backend exists, and ``out`` does not hold an earlier run unless
    ``training.resume`` is set. Raises :class:`fiberrl.cli.support.UsageError`."""
    from fiberrl.cli.support import UsageError, require_modules
    for fmt in config.export.formats:
        if fmt in EXPORT_NEEDS:
            modules, extra = EXPORT_NEEDS[fmt]
            require_modules(modules, extra, f"[export] formats = {fmt!r}")
    if config.data.backend:
        from fiberrl.cli.jobs import check_backend
        check_backend(config.data.backend)
    out = config.out
    if out.exists() and not out.is_dir():
        raise UsageError(f"out = {str(out)!r} is a file, not a directory")
    if not config.training.resume and out.is_dir() and any(out.iterdir()):
        raise UsageError(f"out = {str(out)!r} already holds an earlier run; pass --resume to "
                         "continue it, or set another out in the config")


def _policy(config: WorkflowConfig, spec: Dict[str, Any], features: Sequence[str],
            num_actions: int) -> Any:
    import gymnasium as gym
    from ..algos.dqn import DQN
    from ..data import FeatureNormalizer
    from .preprocess import MaskedNormalizer
    preprocessor = MaskedNormalizer(FeatureNormalizer(spec, list(features)))
    model_config = {"gamma": config.data.gamma, **config.model}
    obs_space = gym.spaces.Box(-math.inf, math.inf, (len(features),))
    return DQN(obs_space, gym.spaces.Discrete(num_actions), config=model_config,
               seed=config.training.seed, preprocessor=preprocessor)


def _settings(config: WorkflowConfig) -> OfflineSettings:
    """The trainer's part of ``[training]``."""
    return OfflineSettings(**{f.name: getattr(config.training, f.name)
                              for f in fields(OfflineSettings)})


def train_rank(ctx: Any, config: WorkflowConfig, spec: Dict[str, Any]) -> Dict[str, Any]:
    """One rank of the training step (also the single-rank path with ``ctx=None``)."""
    from .dataset import OfflineDataset
    from .trainer import OfflineTrainer
    import torch
    torch.set_num_threads(1)
    rank, world = (0, 1) if ctx is None else (ctx.rank, ctx.world_size)
    from ..data.spec import spec_features
    features = spec_features(spec)
    dataset = OfflineDataset.from_timeline(config.out / "timeline", config.data.gamma, features,
                                           config.data.action_names, shard=(rank, world))
    policy = _policy(config, spec, features, len(dataset.action_names))
    if ctx is not None and ctx.device != "cpu":
        policy.model.to(ctx.device)
        policy.target_model.to(ctx.device)
    trainer = OfflineTrainer(policy, dataset, _settings(config),
                             out=config.out, rank=rank, world_size=world,
                             info={"algo": "dqn", "workflow": "offline"},
                             acting=lambda p: FeatureSelectingPolicy(p, features))
    return trainer.train()


def run_workflow(config: WorkflowConfig, progress: bool = False) -> Dict[str, Any]:
    """Run every step of ``config``; returns the training summary with export paths."""
    from ..data import generate_logged_data, run_timeline
    from ..data.identify import IdentifyOptions, identify_features
    from ..data.sampling import sample_features
    from ..data.spec import save_spec
    out = config.out
    out.mkdir(parents=True, exist_ok=True)
    if config.data.backend:
        import fiberrl
        fiberrl.init(backend=config.data.backend)
    source = config.data.input
    if config.generate is not None:
        source = str(out / "logs.parquet")
        g = config.generate
        generate_logged_data(g.env, g.episodes, g.epsilon, source, seed=g.seed)
    shards = config.data.shards or max(2, config.training.ranks)
    if not (out / "timeline" / "_SUCCESS").exists() or not config.training.resume:
        run_timeline(source, out / "timeline", config.data.gamma, workers=config.data.workers,
                     shards=shards, overwrite=True, progress=progress)
    samples, counts = sample_features(str(out / "timeline"), field="state_features",
                                      size=config.data.sample_size, seed=config.training.seed,
                                      workers=config.data.workers, progress=progress)
    spec = identify_features(samples, config.data.overrides, counts, IdentifyOptions(),
                             field="state_features")
    save_spec(spec, out / "spec.json")
    if config.training.ranks > 1:
        from ..distributed import launch
        summaries = launch(train_rank, config.training.ranks, args=(config, spec),
                           devices=config.training.devices,
                           resources=config.training.rank_resources)
        summary = summaries[0]
    else:
        summary = train_rank(None, config, spec)
    summary.update(_finish(config, spec))
    from ..outputs import json_safe
    (out / "summary.json").write_text(json.dumps(json_safe(summary), indent=2))
    return summary


def _finish(config: WorkflowConfig, spec: Dict[str, Any]) -> Dict[str, Any]:
    """Load the final checkpoint, evaluate it in an env if asked, and export it."""
    import torch
    from ..data.spec import spec_features
    features = spec_features(spec)
    checkpoints = sorted((config.out / "checkpoints").glob("epoch-*.pt"),
                         key=lambda p: int(p.stem[6:]))
    saved = torch.load(checkpoints[-1], map_location="cpu", weights_only=False)
    action_names = config.data.action_names or _timeline_actions(config.out / "timeline")
    policy = _policy(config, spec, features, len(action_names))
    policy.load_state_dict(saved["policy"])
    result: Dict[str, Any] = {"exported": {}}
    if config.training.eval_env:
        from ..evaluation import evaluate
        evaluation = evaluate(FeatureSelectingPolicy(policy, features), config.training.eval_env,
                              config.training.eval_episodes)
        result["eval_mean"], result["eval_std"] = evaluation.mean, evaluation.std
    result["exported"] = export_dqn(policy, features, action_names, config.out,
                                    config.export.formats)
    return result


def _timeline_actions(directory: Path) -> List[str]:
    from ..data import read_metadata
    return [str(a) for a in read_metadata(directory)["actions"]]


def export_dqn(policy: Any, features: Sequence[str], action_names: Sequence[str], out: Path,
               formats: Sequence[str]) -> Dict[str, str]:
    """Write the policy as ``policy.pt`` (TorchScript) and/or ``policy.onnx``."""
    from ..export import ExportedPolicy, export_onnx, export_torchscript
    from .preprocess import QScorer
    model = copy.deepcopy(policy.model)
    module = ExportedPolicy(model.preprocessor.normalizer, QScorer(model), list(action_names))
    written = {}
    if "torchscript" in formats:
        export_torchscript(module, out / "policy.pt")
        written["torchscript"] = str(out / "policy.pt")
    if "onnx" in formats:
        export_onnx(module, out / "policy.onnx")
        written["onnx"] = str(out / "policy.onnx")
    return written


class FeatureSelectingPolicy:
    """Act in an env whose observation index ``i`` is logged feature ``"i"``: picks the
    model's features out of the observation (as :mod:`rl.data.generate` logs them)."""

    def __init__(self, policy: Any, features: Sequence[str]) -> None:
        self.policy = policy
        self.columns = [int(f) for f in features]

    def compute_actions(self, obs: Any, explore: bool = True) -> Any:
        """The wrapped policy's actions on the selected columns."""
        import numpy as np
        return self.policy.compute_actions(np.asarray(obs, np.float32)[:, self.columns], explore)


def config_dict(config: WorkflowConfig) -> Dict[str, Any]:
    """The config as plain data (for logs and summaries)."""
    from ..outputs import json_safe
    return json_safe(asdict(config))
