"""Proximal Policy Optimization (Schulman et al. 2017, "Proximal Policy
Optimization Algorithms", arXiv:1707.06347), written with :func:`rl.build_policy`.

Pieces, each a plain function below:

- ``actor_critic``: separate actor and critic MLPs (tanh, orthogonal init). Discrete
  spaces get categorical logits; ``Box`` spaces a Gaussian whose mean is the actor's
  output and whose log standard deviation is a learned, state-independent vector.
- ``act``: samples (or, for evaluation, takes the mode) and keeps the log-probability
  and the value of every step for the loss.
- ``gae``: generalized advantage estimation (Schulman et al. 2016) over the
  ``[T, N]`` rollout, bootstrapping from the value of the true next observation, so
  a time-limit truncation is not mistaken for a terminal state.
- ``ppo_loss``: the clipped surrogate objective, the value loss (``vf_coef``), the
  entropy bonus (``ent_coef``), advantages normalized per minibatch.

Config (defaults tuned on CartPole-v1 with 4 envs; every key is documented in
``DEFAULTS``). Pitfalls: ``rollout_length * num_envs`` is the batch; it must be a
multiple of ``minibatch_size`` to use every sample each epoch. Continuous actions
are clipped to the action space by the run loop, but the log-probability is of the
unclipped sample, as in the paper's implementations.
"""
from __future__ import annotations

import logging
import math
from typing import Any, Dict, Tuple

import numpy as np
import torch
from torch import nn

from ..policy import build_policy

logger = logging.getLogger(__name__)

DEFAULTS: Dict[str, Any] = {
    "lr": 2.5e-4,            # Adam step size, linearly decayed to 0 over total_steps
    "lr_schedule": "linear",
    "gamma": 0.99,           # discount per step
    "gae_lambda": 0.95,      # GAE's bias/variance trade-off (1: Monte Carlo, 0: TD(0))
    "batch_mode": "fragments",
    "rollout_length": 128,   # vector steps per update (batch = rollout_length * num_envs)
    "num_epochs": 4,         # passes over each batch
    "minibatch_size": 128,   # rows per gradient step
    "clip": 0.2,             # probability-ratio clip range epsilon
    "clip_value": True,      # clip the value update around the old value as well
    "vf_coef": 0.5,          # weight of the value loss
    "ent_coef": 0.01,        # weight of the entropy bonus
    "max_grad_norm": 0.5,    # global gradient-norm clip
    "hidden": (64, 64),      # hidden sizes of actor and critic
    "init_log_std": 0.0,     # initial log standard deviation (continuous actions)
    "reward_scale": 1.0,     # rewards are multiplied by this before GAE (Pendulum: 0.1)
}

# Settings for continuous actions (Box spaces), measured on Pendulum-v1: longer
# rollouts, more epochs, scaled rewards, no entropy bonus, a shorter horizon, and a
# constant step size of 1e-3 (as Stable-Baselines3's zoo tunes Pendulum): with 3e-4
# decayed linearly, 100k steps ended at -1,082 / -1,025 / -1,089 (seeds 0/1/2), with
# 1e-3 constant at -285 / -113 / -188.
CONTINUOUS_DEFAULTS: Dict[str, Any] = {
    "lr": 1e-3, "lr_schedule": "constant", "rollout_length": 512, "num_epochs": 10,
    "minibatch_size": 256, "reward_scale": 0.1, "ent_coef": 0.0, "gamma": 0.95,
    "gae_lambda": 0.9,
}


def _mlp(sizes: Tuple[int, ...], last_gain: float) -> nn.Sequential:
    layers = []
    for i, (fan_in, fan_out) in enumerate(zip(sizes[:-1], sizes[1:])):
        linear = nn.Linear(fan_in, fan_out)
        last = i == len(sizes) - 2
        nn.init.orthogonal_(linear.weight, last_gain if last else math.sqrt(2))
        nn.init.zeros_(linear.bias)
        layers.append(linear)
        if not last:
            layers.append(nn.Tanh())
    return nn.Sequential(*layers)


class ActorCritic(nn.Module):
    """Actor and critic MLPs; ``log_std`` exists for continuous actions only."""

    def __init__(self, obs_size: int, action_size: int, hidden: Tuple[int, ...],
                 continuous: bool, init_log_std: float) -> None:
        super().__init__()
        self.actor = _mlp((obs_size, *hidden, action_size), 0.01)
        self.critic = _mlp((obs_size, *hidden, 1), 1.0)
        self.continuous = continuous
        if continuous:
            self.log_std = nn.Parameter(torch.full((action_size,), float(init_log_std)))

    def forward(self, obs: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(actor output, standard deviations, values)``; the standard deviations are
        empty for discrete actions. The loss goes through ``forward`` so that a
        DistributedDataParallel wrapper sees every parameter used."""
        out = self.actor(obs)
        std = self.log_std.exp().expand_as(out) if self.continuous else out.new_zeros(0)
        return out, std, self.critic(obs).squeeze(-1)

    def distribution(self, obs: torch.Tensor) -> torch.distributions.Distribution:
        """The action distribution at ``obs``."""
        out, std, _ = self(obs)
        return distribution_of(out, std)

    def value(self, obs: torch.Tensor) -> torch.Tensor:
        """State values, shape ``[B]``."""
        return self.critic(obs).squeeze(-1)


def distribution_of(out: torch.Tensor, std: torch.Tensor) -> torch.distributions.Distribution:
    """Gaussian with ``std`` (continuous) or categorical over logits ``out`` (``std`` empty)."""
    if std.numel():
        return torch.distributions.Normal(out, std, validate_args=False)
    return torch.distributions.Categorical(logits=out, validate_args=False)


def actor_critic(observation_space: Any, action_space: Any, config: Dict[str, Any]) -> ActorCritic:
    """``model_fn``: the actor-critic for these spaces."""
    obs_size = int(np.prod(observation_space.shape))
    continuous = not hasattr(action_space, "n")
    action_size = int(np.prod(action_space.shape)) if continuous else int(action_space.n)
    return ActorCritic(obs_size, action_size, tuple(config["hidden"]), continuous,
                       config["init_log_std"])


def act(model: ActorCritic, obs: torch.Tensor, explore: bool,
        config: Dict[str, Any]) -> Tuple[torch.Tensor, Dict[str, torch.Tensor]]:
    """``action_fn``: a sample (or the mode) with its log-probability and the state value."""
    if model.continuous:
        dist = model.distribution(obs)
        actions = dist.sample() if explore else dist.mean
        logp = dist.log_prob(actions).sum(-1)
    else:  # the categorical by hand: Categorical objects cost more than the network here
        log_probs = model.actor(obs).log_softmax(-1)
        if explore:
            actions = torch.multinomial(log_probs.exp(), 1).squeeze(-1)
        else:
            actions = log_probs.argmax(-1)
        logp = log_probs.gather(-1, actions.unsqueeze(-1)).squeeze(-1)
    return actions, {"logp": logp, "values": model.value(obs)}


def gae(policy: Any, batch: Dict[str, np.ndarray]) -> Dict[str, np.ndarray]:
    """``postprocess_fn``: advantages and value targets over a ``[T, N]`` rollout."""
    config = policy.config
    gamma, lam = config["gamma"], config["gae_lambda"]
    rewards = batch["rewards"] * config["reward_scale"]
    length, num_envs = rewards.shape
    with torch.no_grad():
        next_obs = torch.as_tensor(batch["next_obs"], dtype=torch.float32)
        next_values = policy.model.value(next_obs.reshape(length * num_envs, -1))
    next_values = next_values.numpy().reshape(length, num_envs)
    not_terminal = 1.0 - batch["terminated"]
    not_done = 1.0 - (batch["terminated"] | batch["truncated"])
    deltas = rewards + gamma * next_values * not_terminal - batch["values"]
    advantages = np.zeros_like(deltas, dtype=np.float32)
    running = np.zeros(num_envs, np.float32)
    for t in reversed(range(length)):
        running = deltas[t] + gamma * lam * not_done[t] * running
        advantages[t] = running
    return {**batch, "advantages": advantages, "returns": advantages + batch["values"]}


def ppo_loss(model: ActorCritic, batch: Dict[str, torch.Tensor],
             config: Dict[str, Any]) -> Tuple[torch.Tensor, Dict[str, torch.Tensor]]:
    """``loss_fn``: clipped surrogate + value loss - entropy bonus, with diagnostics."""
    out, std, values = model(batch["obs"])  # model may be a DistributedDataParallel wrapper
    dist = distribution_of(out, std)
    logp = dist.log_prob(batch["actions"])
    entropy = dist.entropy()
    if std.numel():
        logp, entropy = logp.sum(-1), entropy.sum(-1)
    log_ratio = logp - batch["logp"]
    ratio = log_ratio.exp()
    advantages = batch["advantages"]
    advantages = (advantages - advantages.mean()) / (advantages.std() + 1e-8)
    clip = config["clip"]
    policy_loss = torch.max(-advantages * ratio,
                            -advantages * ratio.clamp(1.0 - clip, 1.0 + clip)).mean()
    value_loss = (values - batch["returns"]) ** 2
    if config["clip_value"]:
        clipped = batch["values"] + (values - batch["values"]).clamp(-clip, clip)
        value_loss = torch.max(value_loss, (clipped - batch["returns"]) ** 2)
    value_loss = 0.5 * value_loss.mean()
    entropy = entropy.mean()
    loss = policy_loss + config["vf_coef"] * value_loss - config["ent_coef"] * entropy
    with torch.no_grad():
        approx_kl = ((ratio - 1.0) - log_ratio).mean()
        clip_fraction = ((ratio - 1.0).abs() > clip).float().mean()
    return loss, {"policy_loss": policy_loss.detach(), "value_loss": value_loss.detach(),
                  "entropy": entropy.detach(), "approx_kl": approx_kl,
                  "clip_fraction": clip_fraction}


def explained_variance(policy: Any, batch: Dict[str, np.ndarray],
                       stats: Dict[str, float]) -> Dict[str, float]:
    """``stats_fn``: how much of the returns' variance the value function explains."""
    variance = float(np.var(batch["returns"]))
    if variance == 0.0:
        return {"explained_variance": float("nan")}
    return {"explained_variance": 1.0 - float(np.var(batch["returns"] - batch["values"])) / variance}


PPO = build_policy("PPO", actor_critic, ppo_loss, postprocess_fn=gae, action_fn=act,
                   stats_fn=explained_variance, defaults=DEFAULTS)
