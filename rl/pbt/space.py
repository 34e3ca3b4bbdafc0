"""Search spaces of population-based training: what values each hyperparameter may
take, how a member's first values are drawn, and how PBT's *explore* step moves them.

A space maps setting names to :class:`Param` objects, written on the command line
as ``--search KEY=SPEC``:

    loguniform:LOW:HIGH   a float, log-uniform on [LOW, HIGH] (0 < LOW < HIGH)
    uniform:LOW:HIGH      a float, uniform on [LOW, HIGH]
    int:LOW:HIGH          an integer, uniform on LOW..HIGH inclusive
    choice:V1,V2,...      one of the values (numbers, true/false or words), kept in order

Explore (Jaderberg et al. 2017, "Population Based Training of Neural Networks",
arXiv:1711.09846, section 3: *perturb*, or *resample* with some probability): each
value is drawn afresh from its distribution with probability ``resample_probability``;
otherwise a number is multiplied by 0.8 or 1.2 (an integer moves by at least 1) and a
choice moves to a neighbouring value. Every result is clipped into its range, so
explore never leaves the space.

Only settings that take effect while a learner runs may be searched (``SEARCHABLE``):
exploit hands a member another member's weights, so the network's shape, and PPO's
rollout length (which fixes the collector), must be the same for everyone.
"""
from __future__ import annotations

import json
import logging
import math
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, Dict, Mapping, Sequence, Tuple

import numpy as np

logger = logging.getLogger(__name__)

PERTURB_FACTORS = (0.8, 1.2)

# What a searchable setting may be (checked against a space's bounds before any work).
POSITIVE, NON_NEGATIVE, UNIT, COUNT = "> 0", ">= 0", "in [0, 1]", "an integer >= 1"
_VALID = {
    POSITIVE: lambda v: isinstance(v, (int, float)) and v > 0,
    NON_NEGATIVE: lambda v: isinstance(v, (int, float)) and v >= 0,
    UNIT: lambda v: isinstance(v, (int, float)) and 0 <= v <= 1,
    COUNT: lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 1,
}

_PPO = {"lr": POSITIVE, "gamma": UNIT, "gae_lambda": UNIT, "clip": POSITIVE,
        "vf_coef": NON_NEGATIVE, "ent_coef": NON_NEGATIVE, "max_grad_norm": POSITIVE,
        "num_epochs": COUNT, "minibatch_size": COUNT, "reward_scale": POSITIVE}
# DQN's gamma is fixed in its replay buffer's n-step sums, so it is not searchable.
_DQN = {"lr": POSITIVE, "tau": UNIT, "target_update_every": COUNT, "train_every": COUNT,
        "gradient_steps": COUNT, "minibatch_size": COUNT, "epsilon_end": UNIT,
        "max_grad_norm": POSITIVE}
_TD3 = {"lr": POSITIVE, "actor_lr": POSITIVE, "critic_lr": POSITIVE, "gamma": UNIT,
        "tau": UNIT, "exploration_noise": NON_NEGATIVE, "policy_noise": NON_NEGATIVE,
        "noise_clip": NON_NEGATIVE, "batch_size": COUNT, "updates_per_step": POSITIVE,
        "policy_delay": COUNT, "max_grad_norm": POSITIVE}
#: algorithm -> the settings PBT may change while a member runs, with what each must be
SEARCHABLE: Dict[str, Dict[str, str]] = {"ppo": _PPO, "dqn": _DQN, "parametric_dqn": _DQN,
                                         "td3": _TD3, "ddpg": _TD3}


class Param(ABC):
    """One hyperparameter's distribution (see the module docstring)."""

    @abstractmethod
    def sample(self, rng: np.random.Generator) -> Any:
        """A value drawn from the distribution."""

    @abstractmethod
    def perturb(self, value: Any, rng: np.random.Generator) -> Any:
        """``value`` moved a little (x0.8 / x1.2, or to a neighbour), inside the space."""

    @abstractmethod
    def contains(self, value: Any) -> bool:
        """True when ``value`` lies in the space."""

    @abstractmethod
    def bounds(self) -> Tuple[Any, ...]:
        """The values that limit the space (its ends, or every choice)."""

    @abstractmethod
    def spec(self) -> str:
        """The ``--search`` text of this distribution."""


@dataclass(frozen=True)
class _FloatRange(Param):
    """A float on ``[low, high]``; perturbing scales it and clips it to the range."""

    low: float
    high: float

    def perturb(self, value: Any, rng: np.random.Generator) -> float:
        return float(min(self.high, max(self.low, value * rng.choice(PERTURB_FACTORS))))

    def contains(self, value: Any) -> bool:
        return isinstance(value, (int, float)) and self.low <= value <= self.high

    def bounds(self) -> Tuple[Any, ...]:
        return (self.low, self.high)


@dataclass(frozen=True)
class LogUniform(_FloatRange):
    """A float, log-uniform on ``[low, high]``."""

    def __post_init__(self) -> None:
        if not 0 < self.low < self.high or not math.isfinite(self.high):
            raise ValueError(f"loguniform needs 0 < LOW < HIGH, got {self.low:g}:{self.high:g}")

    def sample(self, rng: np.random.Generator) -> float:
        return float(math.exp(rng.uniform(math.log(self.low), math.log(self.high))))

    def spec(self) -> str:
        return f"loguniform:{self.low!r}:{self.high!r}"


@dataclass(frozen=True)
class Uniform(_FloatRange):
    """A float, uniform on ``[low, high]``."""

    def __post_init__(self) -> None:
        if not self.low < self.high or not (math.isfinite(self.low) and math.isfinite(self.high)):
            raise ValueError(f"uniform needs LOW < HIGH, got {self.low:g}:{self.high:g}")

    def sample(self, rng: np.random.Generator) -> float:
        return float(rng.uniform(self.low, self.high))

    def spec(self) -> str:
        return f"uniform:{self.low!r}:{self.high!r}"


@dataclass(frozen=True)
class IntRange(Param):
    """An integer, uniform on ``low..high`` inclusive; perturbing moves it by at least 1."""

    low: int
    high: int

    def __post_init__(self) -> None:
        if not self.low < self.high:
            raise ValueError(f"int needs LOW < HIGH, got {self.low}:{self.high}")

    def sample(self, rng: np.random.Generator) -> int:
        return int(rng.integers(self.low, self.high + 1))

    def perturb(self, value: Any, rng: np.random.Generator) -> int:
        factor = rng.choice(PERTURB_FACTORS)
        moved = int(round(value * factor))
        if moved == value:
            moved = value + (1 if factor > 1 else -1)
        return int(min(self.high, max(self.low, moved)))

    def contains(self, value: Any) -> bool:
        return (isinstance(value, int) and not isinstance(value, bool)
                and self.low <= value <= self.high)

    def bounds(self) -> Tuple[Any, ...]:
        return (self.low, self.high)

    def spec(self) -> str:
        return f"int:{self.low}:{self.high}"


@dataclass(frozen=True)
class Choice(Param):
    """One of ``values``; perturbing moves to a neighbour in the given order."""

    values: Tuple[Any, ...]

    def __post_init__(self) -> None:
        if len(self.values) < 2:
            raise ValueError("choice needs at least two values")
        if len(set(map(repr, self.values))) != len(self.values):
            raise ValueError(f"choice values must differ, got {list(self.values)}")

    def sample(self, rng: np.random.Generator) -> Any:
        return self.values[int(rng.integers(len(self.values)))]

    def perturb(self, value: Any, rng: np.random.Generator) -> Any:
        if value not in self.values:
            return self.sample(rng)
        at = self.values.index(value) + (1 if rng.random() < 0.5 else -1)
        return self.values[min(len(self.values) - 1, max(0, at))]

    def contains(self, value: Any) -> bool:
        return value in self.values

    def bounds(self) -> Tuple[Any, ...]:
        return tuple(self.values)

    def spec(self) -> str:
        return "choice:" + ",".join(json.dumps(v) if not isinstance(v, str) else v
                                    for v in self.values)


SearchSpace = Dict[str, Param]


def _number(text: str, what: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise ValueError(f"{what} must be a number, got {text!r}") from None


def _integer(text: str, what: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"{what} must be an integer, got {text!r}") from None


def _choice_value(text: str) -> Any:
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        return text
    return value if isinstance(value, (int, float, bool, str)) else text


def parse_param(spec: str) -> Param:
    """A :class:`Param` from its ``--search`` text; ``ValueError`` saying what is wrong."""
    kind, _, rest = spec.partition(":")
    kinds = "loguniform:LOW:HIGH, uniform:LOW:HIGH, int:LOW:HIGH or choice:V1,V2,..."
    if kind in ("loguniform", "uniform", "int"):
        parts = rest.split(":")
        if len(parts) != 2 or not all(parts):
            example = "1e-5:3e-3" if kind == "loguniform" else "1:10"
            raise ValueError(f"{kind} takes LOW:HIGH (e.g. {kind}:{example})")
        if kind == "int":
            return IntRange(_integer(parts[0], "LOW"), _integer(parts[1], "HIGH"))
        low, high = _number(parts[0], "LOW"), _number(parts[1], "HIGH")
        return LogUniform(low, high) if kind == "loguniform" else Uniform(low, high)
    if kind == "choice":
        values = [v for v in rest.split(",")]
        if not all(v.strip() for v in values):
            raise ValueError("choice takes V1,V2,... (e.g. choice:0.9,0.95,0.99)")
        return Choice(tuple(_choice_value(v.strip()) for v in values))
    raise ValueError(f"unknown distribution {kind!r}; use {kinds}")


def parse_search(items: Sequence[str]) -> SearchSpace:
    """``["lr=loguniform:1e-5:3e-3", ...]`` as a space (a key given twice is an error)."""
    space: SearchSpace = {}
    for item in items:
        key, sep, spec = item.partition("=")
        if not sep or not key or not spec:
            raise ValueError(f"--search takes KEY=SPEC (e.g. lr=loguniform:1e-5:3e-3), got "
                             f"{item!r}")
        if key in space:
            raise ValueError(f"--search {key} is given twice")
        try:
            space[key] = parse_param(spec)
        except ValueError as error:
            raise ValueError(f"--search {item}: {error}") from None
    return space


def check_space(algo: str, space: Mapping[str, Param], defaults: Mapping[str, Any]) -> None:
    """Refuse a space ``algo`` cannot run: a key that cannot change while a member runs,
    an integer setting given a float range, or a bound outside what the setting may be."""
    searchable = SEARCHABLE.get(algo)
    if searchable is None:
        raise ValueError(f"{algo} cannot train as a population (step-driven algorithms can: "
                         f"{', '.join(sorted(SEARCHABLE))})")
    for key, param in space.items():
        if key not in searchable:
            raise ValueError(f"--search {key}: {algo} cannot change {key!r} while it trains; "
                             f"searchable: {', '.join(sorted(searchable))}")
        wanted = searchable[key]
        integer = wanted == COUNT or (isinstance(defaults.get(key), int)
                                      and not isinstance(defaults.get(key), bool))
        if integer and isinstance(param, (LogUniform, Uniform)):
            raise ValueError(f"--search {key}={param.spec()}: {key} is an integer; use "
                             f"int:LOW:HIGH or choice:...")
        bad = [v for v in param.bounds() if not _VALID[wanted](v)]
        if bad:
            raise ValueError(f"--search {key}={param.spec()}: {key} must be {wanted}, got "
                             f"{', '.join(map(str, bad))}")


def sample(space: Mapping[str, Param], rng: np.random.Generator) -> Dict[str, Any]:
    """One member's first values: each drawn from its distribution."""
    return {key: param.sample(rng) for key, param in space.items()}


def explore(values: Mapping[str, Any], space: Mapping[str, Param], rng: np.random.Generator,
            resample_probability: float) -> Dict[str, Any]:
    """PBT's explore: every searched value resampled (probability ``resample_probability``)
    or perturbed; settings outside the space are kept as they are."""
    new = dict(values)
    for key, param in space.items():
        if rng.random() < resample_probability or key not in values:
            new[key] = param.sample(rng)
        else:
            new[key] = param.perturb(values[key], rng)
    return new


def default_space(algo: str, discrete: bool) -> SearchSpace:
    """The space a population searches when ``--search`` names none.

    PPO: the step size (the setting that decides most on Pendulum-v1, 2.5e-4 to 1e-3
    turned -1,082 into -285 at 100k steps in our runs), the discount and GAE's lambda as
    the few values people use, the clip range, the entropy bonus and the epochs per batch.
    DQN: step size, target-network period, env steps per training round. TD3/DDPG: step
    size, Polyak factor, exploration noise, discount.
    """
    if algo == "ppo":
        gammas = (0.95, 0.98, 0.99, 0.995) if discrete else (0.9, 0.95, 0.98, 0.99)
        return {"lr": LogUniform(1e-4, 3e-3), "gamma": Choice(gammas),
                "gae_lambda": Choice((0.8, 0.9, 0.95, 0.98)), "clip": Uniform(0.1, 0.3),
                "ent_coef": Choice((0.0, 1e-4, 1e-3, 1e-2)), "num_epochs": IntRange(4, 15)}
    if algo in ("dqn", "parametric_dqn"):
        return {"lr": LogUniform(1e-4, 2e-3), "target_update_every": IntRange(250, 2000),
                "train_every": Choice((1, 2, 4, 8))}
    if algo in ("td3", "ddpg"):
        return {"lr": LogUniform(1e-4, 3e-3), "tau": LogUniform(1e-3, 2e-2),
                "exploration_noise": Uniform(0.05, 0.3), "gamma": Choice((0.95, 0.98, 0.99))}
    raise ValueError(f"{algo} has no search space (step-driven algorithms: "
                     f"{', '.join(sorted(SEARCHABLE))})")


def describe(space: Mapping[str, Param]) -> Dict[str, str]:
    """The space as ``{key: spec}`` (what summary.json and population.json keep)."""
    return {key: param.spec() for key, param in space.items()}
