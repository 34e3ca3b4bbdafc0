"""Policies the run loop drives, and :func:`build_policy`, which makes one from
plain functions.

A :class:`Policy` turns observations into actions, postprocesses what it saw
into a training batch and learns from it. :func:`build_policy` returns an
ordinary subclass whose methods call the functions you give it, in this order:

1. construction: ``model_fn(observation_space, action_space, config) -> nn.Module``,
   then ``optimizer_fn(model, config) -> torch.optim.Optimizer`` (default: Adam
   with ``config["lr"]``);
2. every step: ``action_fn(model, obs, explore, config) -> (actions, extras)``
   with ``obs`` a float tensor ``[N, *obs_shape]``; ``extras`` is a dict of
   per-row tensors kept with the step (log-probabilities, values). The default
   treats the model's output as logits of a categorical distribution: a sample
   when ``explore``, the argmax otherwise (discrete action spaces only);
3. when a batch is complete: ``postprocess_fn(policy, batch) -> batch`` on numpy
   arrays (returns-to-go, GAE; default: unchanged). See :mod:`rl.rollout` for the
   batch layout of the two batch modes;
4. learning: ``config["num_epochs"]`` passes over the batch in shuffled minibatches
   of ``config["minibatch_size"]`` rows (default: the whole batch); each calls
   ``loss_fn(model, minibatch, config) -> loss`` (or ``(loss, {name: value})``; with
   :meth:`Policy.enable_data_parallel` ``model`` is a DistributedDataParallel wrapper,
   so a loss that should average gradients over ranks must call ``model(...)``),
   back-propagates, clips the gradient norm to ``config["max_grad_norm"]`` (when
   set) and steps the optimizer;
5. after learning: ``stats_fn(policy, batch, stats) -> dict``, merged into the
   statistics :meth:`Policy.learn` returns.

Config keys every built policy understands (``defaults`` and the ``config``
argument override them): ``lr``, ``gamma``, ``batch_mode`` (``"episodes"`` or
``"fragments"``), ``train_batch_size`` (env steps per learning step in episode
mode), ``rollout_length`` (vector steps per learning step in fragment mode),
``num_epochs``, ``minibatch_size``, ``max_grad_norm``, ``lr_schedule``
(``"constant"`` or ``"linear"``: decayed to 0 over ``total_steps`` samples).
"""
from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from typing import Any, Callable, Dict, Mapping, Optional, Tuple

import numpy as np
import torch
from torch import nn

from .envs import is_discrete

logger = logging.getLogger(__name__)

BASE_CONFIG: Dict[str, Any] = {
    "lr": 1e-3,
    "gamma": 0.99,
    "batch_mode": "episodes",
    "train_batch_size": 1000,
    "rollout_length": 128,
    "num_epochs": 1,
    "minibatch_size": None,
    "max_grad_norm": None,
    "lr_schedule": "constant",
    "total_steps": None,
}

# Batch keys whose values are integer actions of a discrete space.
_INTEGER_KEYS = ("actions",)


class Policy(ABC):
    """The base class: an actor with a torch model and an optimizer.

    Subclasses (or :func:`build_policy`) provide :meth:`make_model`,
    :meth:`action`, :meth:`loss`; the rest is shared.
    """

    name = "policy"
    default_config: Mapping[str, Any] = BASE_CONFIG

    def __init__(self, observation_space: Any, action_space: Any,
                 config: Optional[Mapping[str, Any]] = None, seed: Optional[int] = None) -> None:
        merged = dict(BASE_CONFIG)
        merged.update(self.default_config)
        unknown = set(config or {}) - set(merged)
        if unknown:
            raise TypeError(f"unknown config keys for {self.name}: {sorted(unknown)}; "
                            f"valid keys: {sorted(merged)}")
        merged.update(config or {})
        if merged["batch_mode"] not in ("episodes", "fragments"):
            raise ValueError(f"batch_mode must be 'episodes' or 'fragments', got {merged['batch_mode']!r}")
        if merged["lr_schedule"] not in ("constant", "linear"):
            raise ValueError(f"lr_schedule must be 'constant' or 'linear', got {merged['lr_schedule']!r}")
        if merged["lr_schedule"] == "linear" and not merged["total_steps"]:
            raise ValueError("lr_schedule='linear' needs total_steps")
        self.config = merged
        self.observation_space = observation_space
        self.action_space = action_space
        self.discrete = is_discrete(action_space)
        if seed is not None:
            torch.manual_seed(seed)
        self.generator = np.random.default_rng(seed)
        self.model = self.make_model()
        self.learner_model: nn.Module = self.model  # what the loss runs (a DDP wrapper when data-parallel)
        self.optimizer = self.make_optimizer()
        self.samples_learned = 0

    # -- the parts a policy defines ------------------------------------------------
    @abstractmethod
    def make_model(self) -> nn.Module:
        """The torch model (``model_fn`` in built policies)."""

    def make_optimizer(self) -> torch.optim.Optimizer:
        """Adam over the model's parameters with ``config["lr"]``."""
        return torch.optim.Adam(self.model.parameters(), lr=self.config["lr"])

    def action(self, obs: torch.Tensor, explore: bool) -> Tuple[torch.Tensor, Dict[str, torch.Tensor]]:
        """Actions for ``obs``: categorical over the model's logits (discrete spaces)."""
        if not self.discrete:
            raise TypeError(f"{self.name}: continuous actions need an action_fn")
        logits = self.model(obs)
        if explore:
            actions = torch.distributions.Categorical(logits=logits).sample()
        else:
            actions = logits.argmax(dim=-1)
        return actions, {}

    @abstractmethod
    def loss(self, batch: Dict[str, torch.Tensor]) -> Any:
        """The loss of a minibatch (``loss_fn`` in built policies)."""

    def postprocess(self, batch: Dict[str, np.ndarray]) -> Dict[str, np.ndarray]:
        """Turn collected steps into training data (default: unchanged)."""
        return batch

    def extra_stats(self, batch: Dict[str, np.ndarray], stats: Dict[str, float]) -> Dict[str, float]:
        """More statistics after learning (``stats_fn`` in built policies)."""
        return {}

    # -- shared machinery ------------------------------------------------------------
    @torch.no_grad()
    def compute_actions(self, obs: np.ndarray, explore: bool = True) -> Tuple[np.ndarray, Dict[str, np.ndarray]]:
        """Actions (numpy) and per-row extras for a batch of observations."""
        actions, extras = self.action(torch.as_tensor(obs, dtype=torch.float32), explore)
        return actions.numpy(), {key: value.numpy() for key, value in extras.items()}

    def learn(self, batch: Dict[str, np.ndarray]) -> Dict[str, float]:
        """Epochs of minibatch gradient steps on ``batch``; returns mean statistics."""
        tensors = self._to_tensors(batch)
        size = len(tensors["obs"])
        minibatch = self.config["minibatch_size"] or size
        totals: Dict[str, float] = {}
        updates = 0
        for _ in range(int(self.config["num_epochs"])):
            order = torch.from_numpy(self.generator.permutation(size))
            for start in range(0, size, minibatch):
                index = order[start:start + minibatch]
                stats = self._gradient_step({key: value[index] for key, value in tensors.items()})
                for key, value in stats.items():
                    totals[key] = totals.get(key, 0.0) + value
                updates += 1
        self.samples_learned += size
        self._schedule_lr()
        stats = {key: value / max(1, updates) for key, value in totals.items()}
        stats.update(self.extra_stats(batch, stats))
        return stats

    def _gradient_step(self, minibatch: Dict[str, torch.Tensor]) -> Dict[str, float]:
        result = self.loss(minibatch)
        loss, stats = result if isinstance(result, tuple) else (result, {})
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        stats = {key: float(value) for key, value in stats.items()}
        stats["loss"] = float(loss.detach())
        if self.config["max_grad_norm"]:
            norm = nn.utils.clip_grad_norm_(self.model.parameters(), self.config["max_grad_norm"])
            stats["grad_norm"] = float(norm)
        self.optimizer.step()
        return stats

    def _schedule_lr(self) -> None:
        """Set the optimizer's step size: ``lr``, or with ``lr_schedule="linear"`` ``lr``
        decayed linearly to 0 over ``total_steps`` samples."""
        rate = self.config["lr"]
        if self.config["lr_schedule"] == "linear":
            rate *= max(0.0, 1.0 - self.samples_learned / float(self.config["total_steps"]))
        for group in self.optimizer.param_groups:
            group["lr"] = rate

    def set_hyperparameters(self, values: Mapping[str, Any]) -> None:
        """Change settings of a live policy (PBT's explore step, :mod:`rl.pbt`): ``values``
        replace config entries from the next step on, and the optimizer's step size
        follows a new ``lr`` at once. Unknown keys are a ``KeyError`` listing the valid ones."""
        unknown = sorted(set(values) - set(self.config))
        if unknown:
            raise KeyError(f"{self.name} has no settings {unknown}; valid: {sorted(self.config)}")
        self.config.update(values)
        self._schedule_lr()

    def adopt(self, state: Mapping[str, Any], seed: int) -> None:
        """Take over another policy's learned state (PBT's exploit step): what
        :meth:`state_dict` holds (weights, optimizer moments, normalization buffers,
        counters), then reseed this policy's random streams with ``seed`` so that it
        does not replay the other's. Its own config stays (set it with
        :meth:`set_hyperparameters`)."""
        self.load_state_dict(state)
        torch.manual_seed(seed)
        self.generator = np.random.default_rng(seed)
        self._schedule_lr()

    def _to_tensors(self, batch: Dict[str, np.ndarray]) -> Dict[str, torch.Tensor]:
        tensors = {}
        for key, value in batch.items():
            array = np.asarray(value)
            if key in _INTEGER_KEYS and self.discrete:
                tensors[key] = torch.as_tensor(array, dtype=torch.int64)
            elif array.dtype == bool:
                tensors[key] = torch.as_tensor(array)
            else:
                tensors[key] = torch.as_tensor(array, dtype=torch.float32)
        return tensors

    def enable_data_parallel(self, device: Optional[str] = None) -> None:
        """Average gradients over the ranks of the current torch.distributed group:
        the loss runs through a ``DistributedDataParallel`` wrapper of the model (which
        also makes every rank start from rank 0's weights); acting stays local."""
        from torch.nn.parallel import DistributedDataParallel
        if device and device.startswith("cuda"):
            self.model.to(device)
            self.learner_model = DistributedDataParallel(self.model, device_ids=[device])
        else:
            self.learner_model = DistributedDataParallel(self.model)

    def state_dict(self) -> Dict[str, Any]:
        """Model, optimizer, counters and RNG state: all that resuming needs."""
        return {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(),
                "samples_learned": self.samples_learned, "config": dict(self.config),
                "numpy_rng": self.generator.bit_generator.state,
                "torch_rng": torch.get_rng_state()}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned."""
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.samples_learned = int(state["samples_learned"])
        self.generator.bit_generator.state = state["numpy_rng"]
        torch.set_rng_state(state["torch_rng"])


def build_policy(name: str, model_fn: Callable[..., nn.Module], loss_fn: Callable[..., Any],
                 postprocess_fn: Optional[Callable[..., Dict[str, np.ndarray]]] = None,
                 optimizer_fn: Optional[Callable[..., torch.optim.Optimizer]] = None,
                 action_fn: Optional[Callable[..., Tuple[torch.Tensor, dict]]] = None,
                 stats_fn: Optional[Callable[..., Dict[str, float]]] = None,
                 defaults: Optional[Mapping[str, Any]] = None) -> type:
    """A :class:`Policy` subclass named ``name`` that calls the given functions.

    The order in which they run is in this module's docstring. ``defaults`` adds
    or overrides config keys of the new class (users override them in turn with
    the ``config`` argument of the constructor).
    """
    if not name.isidentifier():
        raise ValueError(f"a policy name must be an identifier, got {name!r}")
    for label, fn in (("model_fn", model_fn), ("loss_fn", loss_fn)):
        if not callable(fn):
            raise TypeError(f"{label} must be callable, got {fn!r}")
    namespace: Dict[str, Any] = {
        "name": name,
        "__doc__": f"The {name} policy (made by rl.build_policy from {model_fn.__name__}, "
                   f"{loss_fn.__name__}{', ' + postprocess_fn.__name__ if postprocess_fn else ''}).",
        "default_config": {**BASE_CONFIG, **(defaults or {})},
        "make_model": lambda self: model_fn(self.observation_space, self.action_space, self.config),
        "loss": lambda self, batch: loss_fn(self.learner_model, batch, self.config),
    }
    if optimizer_fn is not None:
        namespace["make_optimizer"] = lambda self: optimizer_fn(self.model, self.config)
    if action_fn is not None:
        namespace["action"] = lambda self, obs, explore: action_fn(self.model, obs, explore, self.config)
    if postprocess_fn is not None:
        namespace["postprocess"] = lambda self, batch: postprocess_fn(self, batch)
    if stats_fn is not None:
        namespace["extra_stats"] = lambda self, batch, stats: stats_fn(self, batch, stats)
    return type(name, (Policy,), namespace)
