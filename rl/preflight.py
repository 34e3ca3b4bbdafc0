"""Checks ``fiberrl train`` makes before any work starts (and before ``--out`` exists).

Each check raises :class:`fiberrl.cli.support.UsageError` with one line saying what is
wrong and what to do: an unknown algorithm or env id, an action space the algorithm
cannot act in, ``--set`` keys the algorithm does not have or values of the wrong type
(typed against the algorithm's defaults), an unknown backend or one whose extra is
missing, and an output directory that already holds a run (without ``--resume``).
"""
from __future__ import annotations

import inspect
import logging
import re
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from fiberrl.cli.support import UsageError

logger = logging.getLogger(__name__)

#: algorithm -> the gymnasium action-space kinds it can act in
ACTION_SPACES: Dict[str, Tuple[str, ...]] = {
    "es": ("Discrete", "Box"),
    "ppo": ("Discrete", "Box"),
    "dqn": ("Discrete",),
    "parametric_dqn": ("Discrete",),
    "ddpg": ("Box",),
    "td3": ("Box",),
}
#: ES constructor arguments that ``fiberrl train`` sets itself
_ES_OWN = ("env", "seed", "pool", "workers")
#: files and folders that mark a directory as holding a run
RUN_MARKERS = ("summary.json", "checkpoints", "tb", "curve.png", "population.json", "members")


def check_algorithm(algo: str) -> None:
    """``algo`` must be one of :func:`rl.train.algorithm_names`."""
    from .train import algorithm_names
    names = algorithm_names()
    if algo not in names:
        raise UsageError(f"unknown algorithm {algo!r}; choose one of {', '.join(names)}")


def check_env(algo: str, env_id: str) -> None:
    """``env_id`` must name an env whose action space ``algo`` supports (the env is
    made once, in this process, and closed)."""
    import gymnasium as gym
    from .envs import make_env
    try:
        env = make_env(env_id)
    except (ValueError, gym.error.Error) as error:
        raise UsageError(f"{str(error).rstrip('.')}; see gymnasium.envs.registry for the ids") from None
    except ImportError as error:  # an env whose own dependency is missing (box2d, mujoco)
        raise UsageError(f"env {env_id!r} cannot be made here: {error}") from None
    try:
        kind = type(env.action_space).__name__
    finally:
        env.close()
    allowed = ACTION_SPACES.get(algo)
    if allowed and kind not in allowed:
        raise UsageError(f"{algo} needs a {' or '.join(allowed)} action space; {env_id} has "
                         f"{env.action_space}")


def algorithm_defaults(algo: str) -> Dict[str, Any]:
    """The settings ``--set`` may change for ``algo``, with their default values."""
    if algo == "es":
        from .algos.es import ES
        params = inspect.signature(ES.__init__).parameters.values()
        return {p.name: p.default for p in params
                if p.default is not p.empty and p.name not in _ES_OWN}
    from .policy import BASE_CONFIG
    if algo == "ppo":
        from .algos.ppo import PPO as cls
    elif algo == "dqn":
        from .algos.dqn import DQN as cls
    elif algo == "parametric_dqn":
        from .algos.parametric_dqn import ParametricDQN as cls
    elif algo == "td3":
        from .algos.td3 import TD3 as cls
    elif algo == "ddpg":
        from .algos.td3 import DDPG as cls
    else:
        return {}
    return {**BASE_CONFIG, **cls.default_config}


def _kind(default: Any) -> Optional[str]:
    """What a setting whose default is ``default`` takes (None: anything)."""
    if isinstance(default, bool):
        return "true or false"
    if isinstance(default, int):
        return "an integer"
    if isinstance(default, float):
        return "a number"
    if isinstance(default, str):
        return "a string"
    if isinstance(default, (list, tuple)):
        return "a JSON list, e.g. [64, 64]"
    return None


def typed_setting(key: str, value: Any, default: Any) -> Any:
    """``value`` converted to the type of ``default``; :class:`UsageError` if it has
    another type (``lr=fast`` where ``lr`` is a number)."""
    kind = _kind(default)
    ok = {
        "true or false": lambda v: isinstance(v, bool),
        "an integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
        "a number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
        "a string": lambda v: isinstance(v, str),
        "a JSON list, e.g. [64, 64]": lambda v: isinstance(v, list),
        None: lambda v: True,
    }[kind]
    if not ok(value):
        raise UsageError(f"--set {key}={_show(value)}: {key} takes {kind} (default "
                         f"{_show(default)})")
    if kind == "a number":
        return float(value)
    if isinstance(default, tuple):
        return tuple(value)
    return value


def _show(value: Any) -> str:
    import json
    try:
        return json.dumps(list(value) if isinstance(value, tuple) else value)
    except TypeError:
        return repr(value)


def check_settings(algo: str, settings: List[Tuple[str, Any]]) -> Dict[str, Any]:
    """The ``--set`` pairs as typed overrides; unknown keys list the valid ones."""
    defaults = algorithm_defaults(algo)
    overrides: Dict[str, Any] = {}
    for key, value in settings:
        if key not in defaults:
            raise UsageError(f"--set {key}: {algo} has no setting {key!r}; valid: "
                             f"{', '.join(sorted(defaults))}")
        overrides[key] = typed_setting(key, value, defaults[key])
    return overrides


def check_backend(name: Optional[str]) -> None:
    """An explicit ``--backend`` must exist and have what it needs installed."""
    if name:
        from fiberrl.cli.jobs import check_backend as check
        check(name)


def check_devices(devices: Optional[str], ranks: int, backend: Optional[str]) -> None:
    """``--devices cuda`` on the local backend needs one GPU per rank on this host."""
    if devices != "cuda":
        return
    from fiberrl.config import get_config
    if (backend or get_config().backend) != "local":
        return  # the cluster places each rank on a GPU of its own node
    from .distributed import check_local_gpus
    try:
        check_local_gpus(ranks)
    except ValueError as error:
        raise UsageError(f"--devices cuda: {error}") from None


def default_out(algo: str, env_id: str, now: Optional[float] = None) -> Path:
    """``runs/<algo>-<env>-<YYYYmmdd-HHMMSS>``, the env id made path-safe."""
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(now))
    safe = re.sub(r"[^A-Za-z0-9._-]+", "-", env_id).strip("-")
    return Path("runs") / f"{algo}-{safe}-{stamp}"


def holds_run(out: Path) -> List[str]:
    """The run files already in ``out`` (empty when it is absent or holds none)."""
    if not out.is_dir():
        return []
    return sorted(p.name for p in out.iterdir() if p.name in RUN_MARKERS)


def check_out(out: Path, resume: bool, rerun_hint: str) -> None:
    """Refuse to write a new run over an old one: a non-empty ``out`` needs
    ``--resume``; ``out`` must not be a file."""
    if out.exists() and not out.is_dir():
        raise UsageError(f"--out {out} is a file, not a directory")
    if resume or not out.is_dir():
        return
    if any(out.iterdir()):
        found = holds_run(out)
        what = f"an earlier run ({', '.join(found)})" if found else "files"
        raise UsageError(f"--out {out} already holds {what}; pass --resume to continue that "
                         f"run, or choose a new --out (or leave it out: {rerun_hint})")

