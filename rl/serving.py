"""Serve an exported policy: :func:`load` a TorchScript or ONNX file written by
:mod:`rl.export` and predict from feature maps.

::

    predictor = load("policy.onnx")
    predictor.predict({"3": 1.0, "7": 0.25}, temperature=0.5)
    # Prediction(scores={'left': 0.1, 'right': 0.7}, action='right',
    #            propensities={'left': 0.17, 'right': 0.83})

A feature map holds feature id -> raw value; an id the map lacks (or maps to None)
is absent, exactly as the model saw missing features in training. An id the model
does not know raises ValueError listing them, unless ``ignore_unknown=True`` (then
they are dropped, logged at debug level): a misspelt id would otherwise be silently
absent. A list of maps is predicted as one batch in one forward pass.

The file kind is read from its content (TorchScript files are zip archives), not
its name. ONNX files run on ONNX Runtime, imported on first use (the ``export``
extra); TorchScript files need torch. Neither path needs the code that trained
the model.
"""
import json
import logging
import math
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np

logger = logging.getLogger(__name__)

FeatureMap = Mapping[Any, Optional[float]]
METADATA_KEY = "fiberrl"  # rl.export.METADATA_KEY, not imported: that module needs torch
_KINDS = ("discrete", "parametric", "continuous")


@dataclass(frozen=True)
class Prediction:
    """One row's prediction by a discrete or parametric policy.

    ``scores`` and ``propensities`` map each (possible) action name to its raw score
    and its probability ``softmax(scores / temperature)``; ``action`` is the greedy
    action's name, None for a parametric row without possible actions (then both
    maps are empty).
    """

    scores: Dict[str, float]
    action: Optional[str]
    propensities: Dict[str, float]


@dataclass(frozen=True)
class ActionPrediction:
    """One row's prediction by a continuous-action policy: the action vector in
    environment units."""

    action: List[float]


class _TorchScriptRunner:
    """Runs a TorchScript file; the metadata comes from its ``fiberrl.json`` extra file."""

    def __init__(self, path: str) -> None:
        import torch

        self._torch = torch
        extra = {METADATA_KEY + ".json": ""}
        self.module = torch.jit.load(path, map_location="cpu", _extra_files=extra)
        self.module.eval()
        self.metadata_text = extra[METADATA_KEY + ".json"]

    def run(self, inputs: Dict[str, np.ndarray], names: Sequence[str]) -> List[np.ndarray]:
        """The module's outputs, in order, as numpy arrays."""
        with self._torch.inference_mode():
            outputs = self.module(*[self._torch.from_numpy(inputs[n]) for n in names])
        outputs = outputs if isinstance(outputs, (tuple, list)) else (outputs,)
        return [o.numpy() for o in outputs]


class _OnnxRunner:
    """Runs an ONNX file on ONNX Runtime; the metadata is a ``metadata_props`` entry."""

    def __init__(self, path: str, providers: Optional[Sequence[str]]) -> None:
        try:
            import onnxruntime
        except ImportError as error:
            raise ImportError("serving an ONNX model needs onnxruntime: "
                              "pip install 'fiberrl[export]'") from error
        self.session = onnxruntime.InferenceSession(
            path, providers=list(providers or ["CPUExecutionProvider"]))
        self.metadata_text = self.session.get_modelmeta().custom_metadata_map.get(METADATA_KEY, "")

    def run(self, inputs: Dict[str, np.ndarray], names: Sequence[str]) -> List[np.ndarray]:
        """The model's outputs, in order, as numpy arrays."""
        return self.session.run(None, {n: inputs[n] for n in names})


def load(path: Union[str, Path], providers: Optional[Sequence[str]] = None) -> "Predictor":
    """A :class:`Predictor` for the TorchScript or ONNX file at ``path``;
    ``providers``: ONNX Runtime execution providers (default: CPU)."""
    path = str(path)
    if not Path(path).is_file():
        raise FileNotFoundError(f"no exported model at {path}")
    fmt = "torchscript" if zipfile.is_zipfile(path) else "onnx"
    try:
        runner: Any = _TorchScriptRunner(path) if fmt == "torchscript" else _OnnxRunner(
            path, providers)
    except ImportError:
        raise
    except Exception as error:  # torch and onnxruntime raise their own error types
        reason = (str(error).strip().splitlines() or [""])[0]
        raise ValueError(f"{path}: not a loadable {fmt} model "
                         f"({type(error).__name__}: {reason})") from error
    if not runner.metadata_text:
        raise ValueError(f"{path}: no {METADATA_KEY!r} metadata; export it with rl.export")
    metadata = json.loads(runner.metadata_text)
    if metadata.get("kind") not in _KINDS:
        raise ValueError(f"{path}: unknown model kind {metadata.get('kind')!r}")
    logger.info("loaded %s %s policy from %s (%d features)", fmt, metadata["kind"], path,
                len(metadata["features"]))
    return Predictor(runner, metadata, fmt)


def _positive_temperature(temperature: float) -> float:
    try:
        value = float(temperature)
    except (TypeError, ValueError):
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"temperature must be a positive finite number, got {temperature!r}")
    return value


def _as_rows(items: Any, what: str) -> Tuple[List[Any], bool]:
    """``(rows, single)``: a mapping is one row, a sequence of mappings a batch."""
    if isinstance(items, Mapping):
        return [items], True
    if isinstance(items, (str, bytes)) or not isinstance(items, Sequence):
        raise TypeError(f"{what} must be a mapping or a sequence of mappings, "
                        f"got {type(items).__name__}")
    return list(items), False


def _number(value: Any, where: str) -> float:
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{where}: not a number: {value!r}") from None
    if not math.isfinite(number):
        raise ValueError(f"{where}: value must be finite, got {value!r} (leave it out if absent)")
    return number


def _unknown_error(unknown: Sequence[str], known: Sequence[str], what: str) -> ValueError:
    shown = ", ".join(known[:20]) + (", ..." if len(known) > 20 else "")
    return ValueError(f"unknown {what} ids {sorted(set(unknown))}; the model takes: {shown} "
                      "(pass ignore_unknown=True to drop them)")


def encode_features(rows: Sequence[FeatureMap], features: Sequence[str],
                    ignore_unknown: bool = False) -> Tuple[np.ndarray, np.ndarray]:
    """``(values float32 [B, F], presence bool [B, F])`` of feature maps, columns in
    the order of ``features``; absent entries hold 0."""
    index = {f: i for i, f in enumerate(features)}
    values = np.zeros((len(rows), len(features)), dtype=np.float32)
    presence = np.zeros((len(rows), len(features)), dtype=bool)
    unknown: List[str] = []
    for r, row in enumerate(rows):
        if not isinstance(row, Mapping):
            raise TypeError(f"row {r}: a feature map must be a mapping, got {type(row).__name__}")
        for key, value in row.items():
            column = index.get(str(key))
            if column is None:
                unknown.append(str(key))
            elif value is not None:
                values[r, column] = _number(value, f"row {r} feature {key!r}")
                presence[r, column] = True
    if unknown and not ignore_unknown:
        raise _unknown_error(unknown, list(features), "feature")
    if unknown:
        logger.debug("ignored unknown feature ids %s", sorted(set(unknown)))
    return values, presence


class Predictor:
    """Predicts with a loaded policy; made by :func:`load`."""

    def __init__(self, runner: Any, metadata: Dict[str, Any], fmt: str) -> None:
        """``runner``: runs the model on named numpy inputs; ``metadata``: what
        :mod:`rl.export` stored in the file; ``fmt``: "torchscript" or "onnx"."""
        self._runner = runner
        self.metadata = metadata
        self.format = fmt

    @property
    def kind(self) -> str:
        """"discrete", "parametric" or "continuous"."""
        return self.metadata["kind"]

    @property
    def features(self) -> List[str]:
        """The input feature ids, in the model's column order."""
        return list(self.metadata["features"])

    @property
    def action_names(self) -> Optional[List[str]]:
        """The actions of a discrete policy (None for the other kinds)."""
        names = self.metadata.get("action_names")
        return list(names) if names is not None else None

    def predict(self, features: Union[FeatureMap, Sequence[FeatureMap]],
                temperature: float = 1.0, possible_actions: Any = None,
                ignore_unknown: bool = False) -> Any:
        """Predict for one feature map (returns one result) or a sequence of maps
        (returns a list, computed in one forward pass).

        ``temperature`` (> 0; ignored by continuous policies) sets the propensities
        ``softmax(scores / temperature)``. ``possible_actions`` is required by, and
        only accepted by, parametric policies: per row, a mapping action name ->
        action features (a map of every action feature id, or a sequence of values
        in the model's ``action_feature_names`` order); a sequence of such mappings
        for a batch. Results are :class:`Prediction` or, for continuous policies,
        :class:`ActionPrediction`.
        """
        rows, single = _as_rows(features, "features")
        if self.kind == "parametric":
            if possible_actions is None:
                raise ValueError("a parametric policy needs possible_actions")
            candidates, _ = _as_rows(possible_actions, "possible_actions")
            if single != isinstance(possible_actions, Mapping) or len(candidates) != len(rows):
                raise ValueError(f"possible_actions must match features: one mapping per row "
                                 f"({len(rows)} rows, got {len(candidates)})")
        elif possible_actions is not None:
            raise ValueError(f"possible_actions is only for parametric policies; a {self.kind} "
                             "policy scores its fixed actions")
        if self.kind != "continuous":
            temperature = _positive_temperature(temperature)
        if not rows:
            return []
        values, presence = encode_features(rows, self.metadata["features"], ignore_unknown)
        inputs = {"values": values, "presence": presence,
                  "temperature": np.array([temperature], dtype=np.float32)}
        if self.kind == "parametric":
            names, action_features, mask = self._encode_actions(candidates, ignore_unknown)
            inputs.update(action_features=action_features, action_mask=mask)
        outputs = self._runner.run(inputs, self.metadata["inputs"])
        if self.kind == "continuous":
            results: List[Any] = [ActionPrediction([float(a) for a in row]) for row in outputs[0]]
        else:
            if self.kind == "discrete":
                names = [list(self.metadata["action_names"])] * len(rows)
            results = [self._row(row_names, *row) for row_names, *row in zip(names, *outputs)]
        return results[0] if single else results

    def _encode_actions(self, candidates: List[Any], ignore_unknown: bool
                        ) -> Tuple[List[List[str]], np.ndarray, np.ndarray]:
        ids = list(self.metadata["action_feature_names"])
        width = max([1] + [len(c) for c in candidates if isinstance(c, Mapping)])
        features = np.zeros((len(candidates), width, len(ids)), dtype=np.float32)
        mask = np.zeros((len(candidates), width), dtype=bool)
        names: List[List[str]] = []
        for r, actions in enumerate(candidates):
            if not isinstance(actions, Mapping):
                raise TypeError(f"possible_actions row {r}: a mapping action name -> features, "
                                f"got {type(actions).__name__}")
            names.append([str(name) for name in actions])
            for a, (name, row) in enumerate(actions.items()):
                where = f"possible_actions row {r} action {name!r}"
                features[r, a] = self._action_vector(row, ids, where, ignore_unknown)
                mask[r, a] = True
        return names, features, mask

    @staticmethod
    def _action_vector(row: Any, ids: List[str], where: str, ignore_unknown: bool) -> List[float]:
        if isinstance(row, Mapping):
            keyed = {str(k): v for k, v in row.items()}
            unknown = [k for k in keyed if k not in ids]
            if unknown and not ignore_unknown:
                raise _unknown_error(unknown, ids, f"{where}: action feature")
            missing = [i for i in ids if keyed.get(i) is None]
            if missing:
                raise ValueError(f"{where}: action features {missing} missing (all "
                                 f"{len(ids)} are required)")
            return [_number(keyed[i], f"{where} feature {i!r}") for i in ids]
        if isinstance(row, (str, bytes)) or not isinstance(row, Sequence) or len(row) != len(ids):
            raise ValueError(f"{where}: give a map of the action features {ids} or a "
                             f"sequence of {len(ids)} values")
        return [_number(v, f"{where} feature {i!r}") for i, v in zip(ids, row)]

    @staticmethod
    def _row(names: List[str], scores: np.ndarray, greedy: Any,
             propensities: np.ndarray) -> Prediction:
        index = int(greedy)
        return Prediction(scores={n: float(s) for n, s in zip(names, scores)},
                          action=names[index] if 0 <= index < len(names) else None,
                          propensities={n: float(p) for n, p in zip(names, propensities)})
