"""A uniform experience replay buffer with multi-step returns over vector envs.

Data flow::

    vector step (N members) --add()--> one n-step window per member --> ring buffer
                                       (deque of pending steps)          (preallocated arrays)
    sample(batch_size) <-- uniform indices from a seeded numpy Generator

Each member's window holds the steps whose transition is not complete yet. With
``n_step = n`` a stored transition starting at step ``t`` of an episode is::

    obs        s_t
    actions    a_t
    rewards    r_t + gamma r_{t+1} + ... + gamma^(k-1) r_{t+k-1}
    next_obs   s_{t+k}           (the true next observation, also at an episode end)
    terminated True when the episode terminated at step t+k-1 (no bootstrap)
    discounts  gamma^k           (the discount of the bootstrap term actually used)
    next_actions a_{t+k}         (SARSA, with track_next_action; else -1, see below)

with ``k = n`` normally and ``k < n`` for the last steps of an episode: when a
member's episode ends (terminated *or* truncated) its window is flushed, every
pending step becoming a transition that ends at the episode's last step. A
truncated episode (time limit) keeps ``terminated`` False, so the learner
bootstraps from the true final observation; a terminated one does not bootstrap.
Windows never mix members or episodes.

``track_next_action=True`` (SARSA) holds each transition back one more step, until
``a_{t+n}`` is known. At an episode end the next action is known only if the
caller passes ``final_actions`` (e.g. the behaviour policy's action at the final
observation of a truncated episode); otherwise ``-1`` is stored (a terminated
transition never uses it).

Extra arrays: ``extras`` are stored with a transition's first step (anything
describing ``s_t``), ``next_extras`` with its last step (anything describing the
step's next observation, e.g. the possible next actions of ``s_{t+k}``). Declare
their per-row shapes and dtypes up front in ``extra_specs``.

Pitfalls: ``capacity`` counts transitions, not env steps; the buffer holds up to
``(n_step + track_next_action) * num_envs`` steps in the windows that are not yet
sampleable; the windows are not part of any checkpoint.
"""
from __future__ import annotations

import logging
from collections import deque
from typing import Any, Deque, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np

logger = logging.getLogger(__name__)

ExtraSpecs = Mapping[str, Tuple[Tuple[int, ...], Any]]


class ReplayBuffer:
    """A ring buffer of n-step transitions from ``num_envs`` members (see the module docstring).

    ``capacity``: transitions kept (the oldest are overwritten). ``obs_shape`` and
    ``obs_dtype``: one observation. ``action_shape`` and ``action_dtype``: one action
    (``()`` and int64 for discrete spaces). ``n_step``: steps summed per transition
    (>= 1). ``gamma``: discount per env step, in [0, 1]. ``extra_specs``: name ->
    (per-row shape, dtype) of the extra arrays (keys of ``extras`` or
    ``next_extras`` in :meth:`add`). ``seed``: seeds the sampling generator.
    """

    def __init__(self, capacity: int, obs_shape: Sequence[int], num_envs: int = 1,
                 n_step: int = 1, gamma: float = 0.99, action_shape: Sequence[int] = (),
                 action_dtype: Any = np.int64, obs_dtype: Any = np.float32,
                 extra_specs: Optional[ExtraSpecs] = None, track_next_action: bool = False,
                 seed: Optional[int] = None) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be at least 1, got {capacity}")
        if n_step < 1:
            raise ValueError(f"n_step must be at least 1, got {n_step}")
        if not 0.0 <= gamma <= 1.0:
            raise ValueError(f"gamma must be in [0, 1], got {gamma}")
        if num_envs < 1:
            raise ValueError(f"num_envs must be at least 1, got {num_envs}")
        self.capacity, self.num_envs = int(capacity), int(num_envs)
        self.n_step, self.gamma = int(n_step), float(gamma)
        self.track_next_action = bool(track_next_action)
        self.rng = np.random.default_rng(seed)
        obs_shape, action_shape = tuple(obs_shape), tuple(action_shape)
        self.arrays: Dict[str, np.ndarray] = {
            "obs": np.zeros((capacity, *obs_shape), obs_dtype),
            "actions": np.zeros((capacity, *action_shape), action_dtype),
            "rewards": np.zeros(capacity, np.float32),
            "next_obs": np.zeros((capacity, *obs_shape), obs_dtype),
            "terminated": np.zeros(capacity, bool),
            "discounts": np.zeros(capacity, np.float32),
            "next_actions": np.zeros((capacity, *action_shape), action_dtype),
        }
        self.extra_names = tuple(extra_specs or ())
        for name, (shape, dtype) in (extra_specs or {}).items():
            if name in self.arrays:
                raise ValueError(f"extra array {name!r} clashes with a built-in key")
            self.arrays[name] = np.zeros((capacity, *tuple(shape)), dtype)
        self.position = 0
        self.size = 0
        self.windows: List[Deque[Dict[str, Any]]] = [deque() for _ in range(self.num_envs)]
        # gamma^0 .. gamma^n, so a k-step reward sum is one dot product
        self.powers = self.gamma ** np.arange(self.n_step + 1)

    def __len__(self) -> int:
        return self.size

    def add(self, obs: np.ndarray, actions: np.ndarray, rewards: np.ndarray,
            terminated: np.ndarray, truncated: np.ndarray, next_obs: np.ndarray,
            extras: Optional[Mapping[str, np.ndarray]] = None,
            next_extras: Optional[Mapping[str, np.ndarray]] = None,
            final_actions: Optional[np.ndarray] = None) -> int:
        """Add one vector step (arrays of length ``num_envs``); returns transitions stored.

        ``next_obs`` must be the true next observation (the final one where an
        episode ended). ``final_actions[i]`` is used as the next action of the
        transitions flushed by member ``i``'s episode end (SARSA; optional).
        """
        if len(obs) != self.num_envs:
            raise ValueError(f"expected {self.num_envs} rows (one per member), got {len(obs)}")
        extras, next_extras = extras or {}, next_extras or {}
        unknown = (set(extras) | set(next_extras)) - set(self.extra_names)
        if unknown:
            raise KeyError(f"extra arrays {sorted(unknown)} were not declared in extra_specs "
                           f"(declared: {list(self.extra_names)})")
        stored = 0
        lookahead = int(self.track_next_action)
        for member in range(self.num_envs):
            window = self.windows[member]
            window.append({  # copies: the caller may reuse its arrays
                "obs": np.array(obs[member]), "action": actions[member],
                "reward": float(rewards[member]), "next_obs": np.array(next_obs[member]),
                "extras": {k: np.array(v[member]) for k, v in extras.items()},
                "next_extras": {k: np.array(v[member]) for k, v in next_extras.items()},
            })
            if terminated[member] or truncated[member]:
                final = None if final_actions is None else final_actions[member]
                while window:
                    if len(window) > self.n_step:  # SARSA look-ahead: a full transition first
                        self._store(window, self.n_step, False, window[self.n_step]["action"])
                    else:
                        self._store(window, len(window), bool(terminated[member]), final)
                    window.popleft()
                    stored += 1
            elif len(window) == self.n_step + lookahead:
                following = window[self.n_step]["action"] if lookahead else None
                self._store(window, self.n_step, False, following)
                window.popleft()
                stored += 1
        return stored

    def _store(self, window: Deque[Dict[str, Any]], span: int, terminated: bool,
               next_action: Any) -> None:
        """Write the transition starting at ``window[0]`` and spanning ``span`` steps."""
        first, last = window[0], window[span - 1]
        rewards = np.fromiter((window[i]["reward"] for i in range(span)), np.float64, span)
        row = self.position
        arrays = self.arrays
        arrays["obs"][row] = first["obs"]
        arrays["actions"][row] = first["action"]
        arrays["rewards"][row] = float(rewards @ self.powers[:span])
        arrays["next_obs"][row] = last["next_obs"]
        arrays["terminated"][row] = terminated
        arrays["discounts"][row] = self.powers[span]
        arrays["next_actions"][row] = -1 if next_action is None else next_action
        for name, value in first["extras"].items():
            arrays[name][row] = value
        for name, value in last["next_extras"].items():
            arrays[name][row] = value
        self.position = (row + 1) % self.capacity
        self.size = min(self.size + 1, self.capacity)

    def sample(self, batch_size: int) -> Dict[str, np.ndarray]:
        """``batch_size`` transitions drawn uniformly with replacement (copies)."""
        if self.size == 0:
            raise ValueError("cannot sample from an empty replay buffer")
        index = self.rng.integers(0, self.size, size=int(batch_size))
        return {name: array[index] for name, array in self.arrays.items()}

    def pending(self) -> int:
        """Steps waiting in the members' windows (not yet sampleable)."""
        return sum(len(window) for window in self.windows)

    def clear_windows(self) -> None:
        """Drop the pending steps (e.g. when the env is reset outside the buffer's view)."""
        for window in self.windows:
            window.clear()
