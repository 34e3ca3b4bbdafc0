"""Logged data to try the pipeline on: episodes of a gymnasium env (or the Gridworld)
under an epsilon-greedy logging policy, written as logged rows with the policy's
action probabilities.

Each env step becomes one row:

- ``mdp_id`` ``"s<seed>-e<episode>"``; ``sequence_number`` the step index (0, 1, ...);
- ``state_features``: for the Gridworld and other discrete observation spaces the
  sparse map ``{"<cell>": 1.0}`` (the dense state over ids ``"0" .. "n-1"`` read back
  by :func:`rl.data.read_transitions` is the one-hot observation); for box
  observations ``{"0": x0, "1": x1, ...}`` over the flattened observation;
- ``action``: the Gridworld's names ``L R U D``, else ``str(action index)``;
- ``action_probability``: ``epsilon / n + (1 - epsilon) * [action == greedy]``;
- ``reward`` and ``possible_actions`` (every action).

The greedy action is the argmax of the exact Q* (:func:`rl.envs.optimal_q`) on the
Gridworld, and a pole-angle rule on CartPole; other envs need ``epsilon = 1.0``
(uniform random, every probability ``1 / n``). Only discrete action spaces are
supported. The state after an episode's last step is not logged, so the Timeline
makes the last row terminal, also for episodes cut by a time limit.
"""
from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, Optional, Union

import numpy as np

from .writers import LoggedRowWriter

logger = logging.getLogger(__name__)

GREEDY_GAMMA = 0.9  # discount of the Gridworld Q* behind the greedy action


def _features(observation: Any, info: Dict[str, Any], discrete_obs: bool) -> Dict[str, float]:
    if "state" in info and np.ndim(info["state"]) == 0:
        return {str(int(info["state"])): 1.0}
    if discrete_obs:
        return {str(int(observation)): 1.0}
    flat = np.asarray(observation, dtype=np.float64).ravel()
    return {str(i): float(v) for i, v in enumerate(flat)}


def _greedy_policy(env: Any, env_id: str) -> Optional[Callable[[Any, Dict[str, Any]], int]]:
    from rl.envs import Gridworld, optimal_q
    base = env.unwrapped
    if isinstance(base, Gridworld):
        q = optimal_q(base, GREEDY_GAMMA)
        return lambda obs, info: int(np.argmax(q[int(info["state"])]))
    if env_id.startswith("CartPole"):
        return lambda obs, info: int(obs[2] + 0.5 * obs[3] > 0.0)
    return None


def logged_rows(env_id: str, episodes: int, epsilon: float,
                seed: int = 0) -> Iterator[Dict[str, Any]]:
    """Logged rows of ``episodes`` episodes of ``env_id`` under epsilon-greedy logging."""
    import gymnasium as gym
    from rl.envs import Gridworld, make_env
    if not 0.0 <= epsilon <= 1.0:
        raise ValueError(f"epsilon must be in [0, 1], got {epsilon}")
    if episodes < 1:
        raise ValueError(f"episodes must be positive, got {episodes}")
    env = make_env(env_id, seed=seed)
    try:
        if not isinstance(env.action_space, gym.spaces.Discrete):
            raise ValueError(f"{env_id}: only discrete action spaces are supported, got "
                             f"{env.action_space}")
        n = int(env.action_space.n)
        names = (list(Gridworld.ACTION_NAMES) if isinstance(env.unwrapped, Gridworld)
                 else [str(a) for a in range(n)])
        greedy = _greedy_policy(env, env_id)
        if greedy is None and epsilon < 1.0:
            raise ValueError(f"{env_id}: no greedy policy is known; use epsilon 1.0 (uniform)")
        discrete_obs = isinstance(env.observation_space, gym.spaces.Discrete)
        rng = np.random.default_rng(seed)
        for episode in range(episodes):
            observation, info = env.reset()
            step, done = 0, False
            while not done:
                best = greedy(observation, info) if greedy is not None else 0
                action = int(rng.integers(n)) if rng.random() < epsilon else best
                probability = epsilon / n + (1.0 - epsilon) * (action == best)
                state = _features(observation, info, discrete_obs)
                observation, reward, terminated, truncated, info = env.step(action)
                done = terminated or truncated
                yield {"mdp_id": f"s{seed}-e{episode}", "sequence_number": step,
                       "state_features": state, "action": names[action],
                       "action_probability": float(probability), "reward": float(reward),
                       "possible_actions": names}
                step += 1
    finally:
        env.close()


def generate_logged_data(env_id: str, episodes: int, epsilon: float, out: Union[str, Path],
                         seed: int = 0, format: Optional[str] = None) -> Dict[str, Any]:
    """Write ``episodes`` logged episodes of ``env_id`` to ``out``; returns counts."""
    with LoggedRowWriter(out, format) as writer:
        for row in logged_rows(env_id, episodes, epsilon, seed):
            writer.write(row)
    logger.info("generate: %d rows of %d episodes of %s -> %s", writer.rows, episodes, env_id, out)
    return {"rows": writer.rows, "episodes": episodes, "path": str(out), "format": writer.format}
