"""The run loop: ``rl.run(policy, env, stop, hooks)``.

Stages, each with a *pre* and a *post* hook call::

    experiment_pre
      episode_pre(member)                        for every member at the start
      ┌ act_pre(obs) → policy acts, env steps → act_post(step)
      │   episode_post(episode) → episode_pre(member)   for members whose episode ended
      │   learn_post(stats)                      when the collector completed a batch
      └ until stop(run) or a hook calls run.request_stop()
    experiment_post

Step-driven policies (:class:`rl.policy.Policy`) act in ``env`` (a vector env, a
gymnasium env or an env id; single envs become a one-member vector env) and learn
from the batches of :mod:`rl.rollout`. Population algorithms
(:class:`rl.population.PopulationAlgorithm`, e.g. ES) run one generation per
iteration on their pool instead; the loop reports each generation's episodes
(``member`` -1) and statistics to the same hooks, so evaluation, TensorBoard,
checkpoints and stop conditions work the same for both.
"""
from __future__ import annotations

import logging
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Deque, Dict, List, Optional, Sequence, Tuple

import numpy as np

from .cores import torch_threads_beside
from .envs import VectorEnv, clip_action, make_vector_env
from .population import PopulationAlgorithm
from .rollout import EpisodeCollector, FragmentCollector
from .stops import Stop

logger = logging.getLogger(__name__)


@dataclass
class Episode:
    """A finished training episode: which member, its return and its length."""

    member: int
    ret: float
    length: int


@dataclass
class RunState:
    """What hooks and stop conditions see: counters, recent returns, evaluations."""

    policy: Any
    env: Any
    env_steps: int = 0
    episodes: int = 0
    iterations: int = 0
    previous_wall_s: float = 0.0  # wall time of the runs this one resumed
    started: float = field(default_factory=time.perf_counter)
    recent_returns: Deque[float] = field(default_factory=lambda: deque(maxlen=100))
    evaluations: List[Tuple[int, float, float]] = field(default_factory=list)  # (steps, mean, std)
    last_stats: Dict[str, float] = field(default_factory=dict)
    stop_requested: bool = False

    @property
    def wall_s(self) -> float:
        """Seconds of training so far, resumed runs included."""
        return self.previous_wall_s + time.perf_counter() - self.started

    def request_stop(self) -> None:
        """Ask the loop to stop after the current stage."""
        self.stop_requested = True

    def counters(self) -> Dict[str, Any]:
        """The counters a checkpoint keeps."""
        return {"env_steps": self.env_steps, "episodes": self.episodes,
                "iterations": self.iterations, "wall_s": self.wall_s,
                "evaluations": list(self.evaluations), "recent_returns": list(self.recent_returns)}

    def restore(self, counters: Dict[str, Any]) -> None:
        """Continue from :meth:`counters` of an earlier run."""
        self.env_steps = int(counters["env_steps"])
        self.episodes = int(counters["episodes"])
        self.iterations = int(counters["iterations"])
        self.previous_wall_s = float(counters["wall_s"])
        self.started = time.perf_counter()
        self.evaluations = [tuple(e) for e in counters["evaluations"]]
        self.recent_returns.extend(counters["recent_returns"])


class Hook:
    """Base class of hooks: override the stages you need (every method is optional)."""

    def experiment_pre(self, run: RunState) -> None:
        """Before anything runs (resuming hooks restore state here)."""

    def experiment_post(self, run: RunState) -> None:
        """After the loop ends (write outputs, close files)."""

    def episode_pre(self, run: RunState, member: int) -> None:
        """A member starts an episode."""

    def episode_post(self, run: RunState, episode: Episode) -> None:
        """A training episode ended."""

    def act_pre(self, run: RunState, obs: np.ndarray) -> None:
        """Before the policy acts on ``obs``."""

    def act_post(self, run: RunState, step: Dict[str, np.ndarray]) -> None:
        """After the env stepped (``step`` has obs, actions, rewards, ...)."""

    def learn_post(self, run: RunState, stats: Dict[str, float]) -> None:
        """After a learning step or a generation, with its statistics."""


class _Dispatch:
    """The hooks that override each stage, so stages nobody uses cost nothing."""

    STAGES = ("experiment_pre", "experiment_post", "episode_pre", "episode_post",
              "act_pre", "act_post", "learn_post")

    def __init__(self, hooks: Sequence[Hook]) -> None:
        for stage in self.STAGES:
            bound = [getattr(h, stage) for h in hooks
                     if getattr(type(h), stage, None) is not getattr(Hook, stage)]
            setattr(self, stage, bound)

    @staticmethod
    def call(bound: List[Any], *args: Any) -> None:
        for method in bound:
            method(*args)


def run(policy: Any, env: Any, stop: Stop, hooks: Sequence[Hook] = (),
        seed: Optional[int] = None, ranks: int = 1) -> RunState:
    """Train ``policy`` on ``env`` until ``stop`` holds; returns the final :class:`RunState`.

    ``seed`` seeds the env's first reset (member ``i`` gets ``seed + i``).
    ``ranks``: data-parallel ranks that each run this loop on their own env in step
    with this one (:func:`rl.train.train` with ``ranks``); ``env_steps`` then counts
    the steps of all of them, so stop conditions and hooks see global figures.
    Population algorithms bring their own envs and ignore ``env`` and ``seed``.
    While env processes step on this machine's cores, torch's threads are capped so as
    to leave them those cores (:func:`rl.cores.torch_threads_beside`).
    """
    if ranks < 1:
        raise ValueError(f"ranks must be at least 1, got {ranks}")
    if not callable(stop):
        raise TypeError(f"stop must be a stop condition (e.g. rl.AfterSteps(1000)), got {stop!r}")
    dispatch = _Dispatch(hooks)
    owns_env = False
    if not isinstance(policy, PopulationAlgorithm) and not isinstance(env, VectorEnv):
        env, owns_env = make_vector_env(env, 1, seed=seed), True
    state = RunState(policy=policy, env=env)
    try:
        dispatch.call(dispatch.experiment_pre, state)
        if isinstance(policy, PopulationAlgorithm):
            _run_generations(state, stop, dispatch)
        else:
            with torch_threads_beside(env.processes_here()):
                _run_steps(state, stop, dispatch, seed, ranks)
        dispatch.call(dispatch.experiment_post, state)
    finally:
        if owns_env:
            env.close()
    return state


def _run_generations(state: RunState, stop: Stop, dispatch: _Dispatch) -> None:
    policy = state.policy
    while not (state.stop_requested or stop(state)):
        generation = policy.generation()
        state.env_steps += generation.env_steps
        for ret, length in generation.episodes:
            state.episodes += 1
            state.recent_returns.append(ret)
            dispatch.call(dispatch.episode_post, state, Episode(-1, ret, length))
        state.iterations += 1
        state.last_stats = dict(generation.stats)
        dispatch.call(dispatch.learn_post, state, state.last_stats)


def _run_steps(state: RunState, stop: Stop, dispatch: _Dispatch, seed: Optional[int],
               ranks: int) -> None:
    policy, env = state.policy, state.env
    config = policy.config
    if config["batch_mode"] == "fragments":
        collector: Any = FragmentCollector(config["rollout_length"], policy.postprocess)
    else:
        collector = EpisodeCollector(env.num_envs, config["train_batch_size"], policy.postprocess)
    obs = env.reset(seed=seed)
    for member in range(env.num_envs):
        dispatch.call(dispatch.episode_pre, state, member)
    while not (state.stop_requested or stop(state)):
        dispatch.call(dispatch.act_pre, state, obs)
        actions, extras = policy.compute_actions(obs, explore=True)
        next_obs, rewards, terminated, truncated, info = env.step(clip_action(env.action_space, actions))
        state.env_steps += env.num_envs * ranks
        true_next = next_obs
        final_obs = info.get("final_obs")
        if final_obs is not None:
            true_next = next_obs.copy()
            for i, final in enumerate(final_obs):
                if final is not None:
                    true_next[i] = final
        step = {"obs": obs, "actions": actions, "rewards": rewards, "terminated": terminated,
                "truncated": truncated, "next_obs": true_next, **extras}
        dispatch.call(dispatch.act_post, state, step)
        for member, ret, length in info["episodes"]:
            state.episodes += 1
            state.recent_returns.append(ret)
            dispatch.call(dispatch.episode_post, state, Episode(member, ret, length))
            dispatch.call(dispatch.episode_pre, state, member)
        obs = next_obs
        batch = collector.add(step)
        if batch is not None:
            state.last_stats = policy.learn(batch)
            state.iterations += 1
            dispatch.call(dispatch.learn_post, state, state.last_stats)
