"""Feature identification: Horizon's Algorithm 1 (Gauci et al. 2018, "Horizon:
Facebook's Open Source Applied Reinforcement Learning Platform", section 4.1).

Each feature's sample (its present values; missing ones never count) is typed by
the first rule that holds:

1. **binary**: every value is 0 or 1;
2. **probability**: every value is in [0, 1];
3. **enum**: every value is an integer and there are at most ``max_enum_values``
   distinct ones (default 10);
4. **continuous**: the values are approximately normal: ``|skewness| <= max_skew``
   (0.5) and ``|excess kurtosis| <= max_kurtosis`` (1.0). Moment thresholds are used
   rather than a normality test's p-value, which rejects nearly everything on
   samples of thousands;
5. **boxcox**: approximately normal after a Box-Cox transform
   ``((x + shift) ** lambda - 1) / lambda`` (``log`` at lambda 0), lambda by
   maximum likelihood (``scipy.stats.boxcox``); ``shift`` is 0 for positive samples,
   else ``-min + 1%`` of the range;
6. **quantile** otherwise: ``quantiles + 1`` boundaries (default 20 intervals).

Rules 1-3 only look at the set of values. With fewer than ``min_samples`` values
(default 20) the statistical rules 4-6 are skipped: such a feature is
``continuous`` (mean 0 and stddev 1 below 2 values), with a warning. A user
override names the type of a feature; its parameters are then computed for that
type whatever the data looks like.

Parameters, by type: enum ``values`` (sorted distinct values); continuous ``mean`` and
``stddev`` (population, 1.0 when the sample is constant); boxcox ``lambda``,
``shift``, ``min`` and the ``mean``/``stddev`` of the transformed sample; quantile
``quantiles``. See :mod:`rl.data.spec` for the JSON layout.
"""
from __future__ import annotations

import dataclasses
import logging
from typing import Any, Dict, Mapping, Optional, Tuple

import numpy as np

from .spec import DEFAULT_CLAMP, FEATURE_TYPES, SPEC_VERSION, validate_spec
from .schema import feature_sort_key

logger = logging.getLogger(__name__)

MIN_STDDEV = 1e-8


@dataclasses.dataclass(frozen=True)
class IdentifyOptions:
    """Thresholds of the identification rules (see the module docstring)."""

    max_enum_values: int = 10    #: at most this many distinct integers make an enum
    max_skew: float = 0.5        #: |skewness| bound of "approximately normal"
    max_kurtosis: float = 1.0    #: |excess kurtosis| bound of "approximately normal"
    quantiles: int = 20          #: intervals of a quantile feature
    min_samples: int = 20        #: fewer values: not identified (continuous)
    clamp: float = DEFAULT_CLAMP  #: output bound written into the spec


def moments(values: np.ndarray) -> Tuple[float, float]:
    """``(skewness, excess kurtosis)`` of ``values`` (0, 0 for a constant sample)."""
    values = np.asarray(values, dtype=np.float64)
    centered = values - values.mean()
    variance = np.mean(centered ** 2)
    if variance <= MIN_STDDEV ** 2:
        return 0.0, 0.0
    skew = np.mean(centered ** 3) / variance ** 1.5
    kurtosis = np.mean(centered ** 4) / variance ** 2 - 3.0
    return float(skew), float(kurtosis)


def _normal_enough(values: np.ndarray, options: IdentifyOptions) -> bool:
    skew, kurtosis = moments(values)
    return abs(skew) <= options.max_skew and abs(kurtosis) <= options.max_kurtosis


def boxcox_fit(values: np.ndarray) -> Tuple[np.ndarray, float, float]:
    """``(transformed, lambda, shift)`` of the Box-Cox fit of ``values``."""
    from scipy import stats
    low, high = float(values.min()), float(values.max())
    shift = 0.0 if low > 0 else -low + (0.01 * (high - low) or 1.0)
    with np.errstate(all="ignore"):
        transformed, lam = stats.boxcox(values + shift)
    return np.asarray(transformed, dtype=np.float64), float(lam), shift


def identify_type(values: np.ndarray, options: IdentifyOptions = IdentifyOptions()) -> str:
    """The type of a feature from its (non-empty) sample (Algorithm 1; module docstring)."""
    values = np.asarray(values, dtype=np.float64)
    if len(values) == 0:
        raise ValueError("cannot identify a feature without values")
    if np.all((values == 0.0) | (values == 1.0)):
        return "binary"
    if np.all((values >= 0.0) & (values <= 1.0)):
        return "probability"
    if np.all(values == np.round(values)) and len(np.unique(values)) <= options.max_enum_values:
        return "enum"
    if len(values) < options.min_samples:
        return "continuous"
    if _normal_enough(values, options):
        return "continuous"
    if np.ptp(values) > MIN_STDDEV:
        try:
            transformed, _, _ = boxcox_fit(values)
        except (ValueError, FloatingPointError) as error:
            logger.debug("Box-Cox fit failed: %s", error)
        else:
            if np.all(np.isfinite(transformed)) and _normal_enough(transformed, options):
                return "boxcox"
    return "quantile"


def _scale(values: np.ndarray) -> Dict[str, float]:
    stddev = float(np.std(values))
    return {"mean": float(np.mean(values)), "stddev": stddev if stddev > MIN_STDDEV else 1.0}


def feature_parameters(values: np.ndarray, kind: str,
                       options: IdentifyOptions = IdentifyOptions()) -> Dict[str, Any]:
    """The spec entry of a feature of type ``kind`` from its sample."""
    values = np.asarray(values, dtype=np.float64)
    params: Dict[str, Any] = {"type": kind}
    if kind == "enum":
        distinct = np.unique(values)
        if len(distinct) > 1000:
            raise ValueError(f"an enum feature with {len(distinct)} distinct values; at most 1000")
        params["values"] = [int(v) if v == round(v) else float(v) for v in distinct]
    elif kind == "continuous":
        params.update(_scale(values) if len(values) >= 2 else {"mean": 0.0, "stddev": 1.0})
    elif kind == "boxcox":
        if np.ptp(values) <= MIN_STDDEV:
            raise ValueError("a boxcox feature needs a sample that is not constant")
        transformed, lam, shift = boxcox_fit(values)
        params.update({"lambda": lam, "shift": shift, "min": float(values.min())})
        params.update(_scale(transformed))
    elif kind == "quantile":
        levels = np.linspace(0.0, 1.0, options.quantiles + 1)
        params["quantiles"] = [float(q) for q in np.quantile(values, levels)]
    elif kind not in ("binary", "probability"):
        raise ValueError(f"unknown feature type {kind!r}; one of {', '.join(FEATURE_TYPES)}")
    return params


def identify_features(samples: Mapping[str, np.ndarray],
                      overrides: Optional[Mapping[str, str]] = None,
                      counts: Optional[Mapping[str, int]] = None,
                      options: IdentifyOptions = IdentifyOptions(),
                      field: str = "state_features") -> Dict[str, Any]:
    """The normalization spec of every sampled feature.

    ``samples`` maps feature id -> sample of its present values; ``overrides`` maps
    feature id -> type and always wins (an override naming a feature without a
    sample is an error); ``counts`` (values seen, before sampling) is recorded.
    """
    overrides = {str(k): v for k, v in (overrides or {}).items()}
    unknown = sorted(set(overrides) - set(map(str, samples)), key=feature_sort_key)
    if unknown:
        raise ValueError(f"overrides name features without data: {unknown}")
    bad = {k: v for k, v in overrides.items() if v not in FEATURE_TYPES}
    if bad:
        raise ValueError(f"override types must be one of {', '.join(FEATURE_TYPES)}: {bad}")
    features: Dict[str, Any] = {}
    for feature in sorted(map(str, samples), key=feature_sort_key):
        values = np.asarray(samples[feature], dtype=np.float64)
        if feature in overrides:
            kind = overrides[feature]
        elif len(values) == 0:
            kind = "continuous"
        else:
            kind = identify_type(values, options)
            if kind == "continuous" and len(values) < options.min_samples:
                logger.warning("feature %s: %d values (< %d), too few to test normality; "
                               "continuous", feature, len(values), options.min_samples)
        params = feature_parameters(values, kind, options)
        if feature in overrides:
            params["overridden"] = True
        params["samples"] = int(len(values))
        if counts is not None and feature in counts:
            params["count"] = int(counts[feature])
        if len(values):
            params["sample_min"], params["sample_max"] = float(values.min()), float(values.max())
        features[feature] = params
        logger.info("feature %s: %s", feature, kind)
    return validate_spec({"version": SPEC_VERSION, "field": field, "clamp": options.clamp,
                          "features": features})
