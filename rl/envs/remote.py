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

A step is the hot path of every on-policy algorithm, so arrays of numbers travel as
raw bytes (:mod:`rl.envs.step_codec`): the actions' buffer one way; the observations,
rewards and done flags in one buffer the other way, with the final observations of
the members whose episode ended appended. Anything else (dict or tuple observations,
object arrays) and the rare requests (reset, spaces, close) are pickles. Every
message starts with a one-byte request or answer code.
"""
from __future__ import annotations

import logging
import math
import pickle
from typing import Any, List, Optional, Sequence

import numpy as np

import fiberrl
from fiberrl.backends import default_backend

from . import step_codec
from .make import EnvSpec, make_env
from .vector import EpisodeTally, StepResult, VectorEnv

logger = logging.getLogger(__name__)

_STEP, _STEP_PICKLED, _RESET, _SPACES, _CLOSE = b"s", b"S", b"r", b"p", b"c"


def _serve_members(conn: Any, spec: EnvSpec, count: int, kwargs: dict) -> None:
    """Worker loop: build ``count`` envs and answer reset/step/spaces/close requests."""
    envs = [make_env(spec, **kwargs) for _ in range(count)]
    try:
        while True:
            request = conn.recv_bytes()
            code = request[:1]
            if code == _STEP:
                conn.send_bytes(_step(envs, step_codec.decode_actions(request, 1)))
            elif code == _STEP_PICKLED:
                conn.send_bytes(_step(envs, pickle.loads(request[1:])))
            elif code == _RESET:
                seeds = pickle.loads(request[1:])
                obs = np.stack([env.reset(seed=s)[0] for env, s in zip(envs, seeds)])
                if seeds[0] is not None:
                    for env, s in zip(envs, seeds):
                        env.action_space.seed(s)
                conn.send_bytes(_RESET + pickle.dumps(obs, pickle.HIGHEST_PROTOCOL))
            elif code == _SPACES:
                conn.send_bytes(_SPACES + pickle.dumps(
                    (envs[0].observation_space, envs[0].action_space), pickle.HIGHEST_PROTOCOL))
            elif code == _CLOSE:
                conn.send_bytes(_CLOSE)
                return
            else:
                raise ValueError(f"unknown request {code!r}")
    except EOFError:
        return
    finally:
        for env in envs:
            env.close()


def _step(envs: list, actions: Sequence[Any]) -> bytes:
    """Step every member (resetting those whose episode ended); the answer's bytes."""
    observations, rewards, flags, finals = [], [], bytearray(len(envs)), []
    for i, (env, action) in enumerate(zip(envs, actions)):
        obs, reward, term, trunc, _ = env.step(action)
        if term or trunc:
            flags[i] = (step_codec.TERMINATED if term else 0) | (step_codec.TRUNCATED if trunc else 0)
            finals.append(obs)
            obs, _ = env.reset()
        observations.append(obs)
        rewards.append(reward)
    raw = step_codec.encode_answer(observations, rewards, flags, finals)
    if raw is not None:
        return _STEP + raw
    final_obs = iter(finals)
    return _STEP_PICKLED + pickle.dumps(
        (observations, rewards, flags, [next(final_obs) if f else None for f in flags]),
        pickle.HIGHEST_PROTOCOL)


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
        self._bounds = tuple((part.start, part.stop) for part in self.slices)
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
            self.observation_space, self.action_space = self._ask(0, _SPACES)
        except BaseException:
            self.close()
            raise
        self._tally = EpisodeTally(self.num_envs)
        self._on_this_machine = default_backend().uses_local_cores

    def processes_here(self) -> int:
        """The env processes, when their backend runs them on this machine's cores
        (local; a dockerd on this machine); 0 on Slurm, Kubernetes or a remote dockerd,
        whose jobs may run anywhere."""
        return len(self.procs) if self._on_this_machine else 0

    def _ask(self, index: int, code: bytes, payload: Any = None) -> Any:
        self.conns[index].send_bytes(code + pickle.dumps(payload, pickle.HIGHEST_PROTOCOL))
        return pickle.loads(self._answer(index)[1:])

    def _answer(self, index: int) -> bytes:
        """The next message from process ``index``; ``RuntimeError`` if it died or
        did not answer within the timeout."""
        conn = self.conns[index]
        if not conn.poll(1.0):
            self._wait_for(index)
        try:
            return conn.recv_bytes()
        except EOFError:
            proc, part = self.procs[index], self.slices[index]
            proc.join(5)
            raise RuntimeError(f"the process of env members {part.start}..{part.stop - 1} "
                               f"({proc.name}) died with exit code {proc.exitcode}") from None

    def _wait_for(self, index: int) -> None:
        """Wait for process ``index`` to answer (or die), a second at a time, after its
        first second; ``RuntimeError`` once :attr:`timeout` has passed."""
        conn, proc, part = self.conns[index], self.procs[index], self.slices[index]
        waited = 1.0
        while proc.is_alive():
            if waited >= self.timeout:
                raise RuntimeError(f"env members {part.start}..{part.stop - 1} ({proc.name}) did not "
                                   f"answer within {self.timeout:.0f} s")
            if conn.poll(1.0):
                return
            waited += 1.0

    def _decode_one_by_one(self, answers: List[bytes]) -> tuple:
        """``(obs, rewards, flags, final_obs)`` of answers that
        :func:`step_codec.decode_answers` declined, each decoded alone."""
        parts = []
        for data, part in zip(answers, self.slices):
            if data[:1] == _STEP:
                parts.append(step_codec.decode_answer(data, 1))
                continue
            observations, rewards, flags, final_obs = pickle.loads(data[1:])
            parts.append((np.stack(observations), np.asarray(rewards, np.float64),
                          np.frombuffer(bytes(flags), np.uint8), final_obs if any(flags) else None))
        observations, returns, flag_parts, finals = zip(*parts)
        final_obs = None
        if finals.count(None) != len(finals):
            final_obs = [f for part, members in zip(self.slices, finals)
                         for f in (members or [None] * (part.stop - part.start))]
        return (np.concatenate(observations), np.concatenate(returns),
                np.concatenate(flag_parts), final_obs)

    def reset(self, seed: Optional[int] = None) -> np.ndarray:
        """Reset every member (member ``i`` with ``seed + i``)."""
        seed = self.seed if seed is None else seed
        for conn, part in zip(self.conns, self.slices):
            seeds = [None if seed is None else seed + i for i in range(part.start, part.stop)]
            conn.send_bytes(_RESET + pickle.dumps(seeds, pickle.HIGHEST_PROTOCOL))
        self._tally = EpisodeTally(self.num_envs)
        return np.concatenate([pickle.loads(self._answer(i)[1:]) for i in range(len(self.conns))])

    def step(self, actions: Sequence[Any]) -> StepResult:
        """Step every member in parallel; results in member order."""
        if len(actions) != self.num_envs:
            raise ValueError(f"expected {self.num_envs} actions, got {len(actions)}")
        actions = np.asarray(actions)
        requests = step_codec.encode_requests(actions, self._bounds, _STEP)
        if requests is None:
            requests = [_STEP_PICKLED + pickle.dumps(actions[part], pickle.HIGHEST_PROTOCOL)
                        for part in self.slices]
        for conn, request in zip(self.conns, requests):
            conn.send_bytes(request)
        answers = [self._answer(i) for i in range(len(self.conns))]
        decoded = step_codec.decode_answers(answers, _STEP[0])
        if decoded is None:   # pickled answers, or members whose observations differ
            decoded = self._decode_one_by_one(answers)
        obs, rewards, flags, final_obs = decoded
        terminated = (flags & step_codec.TERMINATED).view(bool)
        truncated = ((flags & step_codec.TRUNCATED) >> 1).view(bool)   # each 0 or 1: bools
        info = {"episodes": self._tally.add(rewards, terminated | truncated)}
        if final_obs is not None:
            info["final_obs"] = final_obs
        return obs, rewards, terminated, truncated, info

    def close(self) -> None:
        """Ask every process to stop, then make sure it has."""
        for conn in self.conns:
            try:
                conn.send_bytes(_CLOSE)
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
