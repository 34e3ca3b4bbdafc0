"""A small numpy MLP policy with a flat parameter vector, for Evolution Strategies.

ES workers only run forward passes, so the policy is plain numpy: a worker does
not import torch (it starts faster and uses less memory), and the network is
described by a few integers and two arrays that pickle in microseconds.

Layout of the flat vector (``float32``): for each layer in order, its weight
matrix ``W`` of shape ``[out, in]`` row-major, then its bias ``b`` of shape
``[out]``. Hidden layers use ``tanh``; the output layer is linear.

Outputs become actions as follows:

- ``Discrete(n, start)``: the argmax of the ``n`` logits, plus ``start``
  (ties go to the lowest index, as ``np.argmax`` does);
- ``Box`` with finite bounds: ``low + (tanh(out) + 1) / 2 * (high - low)``, so
  every action lies inside the bounds;
- ``Box`` with an infinite bound: the raw output, clipped to the bounds.

Observations from a ``Box`` space are flattened; from a ``Discrete`` space they
are one-hot encoded. No observation normalization is applied (see
:mod:`rl.algos.es` for why).
"""
from __future__ import annotations

import logging
from typing import List, Sequence, Tuple

import gymnasium as gym
import numpy as np

logger = logging.getLogger(__name__)


class NumpyMLP:
    """An MLP ``obs -> tanh hidden layers -> linear outputs -> actions`` (see module doc).

    Args:
        obs_dim: length of a (flattened or one-hot) observation.
        out_dim: number of outputs: ``n`` logits (discrete) or the action size (Box).
        hidden: hidden layer widths, e.g. ``(32,)``; ``()`` gives a linear policy.
        discrete: True for a ``Discrete`` action space.
        action_start: the first action of a ``Discrete`` space (gymnasium's ``start``).
        low, high: the bounds of a ``Box`` action space (ignored when discrete).
        action_shape: the shape of one ``Box`` action.
        one_hot_obs: observations are ``Discrete`` indices to one-hot encode.
    """

    def __init__(self, obs_dim: int, out_dim: int, hidden: Sequence[int] = (32,),
                 discrete: bool = True, action_start: int = 0, low=None, high=None,
                 action_shape: Tuple[int, ...] = (), one_hot_obs: bool = False) -> None:
        if obs_dim < 1 or out_dim < 1 or any(int(h) < 1 for h in hidden):
            raise ValueError(f"layer sizes must be positive: obs_dim={obs_dim}, "
                             f"hidden={tuple(hidden)}, out_dim={out_dim}")
        self.obs_dim, self.out_dim = int(obs_dim), int(out_dim)
        self.hidden = tuple(int(h) for h in hidden)
        self.discrete = bool(discrete)
        self.action_start = int(action_start)
        self.action_shape = tuple(action_shape)
        self.one_hot_obs = bool(one_hot_obs)
        self.low = None if low is None else np.asarray(low, np.float32).reshape(-1)
        self.high = None if high is None else np.asarray(high, np.float32).reshape(-1)
        self.bounded = (not self.discrete and self.low is not None and self.high is not None
                        and bool(np.all(np.isfinite(self.low)) and np.all(np.isfinite(self.high))))
        sizes = (self.obs_dim, *self.hidden, self.out_dim)
        self.shapes: List[Tuple[int, int]] = [(sizes[i + 1], sizes[i]) for i in range(len(sizes) - 1)]
        self.num_params = sum(o * i + o for o, i in self.shapes)

    @classmethod
    def for_spaces(cls, observation_space: gym.Space, action_space: gym.Space,
                   hidden: Sequence[int] = (32,)) -> "NumpyMLP":
        """The MLP that maps ``observation_space`` to ``action_space``."""
        if isinstance(observation_space, gym.spaces.Discrete):
            obs_dim, one_hot = int(observation_space.n), True
        elif isinstance(observation_space, gym.spaces.Box):
            obs_dim, one_hot = int(np.prod(observation_space.shape)), False
        else:
            raise TypeError(f"ES supports Box and Discrete observations, got {observation_space}")
        if isinstance(action_space, gym.spaces.Discrete):
            return cls(obs_dim, int(action_space.n), hidden, discrete=True,
                       action_start=int(action_space.start), one_hot_obs=one_hot)
        if isinstance(action_space, gym.spaces.Box):
            return cls(obs_dim, int(np.prod(action_space.shape)), hidden, discrete=False,
                       low=action_space.low, high=action_space.high,
                       action_shape=tuple(action_space.shape), one_hot_obs=one_hot)
        raise TypeError(f"ES supports Discrete and Box actions, got {action_space}")

    def init_params(self, rng: np.random.Generator) -> np.ndarray:
        """Initial parameters: normalized-column Gaussian weights, zero biases.

        Each unit's incoming weights have norm 1 (hidden layers) or 0.01 (the
        output layer, so the first policy is nearly indifferent and the
        perturbations decide its actions), as in the OpenAI-ES code.
        """
        parts = []
        for layer, (out, inp) in enumerate(self.shapes):
            scale = 0.01 if layer == len(self.shapes) - 1 else 1.0
            w = rng.standard_normal((out, inp))
            w *= scale / np.linalg.norm(w, axis=1, keepdims=True)
            parts += [w.reshape(-1), np.zeros(out)]
        return np.concatenate(parts).astype(np.float32)

    def preprocess(self, obs: np.ndarray) -> np.ndarray:
        """A ``[N, obs_dim]`` float32 batch from ``N`` raw observations."""
        obs = np.asarray(obs)
        if self.one_hot_obs:
            return np.eye(self.obs_dim, dtype=np.float32)[obs.reshape(-1).astype(np.int64)]
        return obs.reshape(obs.shape[0], -1).astype(np.float32, copy=False)

    def _layers(self, params: np.ndarray):
        """(W, b) views per layer of ``params`` (``[dim]`` or ``[K, dim]``)."""
        lead = params.shape[:-1]
        offset = 0
        for out, inp in self.shapes:
            w = params[..., offset:offset + out * inp].reshape(*lead, out, inp)
            offset += out * inp
            b = params[..., offset:offset + out]
            offset += out
            yield w, b

    def forward(self, params: np.ndarray, obs: np.ndarray) -> np.ndarray:
        """Outputs ``[N, out_dim]`` of one parameter vector for a ``[N, obs_dim]`` batch."""
        self._check(params, 1)
        h = obs
        for layer, (w, b) in enumerate(self._layers(params)):
            h = h @ w.T + b
            if layer < len(self.shapes) - 1:
                h = np.tanh(h)
        return h

    def forward_each(self, params: np.ndarray, obs: np.ndarray) -> np.ndarray:
        """Outputs ``[K, out_dim]`` of ``K`` parameter vectors ``[K, dim]``, one observation each."""
        self._check(params, 2)
        h = obs
        for layer, (w, b) in enumerate(self._layers(params)):
            h = np.matmul(w, h[:, :, None])[:, :, 0] + b
            if layer < len(self.shapes) - 1:
                h = np.tanh(h)
        return h

    def actions(self, outputs: np.ndarray) -> np.ndarray:
        """Actions for a ``[N, out_dim]`` batch of outputs (see the module doc)."""
        if self.discrete:
            return np.argmax(outputs, axis=1) + self.action_start
        if self.bounded:
            acts = self.low + (np.tanh(outputs) + 1.0) * 0.5 * (self.high - self.low)
        else:
            acts = outputs
            if self.low is not None and self.high is not None:
                acts = np.clip(acts, self.low, self.high)
        return acts.astype(np.float32).reshape(len(outputs), *self.action_shape)

    def _check(self, params: np.ndarray, ndim: int) -> None:
        if params.ndim != ndim or params.shape[-1] != self.num_params:
            raise ValueError(f"expected parameters of shape {'[K, ' if ndim == 2 else '['}"
                             f"{self.num_params}], got {params.shape}")
