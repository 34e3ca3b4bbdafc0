"""A vector env whose members live in fiberrl processes, one Pipe per process.

For expensive environments (simulators, games) the learner should not step them
itself. :class:`ProcessVectorEnv` starts ``ceil(num_envs / envs_per_process)``
fiberrl ``Process`` es (so on Slurm, Docker or Kubernetes each is a job) and keeps
one duplex ``Pipe`` to each::

    learner ── Pipe ──> process 0: members 0..k-1   (step them, reply with the batch)
            ── Pipe ──> process 1: members k..2k-1
            ...

``step`` sends every process its slice of the actions first and then reads the
replies in process order, so members step in parallel and results keep the
member order. The contract (same-step autoreset, ``final_obs``, ``episodes``) is
the one in :mod:`rl.envs.vector`. A process that dies or stops answering within
``timeout`` seconds is a ``RuntimeError`` naming the members it held; ``close``
stops every process.
"""
from __future__ import annotations

import logging
import math
from typing import Any, List, Optional, Sequence

import numpy as np

import fiberrl

from .make import EnvSpec, make_env
from .vector import EpisodeTally, StepResult, VectorEnv

logger = logging.getLogger(__name__)


def _serve_members(conn: Any, spec: EnvSpec, count: int, kwargs: dict) -> None:
    """Worker loop: build ``count`` envs and answer ``reset``/``step``/``close`` requests."""
    envs = [make_env(spec, **kwargs) for _ in range(count)]
    try:
        while True:
            command, payload = conn.recv()
            if command == "step":
                conn.send(_step_members(envs, payload))
            elif command == "reset":
                conn.send(np.stack([env.reset(seed=s)[0] for env, s in zip(envs, payload)]))
                if payload[0] is not None:
                    for env, s in zip(envs, payload):
                        env.action_space.seed(s)
            elif command == "spaces":
                conn.send((envs[0].observation_space, envs[0].action_space))
            elif command == "close":
                conn.send(None)
                return
            else:
                raise ValueError(f"unknown command {command!r}")
    except EOFError:
        return
    finally:
        for env in envs:
            env.close()


def _step_members(envs: list, actions: Sequence[Any]) -> tuple:
    observations, rewards, terminated, truncated, final_obs = [], [], [], [], []
    for env, action in zip(envs, actions):
        obs, reward, term, trunc, _ = env.step(action)
        final = None
        if term or trunc:
            final = obs
            obs, _ = env.reset()
        observations.append(obs)
        rewards.append(reward)
        terminated.append(term)
        truncated.append(trunc)
        final_obs.append(final)
    return np.stack(observations), rewards, terminated, truncated, final_obs


class ProcessVectorEnv(VectorEnv):
    """``num_envs`` members of ``spec`` in fiberrl processes (any backend)."""

    def __init__(self, spec: EnvSpec, num_envs: int, seed: Optional[int] = None,
                 envs_per_process: int = 1, timeout: float = 300.0, **kwargs: Any) -> None:
        if num_envs < 1 or envs_per_process < 1:
            raise ValueError("num_envs and envs_per_process must be at least 1")
        self.num_envs = int(num_envs)
        self.seed = seed
        self.timeout = float(timeout)
        n_procs = math.ceil(self.num_envs / envs_per_process)
        self.slices: List[slice] = []
        for p in range(n_procs):
            start = p * envs_per_process
            self.slices.append(slice(start, min(self.num_envs, start + envs_per_process)))
        self.conns: List[Any] = []
        self.procs: List[Any] = []
        try:
            for part in self.slices:
                parent_end, child_end = fiberrl.Pipe()
                proc = fiberrl.Process(target=_serve_members, daemon=True,
                                       args=(child_end, spec, part.stop - part.start, kwargs),
                                       name=f"env-{part.start}-{part.stop - 1}")
                proc.start()
                child_end.close()
                self.conns.append(parent_end)
                self.procs.append(proc)
            self.observation_space, self.action_space = self._ask(0, ("spaces", None))
        except BaseException:
            self.close()
            raise
        self._tally = EpisodeTally(self.num_envs)

    def _ask(self, index: int, message: tuple) -> Any:
        self.conns[index].send(message)
        return self._answer(index)

    def _answer(self, index: int) -> Any:
        conn, proc, part = self.conns[index], self.procs[index], self.slices[index]
        waited = 0.0
        while not conn.poll(1.0):
            waited += 1.0
            if not proc.is_alive():
                break
            if waited >= self.timeout:
                raise RuntimeError(f"env members {part.start}..{part.stop - 1} ({proc.name}) did not "
                                   f"answer within {self.timeout:.0f} s")
        try:
            return conn.recv()
        except EOFError:
            proc.join(5)
            raise RuntimeError(f"the process of env members {part.start}..{part.stop - 1} "
                               f"({proc.name}) died with exit code {proc.exitcode}") from None

    def reset(self, seed: Optional[int] = None) -> np.ndarray:
        """Reset every member (member ``i`` with ``seed + i``)."""
        seed = self.seed if seed is None else seed
        for conn, part in zip(self.conns, self.slices):
            seeds = [None if seed is None else seed + i for i in range(part.start, part.stop)]
            conn.send(("reset", seeds))
        self._tally = EpisodeTally(self.num_envs)
        return np.concatenate([self._answer(i) for i in range(len(self.conns))])

    def step(self, actions: Sequence[Any]) -> StepResult:
        """Step every member in parallel; results in member order."""
        if len(actions) != self.num_envs:
            raise ValueError(f"expected {self.num_envs} actions, got {len(actions)}")
        actions = np.asarray(actions)
        for conn, part in zip(self.conns, self.slices):
            conn.send(("step", actions[part]))
        observations, rewards, terminated, truncated, final_obs = [], [], [], [], []
        for i in range(len(self.conns)):
            obs, rew, term, trunc, final = self._answer(i)
            observations.append(obs)
            rewards.extend(rew)
            terminated.extend(term)
            truncated.extend(trunc)
            final_obs.extend(final)
        terminated_arr = np.asarray(terminated, bool)
        truncated_arr = np.asarray(truncated, bool)
        rewards_arr = np.asarray(rewards, np.float64)
        info = {"episodes": self._tally.add(rewards_arr, terminated_arr | truncated_arr)}
        if any(f is not None for f in final_obs):
            info["final_obs"] = final_obs
        return np.concatenate(observations), rewards_arr, terminated_arr, truncated_arr, info

    def close(self) -> None:
        """Ask every process to stop, then make sure it has."""
        for conn in self.conns:
            try:
                conn.send(("close", None))
            except (OSError, ValueError, EOFError):
                pass
        for proc in self.procs:
            proc.join(10)
            if proc.is_alive():
                proc.terminate()
                proc.join(5)
        for conn in self.conns:
            conn.close()
        self.conns, self.procs = [], []
