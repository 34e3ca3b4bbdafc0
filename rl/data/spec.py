"""The normalization spec: a JSON document saying how to normalize each feature.

::

    {
      "version": 1,
      "field": "state_features",    # the map column the features came from
      "clamp": 6.0,                 # |output| bound of continuous, boxcox, probability
      "features": {
        "3":  {"type": "binary"},
        "4":  {"type": "probability"},
        "5":  {"type": "enum", "values": [2, 5, 7]},
        "6":  {"type": "continuous", "mean": 1.5, "stddev": 0.5},
        "7":  {"type": "boxcox", "lambda": 0.1, "shift": 0.0, "min": 0.01,
               "mean": 0.2, "stddev": 1.3},
        "8":  {"type": "quantile", "quantiles": [0.0, 0.3, ..., 9.5]}
      }
    }

Every feature entry may also hold statistics of its sample (``samples``, ``count``,
``sample_min``, ``sample_max``) and ``overridden: true`` when a user chose its type;
they are informative only. :mod:`rl.data.normalization` documents what each type
computes.
"""
from __future__ import annotations

import json
import logging
import math
from pathlib import Path
from typing import Any, Dict, List, Union

from .output import write_json_atomic
from .schema import feature_sort_key

logger = logging.getLogger(__name__)

SPEC_VERSION = 1
DEFAULT_CLAMP = 6.0
FEATURE_TYPES = ("binary", "probability", "enum", "continuous", "boxcox", "quantile")
_REQUIRED = {"binary": (), "probability": (), "enum": ("values",),
             "continuous": ("mean", "stddev"),
             "boxcox": ("lambda", "shift", "min", "mean", "stddev"), "quantile": ("quantiles",)}


def _finite(value: Any, where: str) -> float:
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value):
        raise ValueError(f"{where} must be a finite number, got {value!r}")
    return float(value)


def validate_spec(spec: Dict[str, Any]) -> Dict[str, Any]:
    """Check a spec's structure and parameters; returns it. Raises ValueError naming
    the feature and parameter at fault."""
    if not isinstance(spec, dict) or spec.get("version") != SPEC_VERSION:
        raise ValueError(f"not a normalization spec of version {SPEC_VERSION}")
    _finite(spec.get("clamp", DEFAULT_CLAMP), "clamp")
    features = spec.get("features")
    if not isinstance(features, dict):
        raise ValueError("spec['features'] must be an object of feature id -> parameters")
    for feature, params in features.items():
        where = f"feature {feature!r}"
        kind = params.get("type") if isinstance(params, dict) else None
        if kind not in FEATURE_TYPES:
            raise ValueError(f"{where}: type must be one of {', '.join(FEATURE_TYPES)}, "
                             f"got {kind!r}")
        for name in _REQUIRED[kind]:
            if name not in params:
                raise ValueError(f"{where}: a {kind} feature needs {name!r}")
        if kind in ("continuous", "boxcox"):
            if _finite(params["stddev"], f"{where} stddev") <= 0:
                raise ValueError(f"{where}: stddev must be positive")
            for name in _REQUIRED[kind]:
                _finite(params[name], f"{where} {name}")
        if kind == "enum" and (not isinstance(params["values"], list) or not params["values"]):
            raise ValueError(f"{where}: enum values must be a non-empty list")
        if kind == "quantile":
            bounds = [_finite(b, f"{where} quantiles") for b in params["quantiles"]]
            if len(bounds) < 2 or any(b > a for b, a in zip(bounds, bounds[1:])):
                raise ValueError(f"{where}: quantiles must be at least 2 sorted boundaries")
    return spec


def spec_features(spec: Dict[str, Any]) -> List[str]:
    """The spec's feature ids, integer ids first in numeric order."""
    return sorted(spec["features"], key=feature_sort_key)


def save_spec(spec: Dict[str, Any], path: Union[str, Path]) -> None:
    """Validate ``spec`` and write it to ``path`` atomically."""
    write_json_atomic(path, validate_spec(spec))


def load_spec(path: Union[str, Path]) -> Dict[str, Any]:
    """Read and validate a spec file."""
    with open(path, encoding="utf-8") as handle:
        try:
            spec = json.load(handle)
        except json.JSONDecodeError as error:
            raise ValueError(f"{path}: invalid JSON ({error})") from None
    try:
        return validate_spec(spec)
    except ValueError as error:
        raise ValueError(f"{path}: {error}") from None
