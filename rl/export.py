"""Export a trained model as one self-contained file for serving: TorchScript or ONNX.

An exported module takes *raw* features, normalizes them with the model's
:class:`~rl.data.normalization.FeatureNormalizer` and scores them, all in one
forward pass, so a server needs nothing but the file::

    raw values [B, F], presence [B, F] --normalizer--> state [B, D] --scorer--> ...

Three kinds, one per family of policies (B rows, F raw features, A actions)::

    ExportedPolicy            discrete actions (DQN)
        (values, presence, temperature) -> (scores [B, A], action [B], propensities [B, A])
    ExportedParametricPolicy  actions described by k features (parametric DQN)
        (values, presence, action_features [B, A, k], action_mask [B, A], temperature)
        -> (scores [B, A], action [B], propensities [B, A]), masked actions scoring -inf
    ExportedActor             continuous actions (DDPG, TD3 actors)
        (values, presence) -> action [B, k]

:func:`export_torchscript` and :func:`export_onnx` write a module with its
metadata (kind, feature ids in input order, action names, input and output names,
fiberrl version) inside the file; :func:`rl.serving.load` reads either back.
The ONNX path uses the ``torch.export``-based exporter and needs the ``export``
extra (``onnx``, ``onnxscript``; ``onnxruntime`` to serve).
"""
import contextlib
from abc import ABC, abstractmethod
import importlib
import json
import logging
import math
import warnings
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

import torch
from torch import nn

logger = logging.getLogger(__name__)

FORMAT_VERSION = 1
METADATA_KEY = "fiberrl"
"""Name of the metadata entry: ONNX ``metadata_props`` key; TorchScript extra file
``fiberrl.json``."""
TORCHSCRIPT_METADATA_FILE = METADATA_KEY + ".json"
DEFAULT_OPSET = 18
_EXTRA_HINT = "pip install 'fiberrl[export]'"


class MaskedIdentity(nn.Module):
    """The preprocessor of a model without normalization: raw values pass through,
    absent ones (presence False) become 0."""

    features: List[str]
    output_names: List[str]

    def __init__(self, features: Sequence[str]) -> None:
        """``features``: the ids of the input columns, in order."""
        super().__init__()
        self.features = [str(f) for f in features]
        if not self.features:
            raise ValueError("a model needs at least one input feature")
        self.output_names = list(self.features)

    def forward(self, values: torch.Tensor, presence: torch.Tensor) -> torch.Tensor:
        """``values [B, F]`` as float32 with absent entries set to 0."""
        x = values.to(torch.float32)
        return torch.where(presence.to(torch.bool), x, torch.zeros_like(x))


def _preprocessor(normalizer: Optional[nn.Module], features: Optional[Sequence[str]]) -> nn.Module:
    if normalizer is None:
        if features is None:
            raise ValueError("without a normalizer, give the input feature ids as `features`")
        return MaskedIdentity(features)
    ids = getattr(normalizer, "features", None)
    if ids is None or not hasattr(normalizer, "output_names"):
        raise TypeError("normalizer must be a FeatureNormalizer (with `features` and "
                        f"`output_names`), got {type(normalizer).__name__}")
    if features is not None and [str(f) for f in features] != list(ids):
        raise ValueError(f"features {list(features)} differ from the normalizer's {list(ids)}")
    return normalizer


def _names(names: Sequence[str], what: str) -> List[str]:
    out = [str(n) for n in names]
    if not out:
        raise ValueError(f"{what} must not be empty")
    duplicates = sorted({n for n in out if out.count(n) > 1})
    if duplicates:
        raise ValueError(f"{what} must be unique, repeated: {duplicates}")
    return out


def _shifted_softmax(scores: torch.Tensor, temperature: torch.Tensor) -> torch.Tensor:
    # softmax((s - max s) / T) equals softmax(s / T) but cannot overflow for tiny T
    top = scores.max(dim=1, keepdim=True).values
    return torch.softmax((scores - top) / temperature, dim=1)


class _Exported(nn.Module, ABC):
    """What every exported module shares: the preprocessor and the description."""

    kind = ""
    input_names: Tuple[str, ...] = ()
    output_names: Tuple[str, ...] = ()
    features: List[str]

    def __init__(self, normalizer: Optional[nn.Module], features: Optional[Sequence[str]]) -> None:
        super().__init__()
        self.preprocessor = _preprocessor(normalizer, features)
        self.features = list(self.preprocessor.features)

    def describe(self) -> Dict[str, Any]:
        """The metadata stored with an export of this module."""
        return {"format": FORMAT_VERSION, "kind": self.kind, "features": list(self.features),
                "normalized_features": list(self.preprocessor.output_names),
                "inputs": list(self.input_names), "outputs": list(self.output_names)}

    def dynamic_axes(self) -> Dict[str, Dict[int, str]]:
        """Input name -> {axis: name} of the axes whose size may vary."""
        return {"values": {0: "batch"}, "presence": {0: "batch"}}

    @abstractmethod
    def example_inputs(self, batch: int = 2) -> Tuple[torch.Tensor, ...]:
        """Inputs of the right dtypes and shapes (for tracing and ONNX export)."""

    @abstractmethod
    def output_shapes(self, inputs: Tuple[torch.Tensor, ...]) -> List[Tuple[int, ...]]:
        """The shapes the outputs must have for ``inputs``."""

    def _state(self, batch: int) -> Tuple[torch.Tensor, torch.Tensor]:
        values = torch.zeros(batch, len(self.features))
        presence = torch.ones(batch, len(self.features), dtype=torch.bool)
        return values, presence


class ExportedPolicy(_Exported):
    """A discrete-action policy: raw features in; scores, the greedy action and
    softmax propensities out.

    ``temperature`` (float32 ``[1]``) must be > 0: propensities are
    ``softmax(scores / temperature)``; 1 keeps the scores' own scale, large values
    flatten towards uniform, small values concentrate on the greedy action (the
    limit 0 is greedy). The graph does not check it (0 or less gives NaN or
    reversed preferences); :mod:`rl.serving` rejects it.
    """

    kind = "discrete"
    input_names = ("values", "presence", "temperature")
    output_names = ("scores", "action", "propensities")

    def __init__(self, normalizer: Optional[nn.Module], scorer: nn.Module,
                 action_names: Sequence[str], features: Optional[Sequence[str]] = None) -> None:
        """``normalizer``: a FeatureNormalizer, or None for a model trained on raw
        features (then ``features`` names the input columns); ``scorer``: normalized
        ``[B, D]`` -> scores ``[B, A]`` (e.g. a Q-network without its preprocessor);
        ``action_names``: the ``A`` actions, in the scorer's column order."""
        super().__init__(normalizer, features)
        self.scorer = scorer
        self.action_names = _names(action_names, "action_names")

    def forward(self, values: torch.Tensor, presence: torch.Tensor,
                temperature: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(scores [B, A], greedy action index [B] int64, propensities [B, A])``."""
        scores = self.scorer(self.preprocessor(values, presence))
        return scores, scores.argmax(dim=1), _shifted_softmax(scores, temperature)

    def describe(self) -> Dict[str, Any]:
        """The metadata stored with an export of this module."""
        return {**super().describe(), "action_names": list(self.action_names)}

    def example_inputs(self, batch: int = 2) -> Tuple[torch.Tensor, ...]:
        """``(values, presence, temperature)`` of the right dtypes and shapes."""
        return (*self._state(batch), torch.ones(1))

    def output_shapes(self, inputs: Tuple[torch.Tensor, ...]) -> List[Tuple[int, ...]]:
        """``[(B, A), (B,), (B, A)]``."""
        batch, actions = inputs[0].shape[0], len(self.action_names)
        return [(batch, actions), (batch,), (batch, actions)]


class ExportedParametricPolicy(_Exported):
    """A policy scoring a variable set of actions described by features (parametric
    DQN): each row brings its candidate actions and a mask of the possible ones.

    The scorer sees normalized state ``[B, D]`` and the raw ``action_features
    [B, A, k]`` (it owns any action preprocessing) and returns ``[B, A]``. Masked
    actions (``action_mask`` False) score ``-inf``, get propensity exactly 0 and are
    never greedy. A row without any possible action scores ``-inf`` everywhere, has
    all-zero propensities and greedy action ``-1``. Temperature as in
    :class:`ExportedPolicy`.
    """

    kind = "parametric"
    input_names = ("values", "presence", "action_features", "action_mask", "temperature")
    output_names = ("scores", "action", "propensities")

    def __init__(self, normalizer: Optional[nn.Module], scorer: nn.Module,
                 action_feature_names: Sequence[str],
                 features: Optional[Sequence[str]] = None) -> None:
        """``scorer``: ``forward(state [B, D], action_features [B, A, k]) -> [B, A]``;
        ``action_feature_names``: the ``k`` action feature ids, in column order;
        ``normalizer`` and ``features`` as in :class:`ExportedPolicy`."""
        super().__init__(normalizer, features)
        self.scorer = scorer
        self.action_feature_names = _names(action_feature_names, "action_feature_names")

    def forward(self, values: torch.Tensor, presence: torch.Tensor,
                action_features: torch.Tensor, action_mask: torch.Tensor,
                temperature: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(scores [B, A], greedy action index [B] int64 or -1, propensities [B, A])``."""
        raw = self.scorer(self.preprocessor(values, presence), action_features.to(torch.float32))
        possible = action_mask.to(torch.bool)
        any_possible = possible.any(dim=1, keepdim=True)
        minus_inf = torch.full_like(raw, -math.inf)
        scores = torch.where(possible, raw, minus_inf)
        top = scores.max(dim=1, keepdim=True).values
        logits = torch.where(possible, (raw - top) / temperature, minus_inf)
        # a row without possible actions: softmax of zeros, then masked to all zeros
        logits = torch.where(any_possible, logits, torch.zeros_like(logits))
        propensities = torch.where(possible, torch.softmax(logits, dim=1),
                                   torch.zeros_like(logits))
        greedy = torch.where(any_possible.squeeze(1), scores.argmax(dim=1),
                             torch.full_like(any_possible.squeeze(1), -1, dtype=torch.long))
        return scores, greedy, propensities

    def describe(self) -> Dict[str, Any]:
        """The metadata stored with an export of this module."""
        return {**super().describe(), "action_feature_names": list(self.action_feature_names)}

    def dynamic_axes(self) -> Dict[str, Dict[int, str]]:
        """Batch axis on every input but temperature; action axis on the action inputs."""
        return {**super().dynamic_axes(), "action_features": {0: "batch", 1: "actions"},
                "action_mask": {0: "batch", 1: "actions"}}

    def example_inputs(self, batch: int = 2, actions: int = 3) -> Tuple[torch.Tensor, ...]:
        """``(values, presence, action_features, action_mask, temperature)``."""
        return (*self._state(batch), torch.zeros(batch, actions, len(self.action_feature_names)),
                torch.ones(batch, actions, dtype=torch.bool), torch.ones(1))

    def output_shapes(self, inputs: Tuple[torch.Tensor, ...]) -> List[Tuple[int, ...]]:
        """``[(B, A), (B,), (B, A)]`` with ``A`` the width of ``action_mask``."""
        batch, actions = inputs[3].shape
        return [(batch, actions), (batch,), (batch, actions)]


class ExportedActor(_Exported):
    """A deterministic continuous-action policy (DDPG, TD3 actors): raw features in,
    the action ``[B, k]`` in environment units out.

    There are no propensities: a deterministic actor puts all probability on one
    point, which has no density to log; exploration noise is added outside the model
    by whoever serves it, and its density is theirs to record.
    """

    kind = "continuous"
    input_names = ("values", "presence")
    output_names = ("action",)

    def __init__(self, normalizer: Optional[nn.Module], actor: nn.Module, action_dim: int,
                 action_low: Optional[Sequence[float]] = None,
                 action_high: Optional[Sequence[float]] = None,
                 features: Optional[Sequence[str]] = None) -> None:
        """``actor``: normalized ``[B, D]`` -> action ``[B, action_dim]``. With
        ``action_low`` and ``action_high`` (one bound per dimension), the actor's
        output is taken to lie in [-1, 1] (e.g. after tanh) and is mapped linearly
        onto [low, high] (not clipped); without them it is returned as is."""
        super().__init__(normalizer, features)
        if action_dim < 1:
            raise ValueError(f"action_dim must be positive, got {action_dim}")
        self.actor = actor
        self.action_dim = int(action_dim)
        if (action_low is None) != (action_high is None):
            raise ValueError("give both action_low and action_high, or neither")
        self.rescale = action_low is not None
        low = torch.tensor(list(action_low or [-1.0] * action_dim), dtype=torch.float32)
        high = torch.tensor(list(action_high or [1.0] * action_dim), dtype=torch.float32)
        if low.shape != (action_dim,) or high.shape != (action_dim,):
            raise ValueError(f"action_low and action_high need {action_dim} values each")
        if not bool(torch.isfinite(low).all() and torch.isfinite(high).all()
                    and (high > low).all()):
            raise ValueError("action bounds must be finite with action_high > action_low")
        self.register_buffer("action_low", low)
        self.register_buffer("action_high", high)

    def forward(self, values: torch.Tensor, presence: torch.Tensor) -> torch.Tensor:
        """The action ``[B, action_dim]``."""
        action = self.actor(self.preprocessor(values, presence))
        if self.rescale:
            action = self.action_low + (action + 1.0) * 0.5 * (self.action_high - self.action_low)
        return action

    def describe(self) -> Dict[str, Any]:
        """The metadata stored with an export of this module."""
        bounds = ({"action_low": self.action_low.tolist(), "action_high": self.action_high.tolist()}
                  if self.rescale else {})
        return {**super().describe(), "action_dim": self.action_dim, **bounds}

    def example_inputs(self, batch: int = 2) -> Tuple[torch.Tensor, ...]:
        """``(values, presence)`` of the right dtypes and shapes."""
        return self._state(batch)

    def output_shapes(self, inputs: Tuple[torch.Tensor, ...]) -> List[Tuple[int, ...]]:
        """``[(B, action_dim)]``."""
        return [(inputs[0].shape[0], self.action_dim)]


def _check(module: nn.Module) -> None:
    """Run ``module`` once on example inputs; a clear error for a wrong output shape."""
    if not isinstance(module, _Exported):
        raise TypeError("export an ExportedPolicy, ExportedParametricPolicy or ExportedActor, "
                        f"got {type(module).__name__}")
    inputs = module.example_inputs()
    with torch.no_grad():
        outputs = module(*inputs)
    outputs = list(outputs) if isinstance(outputs, tuple) else [outputs]
    got = [tuple(o.shape) for o in outputs]
    expected = module.output_shapes(inputs)
    if got != expected:
        raise ValueError(f"{type(module).__name__} outputs {module.output_names} have shapes "
                         f"{got}, expected {expected}: check the scorer's output width")


def _metadata(module: _Exported, extra: Optional[Mapping[str, Any]],
              exporter: Dict[str, Any]) -> Dict[str, Any]:
    from fiberrl import __version__

    base = {**module.describe(), "fiberrl_version": __version__,
            "torch_version": torch.__version__.split("+")[0], **exporter}
    clash = sorted(set(extra or {}) & set(base))
    if clash:
        raise ValueError(f"metadata keys {clash} are reserved (set by the exporter)")
    merged = {**base, **dict(extra or {})}
    try:
        json.dumps(merged, allow_nan=False)
    except (TypeError, ValueError) as error:
        raise ValueError(f"metadata must be JSON-serializable: {error}") from None
    return merged


@contextlib.contextmanager
def _eval_mode(module: nn.Module):
    """Export in eval mode (dropout off, batch-norm statistics frozen); restore after."""
    modes = {m: m.training for m in module.modules()}
    module.eval()
    try:
        yield module
    finally:
        for m, training in modes.items():
            m.train(training)


def export_torchscript(module: _Exported, path: Union[str, Path],
                       metadata: Optional[Mapping[str, Any]] = None,
                       method: str = "auto") -> Dict[str, Any]:
    """Write ``module`` as a TorchScript file at ``path``; returns the metadata stored
    in it (extra file ``fiberrl.json``: the module's description, fiberrl and torch
    versions, the method, and the caller's ``metadata`` entries).

    ``method``: ``"script"`` (``torch.jit.script``: control flow kept),
    ``"trace"`` (``torch.jit.trace`` on example inputs: Python control flow and
    data-dependent branches are frozen as they ran, so use it only for a scorer
    that cannot be scripted and whose path does not depend on its inputs), or
    ``"auto"``: script, and trace with a warning when scripting fails.
    """
    if method not in ("auto", "script", "trace"):
        raise ValueError(f"method must be 'auto', 'script' or 'trace', got {method!r}")
    with _eval_mode(module):
        _check(module)
        compiled, used = None, "trace"
        if method in ("auto", "script"):
            try:
                compiled, used = torch.jit.script(module), "script"
            except Exception as error:  # scripting raises many types; all mean "cannot script"
                if method == "script":
                    raise
                logger.warning("torch.jit.script failed (%s: %s); falling back to torch.jit.trace",
                               type(error).__name__, str(error).splitlines()[0] if str(error)
                               else "")
        if compiled is None:
            with torch.no_grad():
                compiled = torch.jit.trace(module, module.example_inputs())
    meta = _metadata(module, metadata, {"exporter": f"torch.jit.{used}"})
    torch.jit.save(compiled, str(path), _extra_files={TORCHSCRIPT_METADATA_FILE: json.dumps(meta)})
    logger.info("exported %s policy to %s (torch.jit.%s)", module.kind, path, used)
    return meta


def export_onnx(module: _Exported, path: Union[str, Path],
                metadata: Optional[Mapping[str, Any]] = None,
                opset: int = DEFAULT_OPSET) -> Dict[str, Any]:
    """Write ``module`` as one self-contained ONNX file at ``path`` (weights inside:
    protobuf limits it to 2 GB); returns the metadata stored as JSON under the
    ``fiberrl`` key of the model's ``metadata_props``.

    The batch axis is dynamic (and the action axis of a parametric policy); input
    and output names are the module's ``input_names`` and ``output_names``. The
    file is checked with ``onnx.checker`` (full check, with shape inference).
    """
    for requirement in ("onnx", "onnxscript"):  # the torch.export-based exporter needs both
        try:
            importlib.import_module(requirement)
        except ImportError as error:
            raise ImportError(f"ONNX export needs onnx and onnxscript ({requirement} is "
                              f"missing): {_EXTRA_HINT}") from error
    import onnx
    with _eval_mode(module):
        _check(module)
        inputs = module.example_inputs()
        dims: Dict[str, Any] = {}
        dynamic: Dict[str, Dict[int, Any]] = {}
        for name, axes in module.dynamic_axes().items():
            dynamic[name] = {axis: dims.setdefault(label, torch.export.Dim(label))
                             for axis, label in axes.items()}
        shapes = {name: dynamic.get(name) for name in module.input_names}
        with warnings.catch_warnings():
            # inputs sharing the "batch" Dim make the exporter say it keeps one name
            warnings.filterwarnings("ignore", message=".*axis name.*will not be used")
            program = torch.onnx.export(
                module, inputs, None, input_names=list(module.input_names),
                output_names=list(module.output_names), opset_version=opset, dynamo=True,
                dynamic_shapes=shapes, verbose=False)
    meta = _metadata(module, metadata, {"exporter": "torch.onnx", "opset": opset})
    program.model.metadata_props[METADATA_KEY] = json.dumps(meta)
    program.save(str(path), external_data=False)
    onnx.checker.check_model(onnx.load(str(path)), full_check=True)
    logger.info("exported %s policy to %s (ONNX opset %d)", module.kind, path, opset)
    return meta
