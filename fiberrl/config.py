"""fiberrl's configuration: one typed dataclass, one documented precedence.

Precedence, highest first:

1. keyword arguments of ``fiberrl.init(**kwargs)`` (each call updates the settings
   earlier calls made; it does not reset them);
2. environment variables ``FIBERRL_<KEY>`` (e.g. ``FIBERRL_BACKEND=slurm``);
3. the config file: the path in ``FIBERRL_CONFIG``, else ``fiberrl.toml`` in the
   working directory (a flat table of the keys below, or a ``[fiberrl]`` table);
4. the defaults below.

An unknown key anywhere, a value of the wrong type or out of range (a negative
timeout), and an unknown backend are each a :class:`~fiberrl.errors.ConfigError` that
says what is allowed; an unknown ``FIBERRL_*`` environment variable (a typo such as
``FIBERRL_BAKEND``) is logged as a warning. Child jobs receive their parent's resolved configuration, so a whole tree of
processes uses one backend and one set of defaults.
"""
from __future__ import annotations

import dataclasses
import functools
import json
import logging
import math
import os
import sys
import types
import threading
import typing
from dataclasses import dataclass, field, fields
from typing import Any, Dict, Mapping, Optional

from .errors import ConfigError
from .log import level_name
from .resources import parse_mem

logger = logging.getLogger(__name__)

ENV_PREFIX = "FIBERRL_"
INHERITED_ENV = "FIBERRL_INHERITED_CONFIG"
CONFIG_FILE_ENV = "FIBERRL_CONFIG"
DEFAULT_CONFIG_FILE = "fiberrl.toml"
#: the image of container jobs when neither ``image`` nor ``docker_image`` is set
DEFAULT_IMAGE = "fiberrl-worker:cpu"


@dataclass(frozen=True)
class Config:
    """Every setting of fiberrl, with its default."""

    backend: str = "local"
    """Where jobs run: ``local``, ``docker``, ``kubernetes``, ``slurm`` or a plugin's name."""
    listen_host: Optional[str] = None
    """Address this process's hub binds and advertises to its jobs; ``None`` asks the backend."""
    python: str = sys.executable
    """Python interpreter that runs each job (``python -m fiberrl.spawn``)."""
    image: Optional[str] = None
    """Container image for container backends."""
    cpu: Optional[float] = None
    """Default CPUs requested per job (``None``: the backend's default)."""
    mem: Optional[str] = None
    """Default memory per job, e.g. ``"512M"`` or ``"2G"`` (``None``: the backend's default)."""
    gpu: int = 0
    """Default GPUs per job."""
    forkserver: bool = True
    """Local backend: fork each job from a warm server process that has already
    imported fiberrl (like the stdlib's ``forkserver`` start method; ~10x faster
    starts). ``False`` starts every job as a fresh interpreter."""
    log_level: str = "WARNING"
    """Level of the ``fiberrl`` logger in every job; when not set, a job takes its
    parent's effective ``fiberrl`` logger level, as the stdlib's children do."""
    log_dir: Optional[str] = None
    """Directory for job logs (``None``: a per-user directory under the system temp dir)."""
    start_timeout: float = 300.0
    """Seconds a started job may take to connect back before it is declared failed."""
    parent_grace: float = 3.0
    """Seconds a job waits after losing its parent's hub before it exits (no orphans)."""
    heartbeat_interval: float = 1.0
    """Seconds between heartbeats (dead-peer detection across hosts)."""
    heartbeat_timeout: float = 10.0
    """Seconds without a heartbeat after which a peer connection is considered dead."""
    spin_wait_us: float = 50.0
    """Microseconds a process waiting on a ``Pipe`` or a manager reply may poll before
    it sleeps; ``0`` always sleeps at once. Waking a sleeping process on another core
    costs ~40 us on a VM; polling a little turns a quick reply into a ~20 us round
    trip. It polls only while the machine has a core to spare (no more runnable
    threads than CPUs) and while its peer answers that fast, so a busy machine or a
    slow peer costs no polling (docs/architecture.md, "Waiting on a busy machine")."""
    max_task_retries: int = 3
    """Workers that may die while running one pool task before the task fails."""
    time_limit_margin: float = 120.0
    """Seconds before a pool worker's job hits its time limit at which the pool replaces it."""
    extra: Dict[str, Any] = field(default_factory=dict)
    """Backend-specific settings (e.g. ``{"slurm_partition": "gpu"}``)."""

    @classmethod
    def keys(cls) -> list:
        """The valid configuration keys."""
        return [f.name for f in fields(cls)]

    def to_json(self) -> str:
        """Serialize for handing to a child job."""
        return json.dumps(dataclasses.asdict(self))


def _check_keys(values: Mapping[str, Any], source: str) -> None:
    unknown = sorted(set(values) - set(Config.keys()))
    if unknown:
        raise ConfigError(f"unknown fiberrl config key(s) {unknown} in {source}; "
                          f"valid keys: {', '.join(Config.keys())}")


@functools.lru_cache(maxsize=None)
def field_types() -> Dict[str, Any]:
    """``Config``'s field types, evaluated once (the fork server warms this): each
    ``get_type_hints`` call compiles every string annotation again, which cost a job
    ~10 ms of its start when done per key."""
    return typing.get_type_hints(Config)


#: how a switch may be spelled (an environment variable, a config file, ``init``)
_SWITCH = {"1": True, "true": True, "yes": True, "on": True,
           "0": False, "false": False, "no": False, "off": False}


def _coerce(name: str, raw: Any) -> Any:
    """Convert ``raw`` (often a string from the environment) to the field's type."""
    hint = field_types()[name]
    optional = type(None) in typing.get_args(hint)
    target = [a for a in typing.get_args(hint) if a is not type(None)][0] if optional else hint
    if raw is None or (isinstance(raw, str) and optional
                       and raw.strip().lower() in ("", "none", "null")):
        if not optional:
            raise ConfigError(f"fiberrl config key {name!r} may not be empty")
        return None
    origin = typing.get_origin(target)
    try:
        if origin is dict or target is dict:
            return json.loads(raw) if isinstance(raw, str) else dict(raw)
        if target is bool:
            return raw if isinstance(raw, bool) else _SWITCH[str(raw).strip().lower()]
        if target in (int, float, str):
            return target(raw)
    except (TypeError, ValueError, KeyError) as exc:
        raise ConfigError(f"fiberrl config key {name!r}: cannot read {raw!r} as "
                          f"{getattr(target, '__name__', target)}") from exc
    return raw


def _from_file() -> Dict[str, Any]:
    path = os.environ.get(CONFIG_FILE_ENV) or (
        DEFAULT_CONFIG_FILE if os.path.exists(DEFAULT_CONFIG_FILE) else None)
    if not path:
        return {}
    if sys.version_info >= (3, 11):  # imported here: most processes have no config file
        import tomllib as _toml
    else:  # pragma: no cover - exercised on Python < 3.11 only
        import tomli as _toml
    try:
        with open(path, "rb") as fh:
            data = _toml.load(fh)
    except FileNotFoundError as exc:
        raise ConfigError(f"{CONFIG_FILE_ENV} names {path!r}, which does not exist") from exc
    except _toml.TOMLDecodeError as exc:
        raise ConfigError(f"cannot parse fiberrl config file {path!r}: {exc}") from exc
    data = data.get("fiberrl", data)
    _check_keys(data, f"config file {path!r}")
    return data


#: ``FIBERRL_*`` variables that are not settings: fiberrl's own hand-over to jobs,
#: and variables that a backend or the test suite reads
NOT_SETTINGS = frozenset({
    "CONFIG", "INHERITED_CONFIG", "SECRET", "TOKEN", "PARENT", "JOB_NAME", "SENTINEL_FD",
    "RUN_ID", "POD_NAME", "POD_IP", "POD_UID", "SLURM_SUBMITTED", "SLURM_DIR", "GONE",
    "STARTED_FD", "SPARE", "OUTPUT_FILE", "ERROR_FILE", "DOCKER_OUTPUT_DIR",
})


def _from_env() -> Dict[str, Any]:
    values = {}
    for key, raw in os.environ.items():
        if not key.startswith(ENV_PREFIX) or key in (CONFIG_FILE_ENV, INHERITED_ENV):
            continue
        name = key[len(ENV_PREFIX):].lower()
        if name in Config.keys():
            values[name] = raw
        elif key[len(ENV_PREFIX):] not in NOT_SETTINGS and not key.startswith("FIBERRL_TEST"):
            _warn_once(f"ignoring {key}: not a fiberrl setting (settings: "
                       f"{', '.join(ENV_PREFIX + k.upper() for k in sorted(Config.keys()))})")
    return values


_warned: set = set()


def _warn_once(message: str) -> None:
    if message not in _warned:
        _warned.add(message)
        logger.warning("%s", message)


#: settings that must be positive, or at least zero
_POSITIVE = ("start_timeout", "heartbeat_interval", "heartbeat_timeout")
_NOT_NEGATIVE = ("parent_grace", "spin_wait_us", "max_task_retries", "time_limit_margin", "gpu")


def _check_ranges(config: "Config") -> None:
    for name in (*_POSITIVE, *_NOT_NEGATIVE, "cpu"):
        value = getattr(config, name)
        if isinstance(value, float) and not math.isfinite(value):
            raise ConfigError(f"fiberrl config key {name!r} must be a finite number, got {value!r}")
    for name in _POSITIVE:
        if not getattr(config, name) > 0:
            raise ConfigError(f"fiberrl config key {name!r} must be positive, "
                              f"got {getattr(config, name)!r}")
    for name in _NOT_NEGATIVE:
        if getattr(config, name) < 0:
            raise ConfigError(f"fiberrl config key {name!r} may not be negative, "
                              f"got {getattr(config, name)!r}")
    if config.cpu is not None and not config.cpu > 0:
        raise ConfigError(f"fiberrl config key 'cpu' must be positive, got {config.cpu!r}")
    if not config.backend:
        raise ConfigError("fiberrl config key 'backend' may not be empty")
    try:   # (else every job's start would fail on it, far from where it was set)
        parse_mem(config.mem)
    except ValueError as exc:
        raise ConfigError(f"fiberrl config key 'mem': {exc}") from None


def resolve(**overrides: Any) -> Config:
    """Build a :class:`Config` from overrides, environment, config file and defaults."""
    _check_keys(overrides, "fiberrl.init() arguments")
    inherited = os.environ.get(INHERITED_ENV)
    values: Dict[str, Any] = json.loads(inherited) if inherited else _from_file()
    if not inherited:
        values.update(_from_env())
    values.update(overrides)
    if "log_level" in values:   # a name in any case, kept; or a number, held as its name
        level = values["log_level"]
        try:   # (a job's logging set-up would fail on anything else, in every job)
            name = level_name(level)
        except ValueError as exc:
            raise ConfigError(f"fiberrl config key 'log_level': {exc}") from None
        if not isinstance(level, str) or level.strip().isdigit():
            values["log_level"] = name
    config = Config(**{k: _coerce(k, v) for k, v in values.items()})
    _check_ranges(config)
    object.__setattr__(config, "_explicit", frozenset(values))  # not a field
    return config


def is_explicit(config: Config, key: str) -> bool:
    """True if ``key`` of ``config`` was set (init, environment, file or the parent
    job), False if it is the default."""
    return key in getattr(config, "_explicit", frozenset())


def backend_name() -> str:
    """The backend this process's jobs run on: the configured one; unset, ``slurm``
    inside a Slurm allocation (so a script run with ``sbatch``/``salloc`` starts its
    processes as job steps), else ``local``."""
    config = get_config()
    if not is_explicit(config, "backend") and os.environ.get("SLURM_JOB_ID"):
        return "slurm"
    return config.backend or "local"


_lock = threading.Lock()
_current: Optional[Config] = None
_init_overrides: Dict[str, Any] = {}   # every init() argument so far, later calls winning
_listeners: list = []                  # called with each new Config (see on_change)


def on_change(listener: Any) -> None:
    """Call ``listener(config)`` before :func:`init` puts a new configuration in force;
    it may raise :class:`ConfigError` to refuse it (the backends check the backend's
    name this way, so this module imports none of them)."""
    _listeners.append(listener)


def get_config() -> Config:
    """The configuration in force, resolved on first use."""
    global _current
    with _lock:
        if _current is None:
            _current = resolve()
        return _current


def init(**overrides: Any) -> Config:
    """Update fiberrl's configuration for this process (and the jobs it starts).

    Example: ``fiberrl.init(backend="slurm", cpu=2, mem="4G")``. Settings given to an
    earlier call stay unless this one gives them again; a bad key, value or backend
    raises :class:`~fiberrl.errors.ConfigError` and changes nothing.
    """
    global _current
    with _lock:
        merged = {**_init_overrides, **overrides}
    config = resolve(**merged)
    for listener in list(_listeners):
        listener(config)
    with _lock:
        _init_overrides.clear()
        _init_overrides.update(merged)
        _current = config
    return config


def reset() -> Config:
    """Forget every :func:`init` setting: back to the environment, file and defaults."""
    global _current
    config = resolve()
    for listener in list(_listeners):
        listener(config)
    with _lock:
        _init_overrides.clear()
        _current = config
    return config


# -- Uber Fiber's names: ``fiber.config.<key>`` read and set as module attributes ---------
#: Fiber's keys that have a fiberrl setting: reading one gives the value in force, and
#: setting one is :func:`init` of the setting (so ``fiber_config.backend = "docker"``
#: and ``if fiber.config.default_backend != "docker"`` work after the import swap; a
#: backend set so is checked when it is first used, as this module imports none)
FIBER_KEYS = {"backend": "backend", "default_backend": "backend", "image": "image",
              "default_image": "image", "log_level": "log_level", "mem_per_job": "mem",
              "kubernetes_namespace": "k8s_namespace"}
#: Fiber's switches of its own machinery (and its log file): plain attributes here, set
#: to Fiber's defaults, that a Fiber program may set and read back; they change nothing
#: in fiberrl, whose jobs always connect back to their parent, whose one queue gives each
#: item to one reader, and whose logging is the program's own (``log_file`` None)
FIBER_SWITCHES = {"debug": False, "ipc_active": True, "ipc_admin_master_port": 0,
                  "ipc_admin_worker_port": 8000, "use_push_queue": True,
                  "merge_output": False, "use_bash": False, "log_file": None}
globals().update(FIBER_SWITCHES)
#: Fiber's workers per job: 1 here, where every worker is a job of its own; Slurm's
#: ``Pool(workers_per_job=k)`` forks k workers from one job
cpu_per_job = 1


def _fiber_key_value(key: str) -> Any:
    """The value in force of Fiber's config key ``key`` (see :data:`FIBER_KEYS`)."""
    setting = FIBER_KEYS[key]
    if setting == "backend":
        return backend_name()
    if setting == "log_level":   # Fiber's is a number, as ``logging`` has it
        return logging.getLevelName(get_config().log_level.upper())
    if setting == "k8s_namespace":
        return get_config().extra.get("k8s_namespace", "default")
    if key == "default_image":   # the image a container job gets when none is set
        return get_config().image or get_config().extra.get("docker_image") or DEFAULT_IMAGE
    return getattr(get_config(), setting)


def _set_fiber_key(key: str, value: Any) -> None:
    """``fiber_config.<key> = value``: :func:`init` of the fiberrl setting."""
    setting = FIBER_KEYS[key]
    if setting == "log_level" and isinstance(value, int):
        value = logging.getLevelName(value)
    elif setting == "mem" and isinstance(value, int):
        value = f"{value}M"   # Fiber's memory figures are megabytes
    elif setting == "k8s_namespace":
        setting, value = "extra", {**get_config().extra, "k8s_namespace": value}
    init(**{setting: value})


class _ConfigModule(types.ModuleType):
    """This module, which also answers Uber Fiber's ``fiber.config.<key>`` (read and
    set) for the keys fiberrl carries over; the typed settings are :func:`get_config`."""

    def __getattr__(self, name: str) -> Any:
        if name in FIBER_KEYS:
            return _fiber_key_value(name)
        raise AttributeError(f"module {self.__name__!r} has no attribute {name!r}")

    def __reduce__(self) -> Any:
        # as a module is pickled: by name (pickle and cloudpickle find a reducer for
        # ``ModuleType`` by exact type, which this subclass is not)
        import importlib
        return importlib.import_module, (self.__name__,)

    def __setattr__(self, name: str, value: Any) -> None:
        if name in FIBER_KEYS:
            _set_fiber_key(name, value)
        elif name == "cpu_per_job" and value != 1:
            raise ConfigError("Fiber's cpu_per_job (workers per job) is not carried over to "
                              "fiberrl: every worker is a job of its own, and on Slurm "
                              "Pool(workers_per_job=k) forks k workers from one job")
        else:
            super().__setattr__(name, value)


sys.modules[__name__].__class__ = _ConfigModule
