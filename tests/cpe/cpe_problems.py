"""Synthetic problems with exactly known policy values for the cpe tests.

* :class:`ContextualBandit` -- finite contexts, known reward means; the target
  policy's value is ``sum_x p(x) sum_a pi(a|x) mean(x, a)``.
* :class:`SmallMDP` -- a small stochastic MDP with a terminal state and a step
  limit, solved exactly by backward dynamic programming (finite-horizon policy
  evaluation), so the true value and the exact ``Q_t(s, a)`` are known.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

import cpe


def _random_policy(rng: np.random.Generator, rows: int, k: int, temperature: float) -> np.ndarray:
    """Random softmax policy table with every probability positive."""
    logits = rng.normal(size=(rows, k)) / temperature
    z = np.exp(logits - logits.max(axis=1, keepdims=True))
    return z / z.sum(axis=1, keepdims=True)


def _draw(probs: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """One categorical draw per row."""
    u = rng.random(probs.shape[0])[:, None]
    return np.minimum((probs.cumsum(axis=1) < u).sum(axis=1), probs.shape[1] - 1)


@dataclass
class ContextualBandit:
    """Finite-context bandit with Gaussian reward noise."""

    context_probs: np.ndarray
    means: np.ndarray
    logging: np.ndarray
    target: np.ndarray
    noise: float = 0.5

    @classmethod
    def make(cls, seed: int = 0, n_contexts: int = 5, k: int = 3) -> "ContextualBandit":
        """Random instance."""
        rng = np.random.default_rng(seed)
        return cls(
            context_probs=rng.dirichlet(np.ones(n_contexts)),
            means=rng.uniform(0.0, 2.0, size=(n_contexts, k)),
            logging=_random_policy(rng, n_contexts, k, 1.0),
            target=_random_policy(rng, n_contexts, k, 0.7),
        )

    def model_value(self, reward_table: np.ndarray) -> float:
        """Value the direct method converges to with model ``reward_table``."""
        return float(self.context_probs @ (self.target * reward_table).sum(axis=1))

    @property
    def true_value(self) -> float:
        """Exact value of the target policy."""
        return self.model_value(self.means)

    def sample(self, n: int, rng: np.random.Generator,
               model: np.ndarray | None = None) -> cpe.BanditLog:
        """Log ``n`` decisions of the logging policy (model defaults to the true means)."""
        x = rng.choice(len(self.context_probs), size=n, p=self.context_probs)
        a = _draw(self.logging[x], rng)
        r = self.means[x, a] + rng.normal(scale=self.noise, size=n)
        table = self.means if model is None else model
        return cpe.BanditLog(a, r, self.logging[x, a], self.target[x], table[x])


@dataclass
class SmallMDP:
    """Episodic MDP: states ``0..S-1`` plus terminal ``S``; at most ``horizon`` steps."""

    transitions: np.ndarray  # (S, K, S + 1), last column = terminal
    reward_means: np.ndarray  # (S, K)
    initial: np.ndarray  # (S,)
    logging: np.ndarray  # (S, K)
    target: np.ndarray  # (S, K)
    horizon: int
    gamma: float
    noise: float = 0.3

    @classmethod
    def make(cls, seed: int = 0, n_states: int = 4, k: int = 2, horizon: int = 5,
             gamma: float = 0.9, stop: float = 0.2) -> "SmallMDP":
        """Random instance whose episodes terminate with probability ~``stop`` per step."""
        rng = np.random.default_rng(seed)
        moves = rng.dirichlet(np.ones(n_states), size=(n_states, k)) * (1.0 - stop)
        transitions = np.concatenate([moves, np.full((n_states, k, 1), stop)], axis=2)
        return cls(
            transitions=transitions,
            reward_means=rng.uniform(0.0, 1.0, size=(n_states, k)),
            initial=rng.dirichlet(np.ones(n_states)),
            logging=_random_policy(rng, n_states, k, 1.5),
            target=_random_policy(rng, n_states, k, 1.0),
            horizon=horizon,
            gamma=gamma,
        )

    def q_tables(self) -> np.ndarray:
        """Exact ``Q_t(s, a)`` of the target policy, shape ``(horizon, S, K)``."""
        n_states = self.reward_means.shape[0]
        q = np.zeros((self.horizon,) + self.reward_means.shape)
        v_next = np.zeros(n_states + 1)
        for t in reversed(range(self.horizon)):
            q[t] = self.reward_means + self.gamma * self.transitions @ v_next
            v_next = np.append((self.target * q[t]).sum(axis=1), 0.0)
        return q

    @property
    def true_value(self) -> float:
        """Exact expected discounted return of the target policy."""
        return float(self.initial @ (self.target * self.q_tables()[0]).sum(axis=1))

    def model_value(self, q: np.ndarray) -> float:
        """What the direct method converges to with model tables ``q`` (``(horizon, S, K)``)."""
        return float(self.initial @ (self.target * q[0]).sum(axis=1))

    def sample(self, n_episodes: int, rng: np.random.Generator, q: np.ndarray | None = None,
               shuffle: bool = True) -> cpe.Trajectories:
        """Log ``n_episodes`` episodes of the logging policy (rows shuffled by default)."""
        q = self.q_tables() if q is None else q
        n_states = self.reward_means.shape[0]
        state = rng.choice(n_states, size=n_episodes, p=self.initial)
        alive = np.arange(n_episodes)
        columns: dict[str, list[np.ndarray]] = {k: [] for k in ("id", "t", "s", "a", "r")}
        for t in range(self.horizon):
            if alive.size == 0:
                break
            s = state[alive]
            a = _draw(self.logging[s], rng)
            r = self.reward_means[s, a] + rng.normal(scale=self.noise, size=s.size)
            for key, value in zip(columns, (alive, np.full(s.size, t), s, a, r)):
                columns[key].append(value)
            nxt = _draw(self.transitions[s, a], rng)
            keep = nxt < n_states
            state[alive[keep]] = nxt[keep]
            alive = alive[keep]
        ids, ts, s, a, r = (np.concatenate(columns[k]) for k in ("id", "t", "s", "a", "r"))
        order = rng.permutation(ids.size) if shuffle else np.lexsort((ts, ids))
        ids, ts, s, a, r = ids[order], ts[order], s[order], a[order], r[order]
        return cpe.Trajectories(ids, ts * 10 + 3, a, r, self.logging[s, a], self.target[s],
                                q[ts, s], gamma=self.gamma)
