"""A small deterministic Gridworld with a known model, for tests and offline RL.

The grid (5 x 5 by default, Horizon's layout) is numbered row by row from the top
left; the agent starts in cell 0 and the episode ends when it reaches the goal in
the bottom-right cell. Walls block a move (the agent stays put). Every step costs
``step_reward`` (default 0); reaching the goal pays ``goal_reward`` (default 1).
Episodes are truncated after ``max_steps`` steps (default 50).

Observations are one-hot vectors of the cell (``float32``, length ``rows * cols``);
actions are ``0..3`` for ``L R U D`` (names in :attr:`Gridworld.ACTION_NAMES`).

Because the model is known, :meth:`Gridworld.transition_table`, :func:`optimal_q`
(the exact Q* by value iteration) and :func:`policy_value` (the exact value of any
stochastic policy) give the ground truth for offline-RL and CPE tests.
"""
from __future__ import annotations

import logging
from typing import Any, Dict, Optional, Sequence, Tuple

import gymnasium as gym
import numpy as np

logger = logging.getLogger(__name__)

_MOVES = {0: (0, -1), 1: (0, 1), 2: (-1, 0), 3: (1, 0)}


class Gridworld(gym.Env):
    """A deterministic grid with walls, a start cell and a goal cell."""

    ACTION_NAMES = ("L", "R", "U", "D")
    metadata = {"render_modes": ["ansi"]}

    def __init__(self, rows: int = 5, cols: int = 5, walls: Sequence[int] = (6, 7, 8, 16, 17),
                 start: int = 0, goal: Optional[int] = None, step_reward: float = 0.0,
                 goal_reward: float = 1.0, max_steps: int = 50) -> None:
        if rows < 2 or cols < 2:
            raise ValueError(f"a Gridworld needs at least 2 x 2 cells, got {rows} x {cols}")
        self.rows, self.cols = rows, cols
        self.n_states = rows * cols
        self.goal = self.n_states - 1 if goal is None else int(goal)
        self.start = int(start)
        self.walls = frozenset(int(w) for w in walls)
        for name, cell in (("start", self.start), ("goal", self.goal)):
            if not 0 <= cell < self.n_states or cell in self.walls:
                raise ValueError(f"{name} cell {cell} is outside the grid or a wall")
        self.step_reward, self.goal_reward = float(step_reward), float(goal_reward)
        self.max_steps = int(max_steps)
        self.observation_space = gym.spaces.Box(0.0, 1.0, (self.n_states,), np.float32)
        self.action_space = gym.spaces.Discrete(4)
        self.state = self.start
        self.steps = 0

    def move(self, state: int, action: int) -> int:
        """The cell reached from ``state`` by ``action`` (walls and edges block)."""
        row, col = divmod(state, self.cols)
        d_row, d_col = _MOVES[int(action)]
        row, col = row + d_row, col + d_col
        if not (0 <= row < self.rows and 0 <= col < self.cols):
            return state
        target = row * self.cols + col
        return state if target in self.walls else target

    def one_hot(self, state: int) -> np.ndarray:
        """The observation of ``state``."""
        obs = np.zeros(self.n_states, np.float32)
        obs[state] = 1.0
        return obs

    def reset(self, *, seed: Optional[int] = None,
              options: Optional[Dict[str, Any]] = None) -> Tuple[np.ndarray, dict]:
        """Start an episode in the start cell (the grid is deterministic; ``seed``
        seeds the action space only)."""
        super().reset(seed=seed)
        if seed is not None:
            self.action_space.seed(seed)
        self.state, self.steps = self.start, 0
        return self.one_hot(self.state), {"state": self.state}

    def step(self, action: int) -> Tuple[np.ndarray, float, bool, bool, dict]:
        """Move; ``terminated`` when the goal is reached, ``truncated`` after ``max_steps``."""
        if not self.action_space.contains(int(action)):
            raise ValueError(f"action must be 0..3, got {action!r}")
        self.state = self.move(self.state, int(action))
        self.steps += 1
        terminated = self.state == self.goal
        reward = self.goal_reward if terminated else self.step_reward
        truncated = not terminated and self.steps >= self.max_steps
        return self.one_hot(self.state), reward, terminated, truncated, {"state": self.state}

    def render(self) -> str:
        """The grid as text: ``A`` agent, ``G`` goal, ``#`` wall."""
        cells = []
        for cell in range(self.n_states):
            cells.append("A" if cell == self.state else "G" if cell == self.goal
                         else "#" if cell in self.walls else ".")
        return "\n".join("".join(cells[r * self.cols:(r + 1) * self.cols]) for r in range(self.rows))

    def transition_table(self) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(next_state[s, a], reward[s, a], terminal[s])`` for every cell and action."""
        next_state = np.zeros((self.n_states, 4), np.int64)
        reward = np.zeros((self.n_states, 4), np.float64)
        for state in range(self.n_states):
            for action in range(4):
                target = self.move(state, action)
                next_state[state, action] = target
                reward[state, action] = self.goal_reward if target == self.goal else self.step_reward
        terminal = np.zeros(self.n_states, bool)
        terminal[self.goal] = True
        return next_state, reward, terminal


def optimal_q(env: Gridworld, gamma: float, tolerance: float = 1e-10) -> np.ndarray:
    """Exact Q*[s, a] of ``env`` by value iteration (ignoring truncation).

    The goal cell is absorbing with value 0; wall cells keep Q = 0.
    """
    if not 0.0 <= gamma < 1.0:
        raise ValueError(f"gamma must be in [0, 1), got {gamma}")
    next_state, reward, terminal = env.transition_table()
    q = np.zeros_like(reward)
    for _ in range(10_000):
        value = np.where(terminal, 0.0, q.max(axis=1))
        updated = reward + gamma * np.where(terminal[next_state], 0.0, value[next_state])
        updated[terminal] = 0.0
        for wall in env.walls:
            updated[wall] = 0.0
        if np.max(np.abs(updated - q)) < tolerance:
            return updated
        q = updated
    logger.warning("value iteration did not converge to %g", tolerance)
    return q


def policy_value(env: Gridworld, probs: np.ndarray, gamma: float,
                 tolerance: float = 1e-10) -> np.ndarray:
    """Exact V^pi[s] of the stochastic policy ``probs[s, a]`` (ignoring truncation):
    the ground truth that off-policy estimates of ``probs`` are checked against."""
    next_state, reward, terminal = env.transition_table()
    if probs.shape != reward.shape:
        raise ValueError(f"probs must have shape {reward.shape}, got {probs.shape}")
    value = np.zeros(env.n_states)
    for _ in range(10_000):
        future = np.where(terminal[next_state], 0.0, value[next_state])
        updated = np.where(terminal, 0.0, (probs * (reward + gamma * future)).sum(axis=1))
        if np.max(np.abs(updated - value)) < tolerance:
            return updated
        value = updated
    logger.warning("policy evaluation did not converge to %g", tolerance)
    return value
