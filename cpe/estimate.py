"""Result types: one :class:`Estimate` per estimator, gathered in a :class:`Report`."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any, Iterator


@dataclass(frozen=True)
class Estimate:
    """An estimator's value for the evaluated policy with its bootstrap uncertainty.

    Attributes:
        value: estimated value of the target policy (expected reward per decision for
            bandit logs, expected discounted return per episode for trajectories).
        stderr: bootstrap standard error (NaN when ``n_bootstrap=0``).
        ci_low: lower end of the percentile bootstrap interval.
        ci_high: upper end of the percentile bootstrap interval.
        normalized: ``value`` divided by the logging policy's observed value (NaN when
            that value is zero).
    """

    value: float
    stderr: float
    ci_low: float
    ci_high: float
    normalized: float

    def to_dict(self) -> dict[str, float]:
        """Plain-dict view of the fields."""
        return asdict(self)


#: numbers smaller than this fraction of the table's scale are floating-point noise
NOISE = 1e-10


def _fmt(x: float, scale: float = 1.0) -> str:
    """Format a number for the text table; a magnitude below ``NOISE * scale`` (e.g. a
    stderr of 2e-15 where the values are about 1) is rounding noise and shows as 0."""
    if math.isnan(x):
        return "nan"
    if abs(x) < NOISE * max(scale, 1e-300):
        return "0"
    return f"{x:.6g}"


class Report(Mapping[str, Estimate]):
    """Read-only mapping from estimator name to :class:`Estimate`, plus context.

    Attributes:
        kind: ``"bandit"`` or ``"trajectories"``.
        n: number of rows (bandit) or episodes (trajectories).
        logged_value: observed value of the logging policy (the normaliser).
        n_bootstrap: number of bootstrap replicates behind the intervals.
        confidence: level of the intervals.
        seed: entropy of the seed sequence used (pass it back to reproduce).
        diagnostics: extra estimator details (e.g. MAGIC blend weights).
    """

    def __init__(
        self,
        estimates: Mapping[str, Estimate],
        *,
        kind: str,
        n: int,
        logged_value: float,
        n_bootstrap: int,
        confidence: float,
        seed: int | None = None,
        diagnostics: Mapping[str, Any] | None = None,
    ) -> None:
        self._estimates = dict(estimates)
        self.kind = kind
        self.n = n
        self.logged_value = logged_value
        self.n_bootstrap = n_bootstrap
        self.confidence = confidence
        self.seed = seed
        self.diagnostics = dict(diagnostics or {})

    def __getitem__(self, name: str) -> Estimate:
        try:
            return self._estimates[name]
        except KeyError:
            raise KeyError(
                f"{name!r} was not estimated; available: {', '.join(self._estimates)}"
            ) from None

    def __iter__(self) -> Iterator[str]:
        return iter(self._estimates)

    def __len__(self) -> int:
        return len(self._estimates)

    def __repr__(self) -> str:
        body = ", ".join(f"{k}={v.value:.6g}" for k, v in self._estimates.items())
        return f"Report(kind={self.kind!r}, n={self.n}, {body})"

    def table(self) -> str:
        """Fixed-width text table of every estimate with its interval."""
        unit = "rows" if self.kind == "bandit" else "episodes"
        level = f"{100 * self.confidence:g}% CI"
        header = ["estimator", "value", "stderr", level, "normalized"]
        rows = []
        values = [abs(v) for est in self._estimates.values()
                  for v in (est.value, est.ci_low, est.ci_high, est.normalized)
                  if math.isfinite(v)]
        scale = max([abs(self.logged_value)] + values) if math.isfinite(self.logged_value) \
            else max(values, default=1.0)
        for name, est in self._estimates.items():
            interval = f"[{_fmt(est.ci_low, scale)}, {_fmt(est.ci_high, scale)}]"
            rows.append([name, _fmt(est.value, scale), _fmt(est.stderr, scale), interval,
                         _fmt(est.normalized, scale)])
        widths = [max(len(r[i]) for r in rows + [header]) for i in range(len(header))]
        lines = [
            f"{self.kind}: {self.n} {unit}, logged policy value {_fmt(self.logged_value)}, "
            f"{self.n_bootstrap} bootstrap replicates",
            "  ".join(h.ljust(w) for h, w in zip(header, widths)).rstrip(),
            "  ".join("-" * w for w in widths),
        ]
        for row in rows:
            lines.append("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip())
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        """Plain-dict view: context fields plus ``estimates`` and ``diagnostics``."""
        return {
            "kind": self.kind,
            "n": self.n,
            "logged_value": self.logged_value,
            "n_bootstrap": self.n_bootstrap,
            "confidence": self.confidence,
            "seed": self.seed,
            "estimates": {k: v.to_dict() for k, v in self._estimates.items()},
            "diagnostics": self.diagnostics,
        }
