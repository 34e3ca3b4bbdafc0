"""Feature normalization inside the model: a PyTorch module built from a spec.

``FeatureNormalizer(spec, features)(values, presence)`` takes raw features
``values: float [B, F]`` in the order of ``features`` (default: the spec's ids,
integer ids numerically first) and ``presence: bool [B, F]`` (None: all present),
and returns ``float32 [B, D]``.

Output layout: the features in input order, each taking one column, except an
enum feature, which takes one column per enum value (in the spec's order);
:attr:`FeatureNormalizer.output_names` names the columns (``"7"``, or ``"5=2"`` for
enum value 2 of feature 5). Per type, with ``c`` the spec's ``clamp`` (default 6):

==============  ============================================================  ==========
type            output                                                        range
==============  ============================================================  ==========
binary          1 if the value is non-zero, else 0                            {0, 1}
probability     logit ``log(p / (1 - p))``, p clipped to [1e-5, 1 - 1e-5]     [-c, c]
enum            one-hot over the enum values (unknown value: all zeros)       {0, 1}
continuous      ``(x - mean) / stddev``                                       [-c, c]
boxcox          ``x`` raised to the training ``min`` if below it, then
                ``(((x + shift) ** lambda - 1) / lambda - mean) / stddev``
                (``log(x + shift)`` when lambda is 0)                         [-c, c]
quantile        piecewise-linear position among the quantile boundaries      [0, 1]
==============  ============================================================  ==========

A missing feature (presence False) outputs 0 in each of its columns, whatever its
value holds (NaN included); present values must be finite. The features of one type
are processed together as one batch of tensor operations (index tensors built once,
no per-feature Python loop in ``forward``), and the module works under
``torch.jit.script``.
"""
import logging
from typing import Any, Dict, List, Optional, Sequence

import torch

from .spec import DEFAULT_CLAMP, spec_features, validate_spec

logger = logging.getLogger(__name__)

PROBABILITY_EPS = 1e-5
_BLOCKS = ("binary", "probability", "continuous", "boxcox", "quantile", "enum")


def _floats(values: Sequence[float]) -> torch.Tensor:
    return torch.tensor([float(v) for v in values], dtype=torch.float32)


def _longs(values: Sequence[int]) -> torch.Tensor:
    return torch.tensor([int(v) for v in values], dtype=torch.long)


class FeatureNormalizer(torch.nn.Module):
    """Applies a normalization spec to raw features in the forward pass."""

    features: List[str]
    output_names: List[str]
    __jit_unused_properties__ = ["output_dim"]

    def __init__(self, spec: Dict[str, Any], features: Optional[Sequence[str]] = None) -> None:
        """``spec``: a normalization spec (:mod:`rl.data.spec`); ``features``: the ids of
        the input columns, in order (default: every spec feature, integer ids first)."""
        super().__init__()
        validate_spec(spec)
        self.features = ([str(f) for f in features] if features is not None
                                    else spec_features(spec))
        if not self.features:
            raise ValueError("a FeatureNormalizer needs at least one feature")
        missing = [f for f in self.features if f not in spec["features"]]
        if missing:
            raise ValueError(f"features without an entry in the spec: {missing}")
        self.clamp = float(spec.get("clamp", DEFAULT_CLAMP))
        self.eps = PROBABILITY_EPS
        params = [spec["features"][f] for f in self.features]
        columns: Dict[str, List[int]] = {kind: [] for kind in _BLOCKS}
        for column, p in enumerate(params):
            if p["type"] == "enum":
                columns["enum"].extend([column] * len(p["values"]))
            else:
                columns[p["type"]].append(column)
        of = {kind: [params[c] for c in columns[kind]] for kind in _BLOCKS}
        self.n_binary = len(columns["binary"])
        self.n_probability = len(columns["probability"])
        self.n_continuous = len(columns["continuous"])
        self.n_boxcox = len(columns["boxcox"])
        self.n_quantile = len(columns["quantile"])
        self.n_enum = len(columns["enum"])
        for kind in _BLOCKS:
            self.register_buffer(f"{kind}_index", _longs(columns[kind]))
        self.register_buffer("continuous_mean", _floats([p["mean"] for p in of["continuous"]]))
        self.register_buffer("continuous_stddev", _floats([p["stddev"] for p in of["continuous"]]))
        for name in ("lambda", "shift", "min", "mean", "stddev"):
            self.register_buffer(f"boxcox_{name}", _floats([p[name] for p in of["boxcox"]]))
        width = max([len(p["quantiles"]) for p in of["quantile"]] or [2])
        bounds = [p["quantiles"] + [p["quantiles"][-1]] * (width - len(p["quantiles"]))
                  for p in of["quantile"]]
        self.register_buffer("quantile_bounds", torch.tensor(bounds, dtype=torch.float32)
                             .reshape(len(bounds), width))
        self.register_buffer("quantile_intervals",
                             _longs([len(p["quantiles"]) - 1 for p in of["quantile"]]))
        enum_values: List[float] = []
        for column in sorted(set(columns["enum"])):
            enum_values.extend(float(v) for v in params[column]["values"])
        self.register_buffer("enum_value", _floats(enum_values))
        # block columns come out in _BLOCKS order; `order` puts them in output order
        position: Dict[int, List[int]] = {}
        block_column = 0
        for kind in _BLOCKS:
            for column in columns[kind]:
                position.setdefault(column, []).append(block_column)
                block_column += 1
        self.output_names = []
        order: List[int] = []
        for column, feature in enumerate(self.features):
            order.extend(position[column])
            if params[column]["type"] == "enum":
                self.output_names.extend(f"{feature}={v}" for v in params[column]["values"])
            else:
                self.output_names.append(feature)
        self.register_buffer("order", _longs(order))

    @property
    def output_dim(self) -> int:
        """Width ``D`` of the output."""
        return len(self.output_names)

    def forward(self, values: torch.Tensor,
                presence: Optional[torch.Tensor] = None) -> torch.Tensor:
        """Normalized features ``float32 [B, D]`` of raw ``values [B, F]``."""
        x = values.to(torch.float32)
        if presence is None:
            present = torch.ones_like(x, dtype=torch.bool)
        else:
            present = presence.to(torch.bool)
        c = self.clamp
        blocks: List[torch.Tensor] = []
        masks: List[torch.Tensor] = []
        if self.n_binary > 0:
            v = x.index_select(1, self.binary_index)
            blocks.append((v != 0.0).to(torch.float32))
            masks.append(present.index_select(1, self.binary_index))
        if self.n_probability > 0:
            p = x.index_select(1, self.probability_index).clamp(self.eps, 1.0 - self.eps)
            blocks.append((torch.log(p) - torch.log1p(-p)).clamp(-c, c))
            masks.append(present.index_select(1, self.probability_index))
        if self.n_continuous > 0:
            v = x.index_select(1, self.continuous_index)
            blocks.append(((v - self.continuous_mean) / self.continuous_stddev).clamp(-c, c))
            masks.append(present.index_select(1, self.continuous_index))
        if self.n_boxcox > 0:
            v = x.index_select(1, self.boxcox_index)
            z = (torch.maximum(v, self.boxcox_min) + self.boxcox_shift).clamp(min=1e-30)
            small = self.boxcox_lambda.abs() < 1e-6
            lam = torch.where(small, torch.ones_like(self.boxcox_lambda), self.boxcox_lambda)
            y = torch.where(small, torch.log(z), (torch.pow(z, lam) - 1.0) / lam)
            blocks.append(((y - self.boxcox_mean) / self.boxcox_stddev).clamp(-c, c))
            masks.append(present.index_select(1, self.boxcox_index))
        if self.n_quantile > 0:
            q = x.index_select(1, self.quantile_index).t().contiguous()
            bounds = self.quantile_bounds
            # the count of boundaries <= q (searchsorted(right=True), which ONNX lacks)
            j = (bounds.unsqueeze(1) <= q.unsqueeze(2)).sum(dim=2) - 1
            j = torch.minimum(j.clamp(min=0), (self.quantile_intervals - 1).unsqueeze(1))
            low = bounds.gather(1, j)
            width = bounds.gather(1, j + 1) - low
            safe = torch.where(width > 0, width, torch.ones_like(width))
            frac = torch.where(width > 0, (q - low) / safe, torch.ones_like(q)).clamp(0.0, 1.0)
            intervals = self.quantile_intervals.to(torch.float32).unsqueeze(1)
            level = (j.to(torch.float32) + frac) / intervals
            blocks.append(level.clamp(0.0, 1.0).t())
            masks.append(present.index_select(1, self.quantile_index))
        if self.n_enum > 0:
            v = x.index_select(1, self.enum_index)
            blocks.append((v == self.enum_value).to(torch.float32))
            masks.append(present.index_select(1, self.enum_index))
        out = torch.cat(blocks, dim=1).index_select(1, self.order)
        mask = torch.cat(masks, dim=1).index_select(1, self.order)
        return torch.where(mask, out, torch.zeros_like(out))
