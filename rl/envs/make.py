"""Make an environment from an id, a constructor or an old-gym-style object.

``make_env("CartPole-v1", seed=3)`` returns a gymnasium environment whose first
``reset()`` uses ``seed`` (so two runs with the same seed see the same episodes)
and whose action space is seeded too. Accepted specs:

- a gymnasium id (``"CartPole-v1"``, ``"Pendulum-v1"``, ``"rl/Gridworld-v0"``);
- a callable returning an environment (run in the process that steps it, which
  is what remote vector envs need: a constructor travels, an env may not);
- an environment object, gymnasium-style or old-gym-style.

Old-gym-style envs (``reset() -> obs``, ``step() -> (obs, reward, done, info)``,
``seed(n)``) are wrapped in :class:`OldGymAdapter`; their ``done`` is reported as
``terminated`` unless the info says ``TimeLimit.truncated``.
"""
from __future__ import annotations

import logging
from typing import Any, Callable, Optional, Tuple, Union

import gymnasium as gym
import numpy as np

logger = logging.getLogger(__name__)

EnvSpec = Union[str, Callable[[], Any], Any]

GRIDWORLD_ID = "rl/Gridworld-v0"


def _register_builtin() -> None:
    if GRIDWORLD_ID not in gym.registry:
        gym.register(GRIDWORLD_ID, entry_point="rl.envs.gridworld:Gridworld")


class OldGymAdapter(gym.Env):
    """Present an old-gym-style environment (4-tuple ``step``) with gymnasium's API."""

    def __init__(self, env: Any) -> None:
        self.env = env
        self.observation_space = env.observation_space
        self.action_space = env.action_space
        self._pending_seed: Optional[int] = None

    def reset(self, *, seed: Optional[int] = None, options: Optional[dict] = None) -> Tuple[Any, dict]:
        """Reset, seeding the wrapped env through its ``seed`` method when given."""
        if seed is not None and hasattr(self.env, "seed"):
            self.env.seed(seed)
        result = self.env.reset()
        if isinstance(result, tuple) and len(result) == 2 and isinstance(result[1], dict):
            return result
        return result, {}

    def step(self, action: Any) -> Tuple[Any, float, bool, bool, dict]:
        """Step; ``done`` becomes ``terminated`` or, for time limits, ``truncated``."""
        result = self.env.step(action)
        if len(result) == 5:
            return result
        obs, reward, done, info = result
        truncated = bool(done and info.get("TimeLimit.truncated", False))
        return obs, float(reward), bool(done) and not truncated, truncated, info

    def close(self) -> None:
        """Close the wrapped env if it can be closed."""
        close = getattr(self.env, "close", None)
        if close is not None:
            close()


def _is_old_style(env: Any) -> bool:
    return (not isinstance(env, (gym.Env, type)) and hasattr(env, "step")
            and hasattr(env, "reset"))


def make_env(spec: EnvSpec, seed: Optional[int] = None, **kwargs: Any) -> gym.Env:
    """A gymnasium env from ``spec`` (id, constructor or object), seeded with ``seed``.

    ``kwargs`` go to ``gymnasium.make`` for ids. The env's first ``reset()`` without
    a seed uses ``seed``; the action space is seeded with it as well.
    """
    _register_builtin()
    if isinstance(spec, str):
        try:
            env = gym.make(spec, **kwargs)
        except gym.error.Error as error:
            raise ValueError(f"unknown environment {spec!r}: {error}") from None
    elif isinstance(spec, gym.Env) or _is_old_style(spec):
        env = spec
    elif callable(spec):
        env = spec(**kwargs)
    else:
        raise TypeError(f"an environment spec is an id, a callable or an env, got {type(spec).__name__}")
    if _is_old_style(env):
        env = OldGymAdapter(env)
    if not isinstance(env, gym.Env):
        raise TypeError(f"{spec!r} did not make an environment (got {type(env).__name__})")
    if seed is not None:
        env = _SeedOnFirstReset(env, int(seed))
        env.action_space.seed(int(seed))
    return env


class _SeedOnFirstReset(gym.Wrapper):
    """Use the run's seed for the first reset that names none."""

    def __init__(self, env: gym.Env, seed: int) -> None:
        super().__init__(env)
        self._first_seed: Optional[int] = seed

    def reset(self, *, seed: Optional[int] = None, options: Optional[dict] = None):
        if seed is None and self._first_seed is not None:
            seed = self._first_seed
        self._first_seed = None
        return self.env.reset(seed=seed, options=options)


def reward_threshold(spec: EnvSpec) -> Optional[float]:
    """The env's registered reward threshold (CartPole-v1: 475), or None."""
    _register_builtin()
    if isinstance(spec, str):
        try:
            return gym.spec(spec).reward_threshold
        except gym.error.Error:
            return None
    env_spec = getattr(spec, "spec", None)
    return getattr(env_spec, "reward_threshold", None)


def space_shape(space: gym.Space) -> Tuple[int, ...]:
    """The shape of one observation or action of ``space``."""
    return tuple(space.shape) if space.shape is not None else ()


def is_discrete(space: gym.Space) -> bool:
    """True for ``Discrete`` action spaces."""
    return isinstance(space, gym.spaces.Discrete)


def clip_action(space: gym.Space, action: np.ndarray) -> np.ndarray:
    """Clip continuous actions into ``space``'s bounds; discrete ones pass through."""
    if isinstance(space, gym.spaces.Box):
        return np.clip(action, space.low, space.high)
    return action
