"""Parametric actions: a discrete env whose actions are described by feature vectors,
with a possibly changing set of actions on offer in each state.

:class:`ParametricActions` wraps a ``Discrete(n)`` env. Each observation becomes one
flat ``float32`` vector (so vector envs can stack it like any ``Box``)::

    [ state (S) | action features (A_max * K, slot-major) | mask (A_max) ]

where slot ``j`` of the ``A_max`` slots lists one possible action by its ``K``
features and ``mask[j]`` is 1 for listed slots and 0 for padding. The agent's
action is a **slot index** (the action space is ``Discrete(A_max)``); the wrapper
steps the inner env with the action listed in that slot. :class:`ParametricLayout`
splits such vectors (numpy arrays or torch tensors) back into the three parts; its
:meth:`ParametricLayout.policy_config` gives the sizes a parametric policy needs.

Features: ``action_features[i]`` describes inner action ``i`` (default: one-hot,
``K = n``). For CartPole-v1 ``[[1, 0], [0, 1]]`` (push left, push right) is the
default; ``[[-1, 1], [1, 1]]`` (direction, force) is a richer alternative.

Changing action sets: with ``hide_probability > 0`` each inner action is left off
the list independently with that probability at every step (at least one action
always stays), and ``shuffle=True`` lists the actions in a random slot order, so a
policy can only choose by features, never by slot number. The randomness comes from
a generator seeded by ``reset(seed=...)`` (or ``seed`` at construction).

Pitfall: hiding actions changes the task (the agent may be denied the best action),
so compare returns only between runs with the same settings.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Dict, Optional, Tuple

import gymnasium as gym
import numpy as np

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ParametricLayout:
    """Sizes of the flat parametric observation: ``state_size`` S, ``max_actions``
    A_max, ``feature_size`` K (see the module docstring)."""

    state_size: int
    max_actions: int
    feature_size: int

    @property
    def size(self) -> int:
        """Length of one flat observation."""
        return self.state_size + self.max_actions * (self.feature_size + 1)

    def split(self, obs: Any) -> Tuple[Any, Any, Any]:
        """``(state [B, S], features [B, A_max, K], mask [B, A_max] bool)`` of ``obs [B, size]``
        (numpy or torch; views where possible)."""
        if obs.shape[-1] != self.size:
            raise ValueError(f"a parametric observation has {self.size} values (state {self.state_size}"
                             f" + {self.max_actions} x {self.feature_size} features + "
                             f"{self.max_actions} mask), got {obs.shape[-1]}; wrap the env with "
                             "rl.envs.parametric.ParametricActions")
        s, f = self.state_size, self.state_size + self.max_actions * self.feature_size
        features = obs[:, s:f].reshape(len(obs), self.max_actions, self.feature_size)
        return obs[:, :s], features, obs[:, f:] > 0.5

    def policy_config(self) -> Dict[str, int]:
        """The config keys of :class:`rl.algos.parametric_dqn.ParametricDQN` for this layout."""
        return {"state_size": self.state_size, "max_actions": self.max_actions,
                "action_feature_size": self.feature_size}


class ParametricActions(gym.Wrapper):
    """Turn a ``Discrete(n)`` env into a parametric-action env (see the module docstring).

    ``action_features``: ``[n, K]`` features of the inner actions (default one-hot).
    ``max_actions``: slots per state (default ``n``; at least ``n``, extra slots are
    padding). ``hide_probability``: chance that an action is left off a state's list.
    ``shuffle``: list actions in a random slot order. ``seed``: seeds the list
    randomness until ``reset(seed=...)`` reseeds it.
    """

    def __init__(self, env: gym.Env, action_features: Optional[np.ndarray] = None,
                 max_actions: Optional[int] = None, hide_probability: float = 0.0,
                 shuffle: bool = False, seed: Optional[int] = None) -> None:
        super().__init__(env)
        if not isinstance(env.action_space, gym.spaces.Discrete):
            raise TypeError(f"ParametricActions wraps Discrete action spaces, got {env.action_space}")
        if len(env.observation_space.shape or ()) != 1:
            raise TypeError(f"ParametricActions needs a flat Box observation, got {env.observation_space}")
        n = int(env.action_space.n)
        features = np.eye(n, dtype=np.float32) if action_features is None else \
            np.asarray(action_features, dtype=np.float32)
        if features.ndim != 2 or len(features) != n:
            raise ValueError(f"action_features must have shape [{n}, K], got {features.shape}")
        max_actions = n if max_actions is None else int(max_actions)
        if max_actions < n:
            raise ValueError(f"max_actions ({max_actions}) must be at least the {n} actions")
        if not 0.0 <= hide_probability < 1.0:
            raise ValueError(f"hide_probability must be in [0, 1), got {hide_probability}")
        self.features, self.hide_probability, self.shuffle = features, float(hide_probability), shuffle
        self.layout = ParametricLayout(int(env.observation_space.shape[0]), max_actions, features.shape[1])
        inner = env.observation_space
        low = np.concatenate([np.broadcast_to(inner.low, inner.shape),
                              np.full(max_actions * features.shape[1], min(0.0, features.min())),
                              np.zeros(max_actions)]).astype(np.float32)
        high = np.concatenate([np.broadcast_to(inner.high, inner.shape),
                               np.full(max_actions * features.shape[1], max(0.0, features.max())),
                               np.ones(max_actions)]).astype(np.float32)
        self.observation_space = gym.spaces.Box(low, high, dtype=np.float32)
        self.action_space = gym.spaces.Discrete(max_actions)
        self.rng = np.random.default_rng(seed)
        self.listed = np.arange(n)  # inner action in each listed slot

    def _draw_list(self) -> None:
        n = len(self.features)
        listed = np.arange(n)
        if self.hide_probability > 0.0:
            keep = self.rng.random(n) >= self.hide_probability
            if not keep.any():
                keep[self.rng.integers(n)] = True
            listed = listed[keep]
        if self.shuffle:
            listed = self.rng.permutation(listed)
        self.listed = listed

    def observation(self, state: np.ndarray) -> np.ndarray:
        """The flat observation of ``state`` with the current list of actions."""
        k = self.layout.feature_size
        features = np.zeros((self.layout.max_actions, k), np.float32)
        features[:len(self.listed)] = self.features[self.listed]
        mask = np.zeros(self.layout.max_actions, np.float32)
        mask[:len(self.listed)] = 1.0
        return np.concatenate([np.asarray(state, np.float32), features.ravel(), mask])

    def reset(self, *, seed: Optional[int] = None, options: Optional[dict] = None) -> Tuple[np.ndarray, dict]:
        """Reset the inner env (and the list generator when ``seed`` is given)."""
        if seed is not None:
            self.rng = np.random.default_rng(seed)
        state, info = self.env.reset(seed=seed, options=options)
        self._draw_list()
        return self.observation(state), info

    def step(self, action: Any) -> Tuple[np.ndarray, Any, bool, bool, dict]:
        """Step with the inner action listed in slot ``action``."""
        slot = int(action)
        if not 0 <= slot < len(self.listed):
            raise ValueError(f"slot {slot} lists no action in this state ({len(self.listed)} listed)")
        state, reward, terminated, truncated, info = self.env.step(int(self.listed[slot]))
        self._draw_list()
        return self.observation(state), reward, terminated, truncated, info


def parametric_env(env_id: str, **wrapper_kwargs: Any) -> ParametricActions:
    """``gymnasium.make(env_id)`` wrapped in :class:`ParametricActions` (a picklable
    constructor with ``functools.partial``, for envs stepped in other processes)."""
    return ParametricActions(gym.make(env_id), **wrapper_kwargs)
