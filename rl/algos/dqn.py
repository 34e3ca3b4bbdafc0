"""Deep Q-Networks for discrete actions, driven step by step by :func:`rl.run`.

- DQN: Mnih et al. 2015, "Human-level control through deep reinforcement
  learning", Nature 518 (replay buffer, target network, epsilon-greedy);
- double Q-learning: van Hasselt, Guez & Silver 2016, "Deep Reinforcement Learning
  with Double Q-learning", AAAI (the online net picks the next action, the target
  net scores it);
- dueling architecture: Wang et al. 2016, "Dueling Network Architectures for Deep
  Reinforcement Learning", ICML (``Q = V + A - mean_a A``);
- multi-step returns: Sutton 1988; as used in Hessel et al. 2018 ("Rainbow").

The Q-network is ``preprocessor -> MLP torso -> head``: the preprocessor maps raw
observations ``[B, d]`` to model inputs (identity by default; a feature-normalization
module for logged data), the torso is a ReLU MLP of ``hidden`` sizes, and the head
is a linear layer to ``A`` values or the dueling pair of value and advantage layers.

Two ways to train:

- online, with :func:`rl.run`: every vector step the loop calls :meth:`DQN.learn`
  with that step's transitions (``batch_mode="fragments"``, ``rollout_length=1``);
  they go into a :class:`rl.algos.replay.ReplayBuffer` and, when due, minibatches
  sampled from it go to :meth:`DQN.update`;
- offline: call :meth:`DQN.update` with your own batches (keys below) and
  :meth:`DQN.update_target` every so many updates.

``update`` batch keys: ``obs [B, d]``, ``actions [B]`` (int), ``rewards [B]``
(the n-step discounted sum), ``next_obs [B, d]``, ``terminated [B]`` (bool; no
bootstrap), and optionally ``discounts [B]`` (the factor of the bootstrap term,
default ``gamma``: ``gamma^k`` for k-step returns, ``gamma^dt`` for time gaps),
``next_actions [B]`` (int, required for the SARSA target) and
``possible_next_actions [B, A]`` (bool; restricts the max / argmax over next
actions; a row with no possible action bootstraps 0).

Config (``DEFAULTS``; counters in **env steps**, summed over vector-env members):

- ``lr``: Adam step size. ``gamma``: discount per env step.
- ``buffer_size``: replay capacity in transitions.
- ``minibatch_size``: transitions per gradient step.
- ``learning_starts``: env steps before the first gradient step (the buffer fills
  with near-random play first).
- ``train_every`` / ``gradient_steps``: ``gradient_steps`` updates every
  ``train_every`` env steps (with N members, N env steps pass per vector step).
- ``target_update_every`` / ``tau``: every ``target_update_every`` env steps the
  target net moves to ``tau * online + (1 - tau) * target`` (``tau = 1``: a hard copy;
  for a soft update after every gradient step set ``target_update_every =
  train_every`` and a small ``tau``).
- ``double_q``, ``dueling``: the two variants above (both on by default).
- ``target``: ``"q_learning"`` (max over next actions) or ``"sarsa"`` (the logged
  next action; on-policy, so it evaluates the epsilon-greedy behaviour).
- ``n_step``: steps per return. Pitfall: with n > 1 the sum uses the exploring
  actions of the behaviour policy without correction (biased, usually faster).
- ``epsilon_start``, ``epsilon_end``, ``epsilon_decay_steps``: linear schedule of
  the random-action probability over env steps (then constant at ``epsilon_end``).
- ``loss``: ``"huber"`` (smooth L1, delta 1; the paper's error clipping) or ``"mse"``.
- ``max_grad_norm``: global gradient-norm clip (None: off).
- ``hidden``: torso sizes. ``lr_schedule="linear"`` decays ``lr`` to 0 over
  ``total_steps`` env steps.
- ``batch_mode`` must stay ``"fragments"``; ``rollout_length`` (vector steps per
  ``learn`` call) is normally 1. ``train_batch_size`` and ``num_epochs`` are unused.

The defaults were tuned on CartPole-v1 with one env (``bench/bench_dqn.py``): the
deterministic evaluation first reaches 475 after 45k-90k env steps for seeds 0-2.

Pitfalls: :meth:`DQN.state_dict` holds both nets, the optimizer and the counters
but **not the replay buffer** (nor the n-step windows); after
:meth:`DQN.load_state_dict` learning pauses until the buffer again holds
``min(learning_starts, buffer_size)`` transitions. ``epsilon`` follows the env
steps the policy has learned from, so a policy used only for acting stays at
``epsilon_start``.
"""
from __future__ import annotations

import copy
import logging
from typing import Any, Dict, Mapping, Optional, Sequence, Tuple

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from ..policy import Policy
from .replay import ReplayBuffer

logger = logging.getLogger(__name__)

DEFAULTS: Dict[str, Any] = {
    "lr": 5e-4,                   # Adam step size
    "gamma": 0.99,                # discount per env step
    "batch_mode": "fragments",    # learn() every vector step ...
    "rollout_length": 1,          # ... with that one step
    "buffer_size": 50_000,        # replay capacity, transitions
    "minibatch_size": 128,        # transitions per gradient step
    "learning_starts": 5_000,     # env steps before learning
    "train_every": 4,             # env steps between training rounds
    "gradient_steps": 1,          # gradient steps per training round
    "target_update_every": 1_000,  # env steps between target updates
    "tau": 1.0,                   # target update weight (1: hard copy)
    "double_q": True,             # van Hasselt et al. 2016
    "dueling": True,              # Wang et al. 2016
    "target": "q_learning",       # or "sarsa"
    "n_step": 3,                  # steps per return
    "epsilon_start": 1.0,         # random-action probability at step 0
    "epsilon_end": 0.05,          # ... after epsilon_decay_steps env steps
    "epsilon_decay_steps": 50_000,
    "loss": "huber",              # or "mse"
    "max_grad_norm": 10.0,        # gradient-norm clip (None: off)
    "hidden": (120, 84),          # torso sizes
}


def mlp(sizes: Sequence[int]) -> nn.Sequential:
    """Linear layers of ``sizes`` with a ReLU after each (an empty torso for one size)."""
    layers = []
    for fan_in, fan_out in zip(sizes[:-1], sizes[1:]):
        layers += [nn.Linear(fan_in, fan_out), nn.ReLU()]
    return nn.Sequential(*layers)


def preprocessor_width(preprocessor: nn.Module, obs_shape: Sequence[int],
                       declared: Optional[int] = None) -> int:
    """The output width of ``preprocessor``: ``declared``, its ``output_dim``, or a dummy
    forward pass on zeros (in eval mode, so running statistics stay untouched)."""
    if declared is not None:
        return int(declared)
    if isinstance(getattr(preprocessor, "output_dim", None), int):
        return int(preprocessor.output_dim)
    was_training = preprocessor.training
    preprocessor.eval()
    try:
        with torch.no_grad():
            out = preprocessor(torch.zeros((1, *obs_shape), dtype=torch.float32))
    finally:
        preprocessor.train(was_training)
    return int(out.reshape(1, -1).shape[1])


class QNetwork(nn.Module):
    """``preprocessor -> MLP torso -> head``: Q-values ``[B, A]`` of observations ``[B, d]``."""

    def __init__(self, preprocessor: nn.Module, in_size: int, hidden: Sequence[int],
                 num_actions: int, dueling: bool) -> None:
        super().__init__()
        self.preprocessor = preprocessor
        self.torso = mlp((in_size, *hidden))
        width = hidden[-1] if hidden else in_size
        self.dueling = dueling
        if dueling:
            self.value = nn.Linear(width, 1)
            self.advantage = nn.Linear(width, num_actions)
        else:
            self.head = nn.Linear(width, num_actions)

    def features(self, obs: torch.Tensor) -> torch.Tensor:
        """The torso's output for ``obs``."""
        x = self.preprocessor(obs)
        return self.torso(x.reshape(len(x), -1))

    def streams(self, obs: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        """Dueling only: the value ``[B, 1]`` and advantage ``[B, A]`` streams."""
        if not self.dueling:
            raise TypeError("streams() exists for the dueling architecture only")
        h = self.features(obs)
        return self.value(h), self.advantage(h)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        """Q-values ``[B, A]`` (dueling: ``V + A - mean over actions of A``)."""
        if not self.dueling:
            return self.head(self.features(obs))
        value, advantage = self.streams(obs)
        return value + advantage - advantage.mean(dim=1, keepdim=True)


def linear_epsilon(steps: int, start: float, end: float, decay_steps: int) -> float:
    """``start`` moving linearly to ``end`` over ``decay_steps`` env steps, then ``end``."""
    if steps >= decay_steps:
        return end
    return start + (end - start) * steps / decay_steps


def masked_argmax(q: torch.Tensor, mask: Optional[torch.Tensor]) -> torch.Tensor:
    """Argmax over actions of ``q [B, A]`` among the True entries of ``mask [B, A]``."""
    if mask is None:
        return q.argmax(dim=1)
    return q.masked_fill(~mask, float("-inf")).argmax(dim=1)


class DQN(Policy):
    """Deep Q-learning with double-Q, dueling, n-step and SARSA options (see the module
    docstring for the papers, the config keys and the ``update`` batch keys).

    ``preprocessor``: an ``nn.Module`` mapping raw observation tensors ``[B, d]`` to
    model inputs (default identity); its parameters, if any, train with the network.
    ``preprocessor_out``: its output width (default: its ``output_dim`` attribute or a
    dummy forward pass).
    """

    name = "DQN"
    default_config = DEFAULTS

    def __init__(self, observation_space: Any, action_space: Any,
                 config: Optional[Mapping[str, Any]] = None, seed: Optional[int] = None,
                 preprocessor: Optional[nn.Module] = None,
                 preprocessor_out: Optional[int] = None) -> None:
        if not hasattr(action_space, "n"):
            raise TypeError(f"{self.name} needs a Discrete action space, got {action_space!r}")
        if preprocessor is not None and not isinstance(preprocessor, nn.Module):
            raise TypeError(f"preprocessor must be a torch.nn.Module, got {type(preprocessor).__name__}")
        self.preprocessor = preprocessor if preprocessor is not None else nn.Identity()
        self.preprocessor_out = preprocessor_out
        self.num_actions = int(action_space.n)
        self.seed = seed
        super().__init__(observation_space, action_space, config, seed)
        self.target_model = copy.deepcopy(self.model)
        self.target_model.requires_grad_(False)
        self.replay: Optional[ReplayBuffer] = None
        self.env_steps = 0        # env steps learned from (all members)
        self.updates = 0          # gradient steps taken
        self.refill = 0           # transitions to collect before learning (after a resume)

    # -- construction ----------------------------------------------------------------
    def validate_config(self) -> None:
        """Raise ValueError naming the first bad setting."""
        c = self.config
        if c["batch_mode"] != "fragments" or int(c["rollout_length"]) < 1:
            raise ValueError(f"{self.name} learns from every step: batch_mode must be 'fragments' "
                             f"(got {c['batch_mode']!r}) and rollout_length >= 1")
        for key in ("buffer_size", "minibatch_size", "train_every", "target_update_every", "n_step"):
            if int(c[key]) < 1:
                raise ValueError(f"{key} must be at least 1, got {c[key]}")
        for key in ("learning_starts", "gradient_steps", "epsilon_decay_steps"):
            if int(c[key]) < 0:
                raise ValueError(f"{key} must be >= 0, got {c[key]}")
        for key in ("gamma", "tau", "epsilon_start", "epsilon_end"):
            if not 0.0 <= float(c[key]) <= 1.0:
                raise ValueError(f"{key} must be in [0, 1], got {c[key]}")
        if float(c["tau"]) == 0.0:
            raise ValueError("tau must be > 0 (0 never updates the target network)")
        if c["target"] not in ("q_learning", "sarsa"):
            raise ValueError(f"target must be 'q_learning' or 'sarsa', got {c['target']!r}")
        if c["loss"] not in ("huber", "mse"):
            raise ValueError(f"loss must be 'huber' or 'mse', got {c['loss']!r}")
        if any(int(h) < 1 for h in c["hidden"]):
            raise ValueError(f"hidden sizes must be positive, got {c['hidden']}")

    def make_model(self) -> nn.Module:
        """The online Q-network (the config is validated first)."""
        self.validate_config()
        obs_shape = tuple(self.observation_space.shape)
        width = preprocessor_width(self.preprocessor, obs_shape, self.preprocessor_out)
        return QNetwork(self.preprocessor, width, tuple(int(h) for h in self.config["hidden"]),
                        self.num_actions, bool(self.config["dueling"]))

    def make_optimizer(self) -> torch.optim.Optimizer:
        """Adam with ``config["lr"]`` (the fused kernel where the device has one: ~20%
        faster for these small networks on CPU)."""
        try:
            return torch.optim.Adam(self.model.parameters(), lr=self.config["lr"], fused=True)
        except (RuntimeError, TypeError):
            return torch.optim.Adam(self.model.parameters(), lr=self.config["lr"])

    def make_replay(self, num_envs: int) -> ReplayBuffer:
        """The replay buffer for ``num_envs`` members."""
        c = self.config
        return ReplayBuffer(c["buffer_size"], self.observation_space.shape, num_envs=num_envs,
                            n_step=c["n_step"], gamma=c["gamma"],
                            track_next_action=c["target"] == "sarsa",
                            seed=None if self.seed is None else self.seed + 1)

    # -- the parts a variant changes -----------------------------------------------------
    def q_and_mask(self, net: nn.Module, obs: torch.Tensor) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
        """Q-values ``[B, A]`` of ``net`` and the possible actions ``[B, A]`` (None: all)."""
        return net(obs), None

    def random_actions(self, obs: np.ndarray) -> np.ndarray:
        """Uniformly random possible actions for the rows of ``obs``."""
        return self.generator.integers(0, self.num_actions, size=len(obs))

    # -- acting ----------------------------------------------------------------------
    @property
    def epsilon(self) -> float:
        """The current random-action probability."""
        c = self.config
        return linear_epsilon(self.env_steps, c["epsilon_start"], c["epsilon_end"],
                              c["epsilon_decay_steps"])

    @torch.no_grad()
    def q_values(self, obs: Any) -> torch.Tensor:
        """Q-values ``[B, A]`` of the online network (no gradient)."""
        return self.q_and_mask(self.model, torch.as_tensor(obs, dtype=torch.float32))[0]

    @torch.no_grad()
    def compute_actions(self, obs: np.ndarray,
                        explore: bool = True) -> Tuple[np.ndarray, Dict[str, np.ndarray]]:
        """Epsilon-greedy actions when exploring, greedy ones otherwise; no extras."""
        obs = np.asarray(obs, dtype=np.float32)
        if explore:
            random_rows = self.generator.random(len(obs)) < self.epsilon
        else:
            random_rows = np.zeros(len(obs), bool)
        if random_rows.all():
            return self.random_actions(obs), {}
        q, mask = self.q_and_mask(self.model, torch.from_numpy(obs))
        actions = masked_argmax(q, mask).numpy()
        if random_rows.any():
            actions = np.where(random_rows, self.random_actions(obs), actions)
        return actions, {}

    def action(self, obs: torch.Tensor, explore: bool) -> Tuple[torch.Tensor, Dict[str, torch.Tensor]]:
        """Tensor version of :meth:`compute_actions`."""
        actions, _ = self.compute_actions(obs.numpy(), explore)
        return torch.from_numpy(actions), {}

    # -- learning --------------------------------------------------------------------
    def batch_tensors(self, batch: Mapping[str, Any]) -> Dict[str, torch.Tensor]:
        """The ``update`` batch as tensors of the right dtypes, with ``discounts`` filled in."""
        missing = [k for k in ("obs", "actions", "rewards", "next_obs", "terminated") if k not in batch]
        if missing:
            raise KeyError(f"an update batch needs {missing}; it has {sorted(batch)}")
        t: Dict[str, torch.Tensor] = {}
        for key in ("obs", "next_obs", "rewards"):
            t[key] = torch.as_tensor(batch[key], dtype=torch.float32)
        t["actions"] = torch.as_tensor(batch["actions"], dtype=torch.int64)
        t["terminated"] = torch.as_tensor(batch["terminated"], dtype=torch.bool)
        if batch.get("discounts") is not None:
            t["discounts"] = torch.as_tensor(batch["discounts"], dtype=torch.float32)
        else:
            t["discounts"] = torch.full_like(t["rewards"], float(self.config["gamma"]))
        if batch.get("next_actions") is not None:
            t["next_actions"] = torch.as_tensor(batch["next_actions"], dtype=torch.int64)
        elif self.config["target"] == "sarsa":
            raise KeyError("the SARSA target needs next_actions in the batch")
        if batch.get("possible_next_actions") is not None:
            t["possible_next_actions"] = torch.as_tensor(batch["possible_next_actions"], dtype=torch.bool)
        return t

    @torch.no_grad()
    def td_targets(self, batch: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """``rewards + discounts * (1 - terminated) * next_value``, shape ``[B]``."""
        next_obs = batch["next_obs"]
        next_q, possible = self.q_and_mask(self.target_model, next_obs)
        if batch.get("possible_next_actions") is not None:
            possible = batch["possible_next_actions"]
        if self.config["target"] == "sarsa":
            next_actions = batch["next_actions"]
            unknown = (next_actions < 0) & ~batch["terminated"]
            if bool(unknown.any()):
                raise ValueError(f"SARSA: {int(unknown.sum())} non-terminal rows have no next action (-1)")
            next_value = next_q.gather(1, next_actions.clamp(min=0).unsqueeze(1)).squeeze(1)
        else:
            chooser = self.q_and_mask(self.model, next_obs)[0] if self.config["double_q"] else next_q
            best = masked_argmax(chooser, possible)
            next_value = next_q.gather(1, best.unsqueeze(1)).squeeze(1)
            if possible is not None:
                next_value = torch.where(possible.any(dim=1), next_value, torch.zeros_like(next_value))
        not_terminal = (~batch["terminated"]).float()
        return batch["rewards"] + batch["discounts"] * not_terminal * next_value

    def loss(self, batch: Mapping[str, torch.Tensor]) -> Tuple[torch.Tensor, Dict[str, torch.Tensor]]:
        """The TD loss of a minibatch (Huber or squared error) and diagnostics."""
        targets = self.td_targets(batch)
        q, _ = self.q_and_mask(self.learner_model, batch["obs"])  # DDP-wrapped when data-parallel
        taken = q.gather(1, batch["actions"].unsqueeze(1)).squeeze(1)
        if self.config["loss"] == "huber":
            loss = F.smooth_l1_loss(taken, targets)
        else:
            loss = F.mse_loss(taken, targets)
        return loss, {"q_mean": taken.detach().mean(), "target_mean": targets.mean()}

    def update(self, batch: Mapping[str, Any]) -> Dict[str, float]:
        """One gradient step on a batch of transitions; returns td_loss, q_mean, ...

        The target network is not touched: call :meth:`update_target` when due.
        """
        tensors = self.batch_tensors(batch)
        loss, stats = self.loss(tensors)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        out = {key: float(value) for key, value in stats.items()}
        out["td_loss"] = float(loss.detach())
        if self.config["max_grad_norm"]:
            out["grad_norm"] = float(nn.utils.clip_grad_norm_(self.model.parameters(),
                                                              self.config["max_grad_norm"]))
        self.optimizer.step()
        self.updates += 1
        self.samples_learned += len(tensors["obs"])
        return out

    @torch.no_grad()
    def update_target(self, tau: Optional[float] = None) -> None:
        """Move the target net to ``tau * online + (1 - tau) * target`` (default: config tau)."""
        tau = float(self.config["tau"] if tau is None else tau)
        for target, online in zip(self.target_model.state_dict().values(),
                                  self.model.state_dict().values()):
            if tau >= 1.0 or not target.is_floating_point():
                target.copy_(online)
            else:
                target.lerp_(online, tau)

    def learn(self, batch: Dict[str, np.ndarray]) -> Dict[str, float]:
        """Store a fragment's steps in the replay buffer and train when due.

        Returns the mean statistics of the gradient steps taken (empty when none).
        """
        c = self.config
        length = int(c["rollout_length"])
        num_envs = len(batch["obs"]) // length
        if self.replay is None:
            self.replay = self.make_replay(num_envs)
        totals: Dict[str, float] = {}
        count = 0
        for t in range(length):  # the collector flattened [T, N] time-major
            rows = slice(t * num_envs, (t + 1) * num_envs)
            self.remember({key: value[rows] for key, value in batch.items()})
            before, self.env_steps = self.env_steps, self.env_steps + num_envs
            if self.ready_to_learn():
                rounds = self.env_steps // c["train_every"] - before // c["train_every"]
                for _ in range(rounds * int(c["gradient_steps"])):
                    for key, value in self.update(self.replay.sample(c["minibatch_size"])).items():
                        totals[key] = totals.get(key, 0.0) + value
                    count += 1
            if self.env_steps // c["target_update_every"] > before // c["target_update_every"]:
                self.update_target()
        if c["lr_schedule"] == "linear":
            self._schedule_lr()
        if not count:
            return {}
        stats = {key: value / count for key, value in totals.items()}
        stats.update(epsilon=self.epsilon, replay_size=float(len(self.replay)))
        return stats

    def remember(self, step: Mapping[str, np.ndarray]) -> None:
        """Add one vector step to the replay buffer (SARSA: with the behaviour policy's
        action at the final observation of truncated episodes)."""
        final_actions = None
        if self.config["target"] == "sarsa" and step["truncated"].any():
            final_actions, _ = self.compute_actions(step["next_obs"], explore=True)
        self.replay.add(step["obs"], step["actions"], step["rewards"], step["terminated"],
                        step["truncated"], step["next_obs"], final_actions=final_actions)

    def ready_to_learn(self) -> bool:
        """True once ``learning_starts`` env steps passed and the buffer holds enough."""
        needed = max(int(self.config["minibatch_size"]), self.refill)
        return self.env_steps >= self.config["learning_starts"] and len(self.replay) >= needed

    def _schedule_lr(self) -> None:
        """``lr``, or with ``lr_schedule="linear"`` ``lr`` decayed to 0 over ``total_steps``
        env steps (DQN counts env steps, not learned samples)."""
        rate = self.config["lr"]
        if self.config["lr_schedule"] == "linear":
            rate *= max(0.0, 1.0 - self.env_steps / float(self.config["total_steps"]))
        for group in self.optimizer.param_groups:
            group["lr"] = rate

    # -- checkpoints -----------------------------------------------------------------
    def adopt(self, state: Mapping[str, Any], seed: int) -> None:
        """:meth:`Policy.adopt`, keeping this policy's own replay buffer: its transitions
        are valid off-policy data for the adopted network, so learning goes on at once."""
        replay = self.replay
        super().adopt(state, seed)
        self.replay, self.refill = replay, 0

    def state_dict(self) -> Dict[str, Any]:
        """Both networks, the optimizer, the counters and RNG states (not the replay buffer)."""
        state = super().state_dict()
        state.update(target_model=self.target_model.state_dict(), env_steps=self.env_steps,
                     updates=self.updates)
        return state

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore :meth:`state_dict`; learning waits for the replay buffer to refill."""
        super().load_state_dict(state)
        self.target_model.load_state_dict(state["target_model"])
        self.env_steps, self.updates = int(state["env_steps"]), int(state["updates"])
        self.refill = min(int(self.config["learning_starts"]), int(self.config["buffer_size"]))
        self.replay = None
