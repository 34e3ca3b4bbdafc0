"""Stop conditions for :func:`rl.run`, combined with ``|`` (either) and ``&`` (both).

    stop = rl.AfterSteps(200_000) | rl.RewardReached(475)

A condition is called with the run's :class:`rl.loop.RunState` after every act
stage (or generation) and returns True to stop.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any


class Stop(ABC):
    """A stop condition; subclasses define ``__call__(run) -> bool``."""

    @abstractmethod
    def __call__(self, run: Any) -> bool:
        """True when the run should stop."""

    def __or__(self, other: "Stop") -> "Stop":
        return AnyOf(self, other)

    def __and__(self, other: "Stop") -> "Stop":
        return AllOf(self, other)


class AnyOf(Stop):
    """Stop when any of the conditions holds."""

    def __init__(self, *conditions: Stop) -> None:
        self.conditions = conditions

    def __call__(self, run: Any) -> bool:
        return any(condition(run) for condition in self.conditions)

    def __repr__(self) -> str:
        return " | ".join(map(repr, self.conditions))


class AllOf(Stop):
    """Stop when all of the conditions hold."""

    def __init__(self, *conditions: Stop) -> None:
        self.conditions = conditions

    def __call__(self, run: Any) -> bool:
        return all(condition(run) for condition in self.conditions)

    def __repr__(self) -> str:
        return " & ".join(map(repr, self.conditions))


class AfterSteps(Stop):
    """Stop once ``steps`` training env steps have been taken."""

    def __init__(self, steps: int) -> None:
        if steps < 0:
            raise ValueError(f"steps must be >= 0, got {steps}")
        self.steps = int(steps)

    def __call__(self, run: Any) -> bool:
        return run.env_steps >= self.steps

    def __repr__(self) -> str:
        return f"AfterSteps({self.steps})"


class AfterEpisodes(Stop):
    """Stop once ``episodes`` training episodes have ended."""

    def __init__(self, episodes: int) -> None:
        if episodes < 0:
            raise ValueError(f"episodes must be >= 0, got {episodes}")
        self.episodes = int(episodes)

    def __call__(self, run: Any) -> bool:
        return run.episodes >= self.episodes

    def __repr__(self) -> str:
        return f"AfterEpisodes({self.episodes})"


class AfterIterations(Stop):
    """Stop once the policy has learned ``iterations`` times (or run that many generations)."""

    def __init__(self, iterations: int) -> None:
        self.iterations = int(iterations)

    def __call__(self, run: Any) -> bool:
        return run.iterations >= self.iterations

    def __repr__(self) -> str:
        return f"AfterIterations({self.iterations})"


class AfterSeconds(Stop):
    """Stop once the run has taken ``seconds`` of wall-clock time (resumed time included)."""

    def __init__(self, seconds: float) -> None:
        self.seconds = float(seconds)

    def __call__(self, run: Any) -> bool:
        return run.wall_s >= self.seconds

    def __repr__(self) -> str:
        return f"AfterSeconds({self.seconds:g})"


class RewardReached(Stop):
    """Stop when the latest evaluation's mean return is at least ``reward``.

    Needs an :class:`rl.hooks.Evaluate` hook in the run; without evaluations it never fires.
    """

    def __init__(self, reward: float) -> None:
        self.reward = float(reward)

    def __call__(self, run: Any) -> bool:
        return bool(run.evaluations) and run.evaluations[-1][1] >= self.reward

    def __repr__(self) -> str:
        return f"RewardReached({self.reward:g})"
