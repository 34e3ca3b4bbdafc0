"""Counterfactual policy evaluation of a value model, run after every epoch.

During an epoch the trainer keeps the rows of a sample of whole MDPs as they go by
in shuffled minibatches; at the end of the epoch it restores their original order
(by MDP, then position), computes the model's Q-values for all of them in one
batched pass, and scores the **target policy**: a softmax over the Q-values with
``temperature`` (``pi(a|s) = softmax(Q(s, .) / temperature)``; small temperatures
approach the greedy policy, 1.0 keeps the Q-values' scale, which for returns in
[0, 1] is close to uniform) against the logged behaviour.

Two views of the same sample:

- **sequential** (whole episodes, discounted by the trainer's gamma): per-decision
  IPS, weighted IS, direct method, doubly robust, weighted DR and MAGIC, with the
  model's Q-values as the value estimates (``cpe.Trajectories``);
- **one-step** (every decision on its own): IPS, self-normalized IPS, direct method
  and doubly robust (``cpe.BanditLog``), whose reward model is a ridge regression of
  the immediate reward on the normalized state, one per action, fit on the sample.

Every estimate comes with a bootstrap standard error and interval (``cpe.evaluate``).
"""
from __future__ import annotations

import logging
import math
from typing import Any, Dict

import numpy as np
import torch

logger = logging.getLogger(__name__)


def softmax_policy(q: np.ndarray, temperature: float) -> np.ndarray:
    """``softmax(q / temperature)`` per row, computed stably."""
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    z = q / temperature
    z = z - z.max(axis=1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=1, keepdims=True)


def _ridge_reward_model(features: np.ndarray, actions: np.ndarray, rewards: np.ndarray,
                        num_actions: int, alpha: float = 1e-2) -> np.ndarray:
    """Predicted immediate rewards ``[N, A]`` from one ridge regression per action."""
    x = np.concatenate([features, np.ones((len(features), 1))], axis=1).astype(np.float64)
    estimates = np.zeros((len(features), num_actions))
    fallback = float(rewards.mean()) if len(rewards) else 0.0
    for action in range(num_actions):
        rows = actions == action
        if rows.sum() < 2:
            estimates[:, action] = fallback
            continue
        xa = x[rows]
        gram = xa.T @ xa + alpha * np.eye(x.shape[1])
        weights = np.linalg.solve(gram, xa.T @ rewards[rows])
        estimates[:, action] = x @ weights
    return estimates


def _report_dict(report: Any) -> Dict[str, Dict[str, float]]:
    return {name: {"value": float(report[name].value), "stderr": float(report[name].stderr),
                   "ci_low": float(report[name].ci_low), "ci_high": float(report[name].ci_high)}
            for name in report}


@torch.no_grad()
def evaluate_sample(policy: Any, dataset: Any, rows: np.ndarray, temperature: float,
                    n_bootstrap: int = 200, seed: int = 0) -> Dict[str, Dict[str, Dict[str, float]]]:
    """CPE of ``policy``'s softmax policy on the sampled ``rows`` of ``dataset``.

    Returns ``{"sequential": {estimator: {value, stderr, ci_low, ci_high}},
    "one_step": {...}}``.
    """
    import cpe
    rows = dataset.episode_rows(np.asarray(rows))
    arrays = dataset.arrays
    obs = torch.as_tensor(arrays["obs"][rows])
    model = policy.model
    q = model(obs).numpy().astype(np.float64)
    probs = softmax_policy(q, temperature)
    actions = arrays["actions"][rows]
    rewards = arrays["rewards"][rows].astype(np.float64)
    propensities = arrays["propensities"][rows]
    results: Dict[str, Dict[str, Dict[str, float]]] = {}
    trajectories = cpe.Trajectories(arrays["mdp_ids"][rows], arrays["ordinals"][rows],
                                    actions, rewards, propensities, probs, q_estimates=q,
                                    gamma=dataset.gamma)
    results["sequential"] = _report_dict(cpe.evaluate(trajectories, n_bootstrap=n_bootstrap,
                                                      seed=seed))
    normalized = _normalized_features(model, obs)
    reward_model = _ridge_reward_model(normalized, actions, rewards, q.shape[1])
    bandit = cpe.BanditLog(actions, rewards, propensities, probs, reward_estimates=reward_model)
    results["one_step"] = _report_dict(cpe.evaluate(bandit, n_bootstrap=n_bootstrap, seed=seed))
    return results


def _normalized_features(model: Any, obs: torch.Tensor) -> np.ndarray:
    """The model's preprocessed inputs (the normalization module's output) as numpy."""
    preprocessor = getattr(model, "preprocessor", None)
    features = preprocessor(obs) if preprocessor is not None else torch.nan_to_num(obs)
    return features.numpy().astype(np.float64)


def flat_scalars(results: Dict[str, Dict[str, Dict[str, float]]]) -> Dict[str, float]:
    """``{"cpe/sequential/dr/value": ..., ...}`` for TensorBoard (finite values only)."""
    out = {}
    for view, estimates in results.items():
        for name, fields in estimates.items():
            for field, value in fields.items():
                if math.isfinite(value):
                    out[f"cpe/{view}/{name}/{field}"] = value
    return out
