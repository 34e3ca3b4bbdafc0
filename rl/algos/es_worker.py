"""The ES pool task: evaluate a batch of antithetic perturbation pairs in one worker.

Data flow of one task (learner -> worker -> learner)::

    ESTask (plain data, a few KB)            worker process (module globals)
      env spec, NumpyMLP, theta [dim],  -->  shared_table(noise_seed, size)  built once
      sigma, noise seed/size,                _ENVS[spec]                      made once
      noise offsets [k], episode seeds [k]   run 2k episodes side by side:
                                              theta + sigma*eps_j, theta - sigma*eps_j
    ESResult  <-------------------------------  returns [k, 2], lengths [k, 2], seconds

Only offsets into the shared noise table travel, never noise vectors; ``theta``
travels once per task. Everything here is module-level and picklable by
reference, so the task runs unchanged on every fiberrl backend (a worker imports
this module; it never imports torch).

Both members of pair ``j`` start from the same episode seed (common random
numbers), so their return difference measures the perturbation, not the luck
of the start state. The ``2k`` episodes step in lockstep so that each step
costs one batched forward pass (``NumpyMLP.forward_each``) for all live members.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any, Dict, List, Optional

import numpy as np

from ..envs import EnvSpec, make_env
from .noise_table import shared_table
from .numpy_policy import NumpyMLP

logger = logging.getLogger(__name__)

HARD_STEP_CAP = 100_000  # an episode of an env without a time limit stops here
_ENVS: Dict[str, List[Any]] = {}  # env id -> envs this worker made for it (reset per episode)


@dataclass
class ESTask:
    """One pool task: ``len(noise_indices)`` antithetic pairs around ``theta``."""

    env: EnvSpec  # gymnasium id or picklable constructor
    policy: NumpyMLP
    theta: np.ndarray  # float32 [dim], the current (unperturbed) parameters
    sigma: float  # perturbation scale
    noise_seed: int
    noise_size: int
    noise_indices: np.ndarray  # int64 [k], offsets into the noise table
    episode_seeds: np.ndarray  # int64 [k], one reset seed per pair
    max_episode_steps: Optional[int] = None


@dataclass
class ESResult:
    """What a task sends back: per pair, the (+eps, -eps) returns and lengths."""

    returns: np.ndarray  # float64 [k, 2]
    lengths: np.ndarray  # int64 [k, 2]
    seconds: float  # time spent in the task, in the worker


def _envs_for(spec: EnvSpec, count: int) -> List[Any]:
    """``count`` envs of ``spec``; for ids, reused from this worker's cache."""
    if not isinstance(spec, str):
        return [make_env(spec) for _ in range(count)]
    cached = _ENVS.setdefault(spec, [])
    while len(cached) < count:
        cached.append(make_env(spec))
    return cached[:count]


def _native(action: np.ndarray) -> Any:
    """A Python int for a discrete action, the array row otherwise."""
    return int(action) if action.ndim == 0 else action


def perturbed_params(theta: np.ndarray, sigma: float, eps: np.ndarray) -> np.ndarray:
    """The ``[2k, dim]`` float32 policies of ``k`` pairs: row ``2j`` is ``theta + sigma * eps[j]``,
    row ``2j + 1`` is ``theta - sigma * eps[j]``."""
    theta = np.asarray(theta, np.float32)
    sigma = np.float32(sigma)
    params = np.empty((2 * len(eps), theta.size), np.float32)
    params[0::2] = theta + sigma * eps
    params[1::2] = theta - sigma * eps
    return params


def evaluate_task(task: ESTask) -> ESResult:
    """Run both members of every pair of ``task`` for one episode each (see module doc)."""
    started = time.perf_counter()
    policy, pairs = task.policy, len(task.noise_indices)
    dim = policy.num_params
    table = shared_table(task.noise_seed, task.noise_size)
    eps = table.stack(task.noise_indices, dim)  # [k, dim]
    params = perturbed_params(task.theta, task.sigma, eps)
    cap = HARD_STEP_CAP if task.max_episode_steps is None else int(task.max_episode_steps)

    envs = _envs_for(task.env, 2 * pairs)
    try:
        first = [env.reset(seed=int(task.episode_seeds[m // 2]))[0] for m, env in enumerate(envs)]
        obs = policy.preprocess(np.stack(first))
        returns = np.zeros(2 * pairs, np.float64)
        lengths = np.zeros(2 * pairs, np.int64)
        live = np.arange(2 * pairs)
        live_params = params
        while live.size:
            actions = policy.actions(policy.forward_each(live_params, obs))
            keep = np.ones(live.size, bool)
            for slot, member in enumerate(live):
                next_obs, reward, terminated, truncated, _ = envs[member].step(_native(actions[slot]))
                returns[member] += float(reward)
                lengths[member] += 1
                if terminated or truncated or lengths[member] >= cap:
                    keep[slot] = False
                else:
                    obs[slot] = policy.preprocess(np.asarray(next_obs)[None])[0]
            if not keep.all():
                live, live_params, obs = live[keep], live_params[keep], obs[keep]
    finally:
        if not isinstance(task.env, str):
            for env in envs:
                env.close()
    return ESResult(returns.reshape(pairs, 2), lengths.reshape(pairs, 2),
                    time.perf_counter() - started)
