"""TD3 (Fujimoto, van Hoof and Meger 2018, "Addressing Function Approximation
Error in Actor-Critic Methods", ICML, arXiv:1802.09477) and DDPG (Lillicrap et
al. 2016, "Continuous control with deep reinforcement learning", ICLR,
arXiv:1509.02971) for continuous (``Box``) action spaces.

One class, :class:`TD3`, with the paper's three refinements of DDPG as switches;
:class:`DDPG` is the same class with them off (as in Stable-Baselines3):

- ``twin_q``: two critics, and the bootstrap uses the smaller of their targets
  (clipped double Q-learning) against overestimation;
- ``policy_delay``: the actor and all target networks change once every
  ``policy_delay`` critic updates;
- ``policy_noise`` / ``noise_clip``: target policy smoothing, clipped Gaussian
  noise on the target action.

Data flow of one online step (``batch_mode="fragments"``, ``rollout_length=1``)::

    compute_actions(obs) ── actor + Gaussian noise (uniform random before learning_starts)
    learn(step)          ── replay.add(step); per env step owed: update(replay.sample())
    update(batch)        ── critic step on the TD target; every policy_delay: actor
                            step, then Polyak averaging of the targets

Actions: the actor ends in ``tanh``; its output ``u`` in ``[-1, 1]`` is mapped to
the Box as ``low + (u + 1) / 2 * (high - low)``. Noise scales (``exploration_noise``,
``policy_noise``, ``noise_clip``) are in these unit coordinates, i.e. fractions of
half the action range per dimension. Batches given to :meth:`TD3.update` and
:meth:`TD3.q_values` hold actions in env units; the critics see them in unit
coordinates, clipped to ``[-1, 1]`` (what the env executes after its own clip).

Observations go through ``preprocessor`` (an ``nn.Module``, default identity, e.g. a
:class:`rl.data.normalization.FeatureNormalizer`) before the actor and the critics.
It is fixed: no gradient reaches it and no optimizer holds its parameters, but its
state (buffers) is part of :meth:`TD3.state_dict`.

Checkpoints (:meth:`TD3.state_dict`) hold the networks, the targets, both optimizers,
the counters and the RNG states, not the replay buffer: a resumed run starts from an
empty buffer and updates again once ``batch_size`` new transitions are in it.
"""
from __future__ import annotations

import copy
import logging
from typing import Any, Dict, Mapping, Optional, Sequence, Tuple

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from ..policy import BASE_CONFIG, Policy
from .continuous_replay import ContinuousReplay

logger = logging.getLogger(__name__)

# Every TD3 setting (keys of BASE_CONFIG not listed here: train_batch_size,
# num_epochs, minibatch_size and total_steps are not used; lr_schedule must stay
# "constant").
TD3_DEFAULTS: Dict[str, Any] = {
    "lr": 1e-3,                 # Adam step size of actor and critics (unless the next two are set)
    "actor_lr": None,           # Adam step size of the actor (None: lr)
    "critic_lr": None,          # Adam step size of the critics (None: lr)
    "gamma": 0.99,              # discount per env step (update batches may bring their own)
    "batch_mode": "fragments",  # the loop calls learn() every rollout_length vector steps...
    "rollout_length": 1,        # ...here every vector step, so updates interleave with acting
    "tau": 0.005,               # Polyak factor: target += tau * (online - target), per target update
    "batch_size": 256,          # transitions per gradient step
    "buffer_size": 1_000_000,   # replay capacity in transitions (oldest overwritten)
    "learning_starts": 1_000,   # env steps of uniform random actions before the first update
    "updates_per_step": 1.0,    # gradient steps per env step (transition) after learning_starts
    "hidden": (256, 256),       # hidden layer sizes of the actor and of each critic (ReLU)
    "exploration_noise": 0.1,   # std of Gaussian action noise, fraction of half the action range
    "twin_q": True,             # two critics, bootstrap from the smaller target (clipped double Q)
    "policy_delay": 2,          # critic updates per actor update and target update
    "policy_noise": 0.2,        # std of target policy smoothing noise, unit action coordinates
    "noise_clip": 0.5,          # smoothing noise is clipped to [-noise_clip, noise_clip]
    "max_grad_norm": None,      # clip each network's gradient norm to this (None: no clipping)
}

# DDPG: TD3 with the refinements off; the other settings are shared.
DDPG_DEFAULTS: Dict[str, Any] = {
    **TD3_DEFAULTS, "twin_q": False, "policy_delay": 1, "policy_noise": 0.0, "noise_clip": 0.0,
}

BATCH_KEYS = ("obs", "actions", "rewards", "next_obs", "terminated")  # plus optional "discounts"


def mlp(sizes: Sequence[int]) -> nn.Sequential:
    """Linear layers of ``sizes`` with ReLU between them (none after the last)."""
    layers: list = []
    for fan_in, fan_out in zip(sizes[:-1], sizes[1:]):
        layers += [nn.Linear(fan_in, fan_out), nn.ReLU()]
    return nn.Sequential(*layers[:-1])


class DeterministicActor(nn.Module):
    """Raw observations to actions in env units: preprocessor, actor MLP, tanh, Box scaling.

    What :meth:`TD3.greedy_actor` returns for export; it shares the policy's weights.
    """

    def __init__(self, preprocessor: nn.Module, actor: nn.Module, low: torch.Tensor,
                 high: torch.Tensor) -> None:
        super().__init__()
        self.preprocessor, self.actor = preprocessor, actor
        self.register_buffer("low", low.clone())
        self.register_buffer("high", high.clone())

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        """Actions ``[B, k]`` in env units for observations ``[B, ...]``."""
        unit = torch.tanh(self.actor(self.preprocessor(obs).flatten(1)))
        return self.low + (unit + 1.0) * 0.5 * (self.high - self.low)


class TD3Networks(nn.Module):
    """The preprocessor, the actor, one or two critics and the target copies.

    Everything here works in unit action coordinates; ``features`` applies the
    preprocessor. Critic ``i`` maps ``[features, unit action]`` to a Q-value.
    """

    def __init__(self, preprocessor: nn.Module, feature_size: int, action_size: int,
                 hidden: Sequence[int], critics: int) -> None:
        super().__init__()
        self.preprocessor = preprocessor
        self.actor = mlp((feature_size, *hidden, action_size))
        self.critics = nn.ModuleList(mlp((feature_size + action_size, *hidden, 1))
                                     for _ in range(critics))
        self.actor_target = copy.deepcopy(self.actor).requires_grad_(False)
        self.critics_target = copy.deepcopy(self.critics).requires_grad_(False)

    def features(self, obs: torch.Tensor) -> torch.Tensor:
        """Preprocessed, flattened observations ``[B, feature_size]`` (no gradient)."""
        with torch.no_grad():
            return self.preprocessor(obs).flatten(1)

    def act(self, features: torch.Tensor, target: bool = False) -> torch.Tensor:
        """Unit actions ``[B, k]`` of the actor (or its target)."""
        return torch.tanh((self.actor_target if target else self.actor)(features))

    def q(self, features: torch.Tensor, unit_actions: torch.Tensor,
          target: bool = False) -> torch.Tensor:
        """Q-values ``[critics, B]`` of every critic (or every target critic)."""
        inputs = torch.cat([features, unit_actions], dim=1)
        critics = self.critics_target if target else self.critics
        return torch.stack([critic(inputs).squeeze(-1) for critic in critics])

    def q1(self, features: torch.Tensor, unit_actions: torch.Tensor) -> torch.Tensor:
        """Q-values ``[B]`` of critic 1 alone (the one the actor follows)."""
        return self.critics[0](torch.cat([features, unit_actions], dim=1)).squeeze(-1)


def polyak_update(online: nn.Module, target: nn.Module, tau: float) -> None:
    """``target <- (1 - tau) * target + tau * online``, parameter by parameter."""
    with torch.no_grad():
        for source, dest in zip(online.parameters(), target.parameters()):
            dest.lerp_(source, tau)


def check_action_space(space: Any, name: str) -> None:
    """Raise unless ``space`` is a ``Box`` with finite bounds (``high > low``)."""
    if not isinstance(space, gym.spaces.Box):
        raise TypeError(f"{name} needs a continuous action space (a gymnasium Box); "
                        f"got {space!r}. For discrete actions use DQN or PPO.")
    if not (np.all(np.isfinite(space.low)) and np.all(np.isfinite(space.high))):
        raise ValueError(f"{name} scales actions to the Box bounds, which must be finite; got {space!r}")
    if np.any(space.high <= space.low):
        raise ValueError(f"{name}: every action dimension needs high > low; got {space!r}")


class TD3(Policy):
    """TD3 (Fujimoto et al. 2018); with ``twin_q=False, policy_delay=1,
    policy_noise=0`` it is DDPG (Lillicrap et al. 2016), see :class:`DDPG`.

    Arguments: ``observation_space`` (a ``Box``), ``action_space`` (a ``Box`` with
    finite bounds; anything else is a ``TypeError``), ``config`` (keys of
    :data:`TD3_DEFAULTS`; unknown keys are a ``TypeError`` listing the valid ones),
    ``seed`` (seeds torch's global RNG and the policy's numpy generator, which draws
    exploration noise, random actions and replay samples), ``preprocessor`` (see
    the module docstring).

    Config, with units:

    - ``lr``, ``actor_lr``, ``critic_lr``: Adam step sizes (per gradient step).
    - ``gamma``: discount per env step, in ``[0, 1]``.
    - ``tau``: Polyak factor in ``(0, 1]`` applied at every target update (which
      happens every ``policy_delay`` critic updates); 1 copies the online nets.
    - ``batch_size``: transitions per gradient step; ``buffer_size``: replay
      capacity in transitions.
    - ``learning_starts``: env steps (transitions, summed over the vector env's
      members) of uniform random actions before the first update. Pitfall: the
      paper uses 25,000 (10,000 in its first version) for MuJoCo runs of 1M steps;
      a value that large wastes most of a short run.
    - ``updates_per_step``: gradient steps per transition after ``learning_starts``
      (fractions accumulate); with ``N`` envs a vector step owes ``N`` times this.
      Pitfall: this keeps the replay ratio independent of ``N``; with many envs the
      updates, not the envs, set the speed.
    - ``hidden``: hidden sizes of the actor and of each critic (ReLU).
    - ``exploration_noise``: std of the Gaussian noise added to the actor's unit
      action while training, a fraction of half the action range; the noisy action
      is clipped to the Box (so the replay holds what the env executed).
    - ``twin_q``: two critics and the clipped double-Q target ``min(Q1', Q2')``;
      the actor follows critic 1.
    - ``policy_delay``: critic updates per actor update and per target update.
    - ``policy_noise``, ``noise_clip``: std and clip of the target policy smoothing
      noise, unit coordinates; 0 turns smoothing off.
    - ``max_grad_norm``: gradient-norm clip of the actor and of the critics (None: off).

    Truncation is not termination: the TD target bootstraps unless ``terminated``,
    so a time limit (Pendulum's 200 steps) keeps its bootstrap.
    """

    name = "TD3"
    default_config: Mapping[str, Any] = {**BASE_CONFIG, **TD3_DEFAULTS}

    def __init__(self, observation_space: Any, action_space: Any,
                 config: Optional[Mapping[str, Any]] = None, seed: Optional[int] = None,
                 preprocessor: Optional[nn.Module] = None) -> None:
        check_action_space(action_space, self.name)
        if not isinstance(observation_space, gym.spaces.Box):
            raise TypeError(f"{self.name} needs vector observations (a gymnasium Box); "
                            f"got {observation_space!r}")
        if preprocessor is not None and not isinstance(preprocessor, nn.Module):
            raise TypeError(f"preprocessor must be a torch.nn.Module, got {type(preprocessor).__name__}")
        self.preprocessor = preprocessor if preprocessor is not None else nn.Identity()
        self.action_size = int(np.prod(action_space.shape))
        self.low = np.asarray(action_space.low, np.float64).reshape(-1)
        self.high = np.asarray(action_space.high, np.float64).reshape(-1)
        super().__init__(observation_space, action_space, config, seed)  # calls make_model
        self.critic_optimizer = self.optimizer
        self.actor_optimizer = torch.optim.Adam(self.model.actor.parameters(),
                                                lr=self.config["actor_lr"] or self.config["lr"])
        self.replay = ContinuousReplay(self.config["buffer_size"], observation_space.shape,
                                       self.action_size)
        self.env_steps = 0       # transitions given to learn()
        self.updates = 0         # critic gradient steps
        self.update_credit = 0.0  # gradient steps owed to learn()'s transitions
        self._low_t = torch.as_tensor(self.low, dtype=torch.float32)
        self._range_t = torch.as_tensor(self.high - self.low, dtype=torch.float32)

    # -- construction --------------------------------------------------------------
    def make_model(self) -> TD3Networks:
        """Check the config, then build the networks (the base class calls this first)."""
        self._check_config()
        probe = torch.zeros((1, *self.observation_space.shape), dtype=torch.float32)
        with torch.no_grad():
            feature_size = int(self.preprocessor(probe).flatten(1).shape[1])
        critics = 2 if self.config["twin_q"] else 1
        return TD3Networks(self.preprocessor, feature_size, self.action_size,
                           tuple(self.config["hidden"]), critics)

    def make_optimizer(self) -> torch.optim.Optimizer:
        """Adam over the critics (the actor's Adam is ``actor_optimizer``)."""
        return torch.optim.Adam(self.model.critics.parameters(),
                                lr=self.config["critic_lr"] or self.config["lr"])

    def _check_config(self) -> None:
        c = self.config

        def bad(key: str, wanted: str) -> ValueError:
            return ValueError(f"{self.name} config {key}={c[key]!r}: {wanted}")

        if c["lr_schedule"] != "constant":
            raise bad("lr_schedule", "only 'constant' is supported")
        for key in ("lr", "actor_lr", "critic_lr", "max_grad_norm"):
            if c[key] is not None and not c[key] > 0:
                raise bad(key, "must be > 0" + ("" if key == "lr" else " or None"))
        if not 0.0 <= c["gamma"] <= 1.0:
            raise bad("gamma", "must be in [0, 1]")
        if not 0.0 < c["tau"] <= 1.0:
            raise bad("tau", "must be in (0, 1]")
        for key in ("batch_size", "buffer_size", "policy_delay"):
            if not (isinstance(c[key], (int, np.integer)) and c[key] >= 1):
                raise bad(key, "must be an integer >= 1")
        if not (isinstance(c["learning_starts"], (int, np.integer)) and c["learning_starts"] >= 0):
            raise bad("learning_starts", "must be an integer >= 0")
        if not c["updates_per_step"] > 0:
            raise bad("updates_per_step", "must be > 0")
        for key in ("exploration_noise", "policy_noise", "noise_clip"):
            if not c[key] >= 0:
                raise bad(key, "must be >= 0")
        if not isinstance(c["twin_q"], bool):
            raise bad("twin_q", "must be True or False")
        hidden = c["hidden"]
        if (not isinstance(hidden, (list, tuple)) or not hidden
                or not all(isinstance(h, int) and h >= 1 for h in hidden)):
            raise bad("hidden", "must be a non-empty sequence of positive integers")

    # -- acting ----------------------------------------------------------------------
    def to_env_units(self, unit: np.ndarray) -> np.ndarray:
        """Unit actions in ``[-1, 1]`` to the Box (clipped to its bounds)."""
        actions = self.low + (unit + 1.0) * 0.5 * (self.high - self.low)
        return np.clip(actions, self.low, self.high)

    def compute_actions(self, obs: np.ndarray, explore: bool = True) -> Tuple[np.ndarray, Dict[str, np.ndarray]]:
        """Actions in env units for ``obs [N, ...]``, shaped ``[N, *action_shape]``, and no extras.

        ``explore``: uniform random actions before ``learning_starts`` env steps,
        then the actor's action plus clipped Gaussian noise; otherwise the actor's
        deterministic action.
        """
        obs = np.asarray(obs, np.float32)
        count = len(obs)
        if explore and self.env_steps < self.config["learning_starts"]:
            unit = self.generator.uniform(-1.0, 1.0, (count, self.action_size))
        else:
            with torch.no_grad():
                unit = self.model.act(self.model.features(torch.from_numpy(obs))).numpy()
            noise = self.config["exploration_noise"]
            if explore and noise > 0:
                unit = np.clip(unit + self.generator.normal(0.0, noise, unit.shape), -1.0, 1.0)
        actions = self.to_env_units(unit).reshape((count, *self.action_space.shape))
        return actions.astype(self.action_space.dtype), {}

    def greedy_actor(self) -> DeterministicActor:
        """The deterministic policy as a module (observations to env-unit actions) for
        export (TorchScript, ONNX); it shares this policy's weights."""
        return DeterministicActor(self.model.preprocessor, self.model.actor, self._low_t,
                                  self._low_t + self._range_t)

    @torch.no_grad()
    def q_values(self, obs: Any, actions: Any) -> torch.Tensor:
        """Critic 1's Q-values ``[B]`` of ``obs [B, ...]`` and env-unit ``actions [B, k]``."""
        obs = torch.as_tensor(obs, dtype=torch.float32)
        unit = self._to_unit(torch.as_tensor(actions, dtype=torch.float32))
        return self.model.q1(self.model.features(obs), unit)

    def _to_unit(self, actions: torch.Tensor) -> torch.Tensor:
        actions = actions.reshape(len(actions), self.action_size)
        return (2.0 * (actions - self._low_t) / self._range_t - 1.0).clamp(-1.0, 1.0)

    # -- learning --------------------------------------------------------------------
    def learn(self, batch: Dict[str, np.ndarray]) -> Dict[str, float]:
        """Store the loop's transitions in the replay buffer and take the gradient
        steps they are owed (none before ``learning_starts``); mean statistics of
        those steps, ``{}`` when none ran."""
        count = len(batch["obs"])
        actions = np.clip(np.asarray(batch["actions"], np.float64).reshape(count, -1),
                          self.low, self.high)
        self.replay.add(batch["obs"], actions, batch["rewards"], batch["next_obs"],
                        batch["terminated"])
        self.env_steps += count
        self.samples_learned += count
        if self.env_steps < self.config["learning_starts"] or len(self.replay) < self.config["batch_size"]:
            return {}
        self.update_credit += count * self.config["updates_per_step"]
        totals: Dict[str, float] = {}
        counts: Dict[str, int] = {}
        while self.update_credit >= 1.0:
            self.update_credit -= 1.0
            for key, value in self.update(self.replay.sample(self.config["batch_size"], self.generator)).items():
                totals[key] = totals.get(key, 0.0) + value
                counts[key] = counts.get(key, 0) + 1
        return {key: totals[key] / counts[key] for key in totals}

    def update(self, batch: Mapping[str, Any]) -> Dict[str, float]:
        """One gradient step on a batch of transitions; returns its statistics.

        ``batch`` (numpy arrays or tensors): ``obs [B, ...]``, ``actions [B, k]``
        (env units), ``rewards [B]``, ``next_obs [B, ...]``, ``terminated [B]``
        (bool: no bootstrap), optional ``discounts [B]`` (the factor of the
        bootstrap, e.g. ``gamma ** n`` for n-step data; default ``gamma``).
        The critics always step; the actor and the targets every ``policy_delay``.
        """
        tensors = self._batch_tensors(batch)
        critic_loss, stats = self.loss(tensors)
        self._step(self.critic_optimizer, critic_loss, self.model.critics)
        self.updates += 1
        if self.updates % self.config["policy_delay"] == 0:
            features = self.model.features(tensors["obs"])
            self.model.critics.requires_grad_(False)  # no critic weight gradients to compute
            try:
                actor_loss = -self.model.q1(features, self.model.act(features)).mean()
                self._step(self.actor_optimizer, actor_loss, self.model.actor)
            finally:
                self.model.critics.requires_grad_(True)
            tau = self.config["tau"]
            polyak_update(self.model.actor, self.model.actor_target, tau)
            polyak_update(self.model.critics, self.model.critics_target, tau)
            stats["actor_loss"] = float(actor_loss.detach())
        return stats

    def loss(self, batch: Dict[str, torch.Tensor]) -> Tuple[torch.Tensor, Dict[str, float]]:
        """The critics' loss: the sum over critics of the mean squared TD error."""
        features = self.model.features(batch["obs"])
        q = self.model.q(features, self._to_unit(batch["actions"]))
        target = self.td_target(batch["next_obs"], batch["rewards"], batch["terminated"],
                                batch["discounts"])
        loss = ((q - target.unsqueeze(0)) ** 2).mean(dim=1).sum()
        return loss, {"critic_loss": float(loss.detach()), "q_mean": float(q[0].detach().mean()),
                      "target_mean": float(target.mean())}

    @torch.no_grad()
    def td_target(self, next_obs: torch.Tensor, rewards: torch.Tensor, terminated: torch.Tensor,
                  discounts: torch.Tensor) -> torch.Tensor:
        """``r + discount * (1 - terminated) * min_i Q_i'(s', clip(mu'(s') + clip(eps)))``.

        ``eps ~ N(0, policy_noise)`` clipped to ``±noise_clip`` (drawn from torch's
        global RNG; none when ``policy_noise`` is 0); the minimum runs over the
        target critics (one for DDPG).
        """
        features = self.model.features(next_obs)
        next_actions = self.model.act(features, target=True)
        if self.config["policy_noise"] > 0:
            clip = self.config["noise_clip"]
            noise = (torch.randn_like(next_actions) * self.config["policy_noise"]).clamp(-clip, clip)
            next_actions = (next_actions + noise).clamp(-1.0, 1.0)
        next_q = self.model.q(features, next_actions, target=True).min(dim=0).values
        return rewards + discounts * (~terminated).float() * next_q

    def enable_data_parallel(self, device: Optional[str] = None) -> None:
        """Average gradients over the ranks of the current torch.distributed group, every
        rank starting from rank 0's networks. The actor and critics are used through
        methods rather than one ``forward``, so gradients are all-reduced explicitly
        after each backward pass (the arithmetic of DistributedDataParallel)."""
        from ..distributed import broadcast_module
        if device and device.startswith("cuda"):
            self.model.to(device)
        broadcast_module(self.model)
        self.data_parallel = True

    def _step(self, optimizer: torch.optim.Optimizer, loss: torch.Tensor, net: nn.Module) -> None:
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if getattr(self, "data_parallel", False):
            from ..distributed import average_gradients
            average_gradients(net.parameters())
        if self.config["max_grad_norm"]:
            nn.utils.clip_grad_norm_(net.parameters(), self.config["max_grad_norm"])
        optimizer.step()

    def _batch_tensors(self, batch: Mapping[str, Any]) -> Dict[str, torch.Tensor]:
        missing = [key for key in BATCH_KEYS if key not in batch]
        if missing:
            raise KeyError(f"{self.name}.update needs batch keys {list(BATCH_KEYS)} "
                           f"(+ optional 'discounts'); missing {missing}")

        def floats(key: str) -> torch.Tensor:
            return torch.as_tensor(batch[key], dtype=torch.float32)

        size = len(batch["obs"])
        tensors = {"obs": floats("obs"), "next_obs": floats("next_obs"),
                   "actions": floats("actions").reshape(size, self.action_size),
                   "rewards": floats("rewards").reshape(size),
                   "terminated": torch.as_tensor(batch["terminated"], dtype=torch.bool).reshape(size)}
        if batch.get("discounts") is not None:
            tensors["discounts"] = floats("discounts").reshape(size)
        else:
            tensors["discounts"] = torch.full((size,), float(self.config["gamma"]))
        return tensors

    def _schedule_lr(self) -> None:
        """Both optimizers' step sizes from ``actor_lr`` / ``critic_lr`` (or ``lr``)."""
        for optimizer, key in ((self.actor_optimizer, "actor_lr"), (self.critic_optimizer, "critic_lr")):
            for group in optimizer.param_groups:
                group["lr"] = self.config[key] or self.config["lr"]

    # -- checkpoints -----------------------------------------------------------------
    def state_dict(self) -> Dict[str, Any]:
        """Networks with targets, both optimizers, counters and RNG states (not the replay)."""
        return {"model": self.model.state_dict(),
                "actor_optimizer": self.actor_optimizer.state_dict(),
                "critic_optimizer": self.critic_optimizer.state_dict(),
                "env_steps": self.env_steps, "updates": self.updates,
                "update_credit": self.update_credit, "samples_learned": self.samples_learned,
                "config": dict(self.config), "numpy_rng": self.generator.bit_generator.state,
                "torch_rng": torch.get_rng_state()}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned (the replay buffer stays as it is)."""
        self.model.load_state_dict(state["model"])
        self.actor_optimizer.load_state_dict(state["actor_optimizer"])
        self.critic_optimizer.load_state_dict(state["critic_optimizer"])
        self.env_steps = int(state["env_steps"])
        self.updates = int(state["updates"])
        self.update_credit = float(state["update_credit"])
        self.samples_learned = int(state["samples_learned"])
        self.generator.bit_generator.state = state["numpy_rng"]
        torch.set_rng_state(state["torch_rng"])


class DDPG(TD3):
    """DDPG (Lillicrap et al. 2016): :class:`TD3` with one critic, actor and target
    updates every step and no target smoothing (:data:`DDPG_DEFAULTS`).

    Differences from the paper, as in later re-implementations (Fujimoto et al.'s
    "OurDDPG", Stable-Baselines3): Gaussian rather than Ornstein-Uhlenbeck
    exploration noise, no critic weight decay, no batch normalization, Adam step
    ``lr`` for both networks, ``tau`` 0.005 and batches of 256.
    """

    name = "DDPG"
    default_config: Mapping[str, Any] = {**BASE_CONFIG, **DDPG_DEFAULTS}
