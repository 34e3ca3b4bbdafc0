"""Builders for tests/test_rl_pbt.py: PPO members with a fault or a delay injected into
one member's envs. They run in the member processes (imported by reference), so they
live in a module, not in the test file. Member ``i`` of a population with seed 0 trains
with seed ``i * MEMBER_SEED_STRIDE``: that is how a builder knows which member it builds."""
import os
import signal
import time
from pathlib import Path

from rl.builders import build_ppo
from rl.envs.vector import VectorEnv
from rl.pbt import MEMBER_SEED_STRIDE


class Wrapped(VectorEnv):
    """A vector env that calls ``on_step(steps)`` before each step."""

    def __init__(self, env, on_step):
        self.env, self.on_step, self.steps = env, on_step, 0
        self.num_envs = env.num_envs
        self.observation_space, self.action_space = env.observation_space, env.action_space

    def reset(self, seed=None):
        return self.env.reset(seed=seed)

    def step(self, actions):
        self.steps += self.num_envs
        self.on_step(self.steps)
        return self.env.step(actions)

    def close(self):
        self.env.close()


def _member(spec):
    return spec.seed // MEMBER_SEED_STRIDE


def _wrap(trainee, on_step):
    trainee.env = Wrapped(trainee.env, on_step)
    trainee.closers = [trainee.env.close]
    return trainee


def stalled_member_zero(spec):
    """Member 0 stalls 300 env steps into its first interval until the file ``release``
    appears in the population's folder (the slowest member there can be)."""
    trainee = build_ppo(spec)
    if _member(spec) != 0:
        return trainee
    release = Path(spec.out).parent.parent / "release"

    def stall(steps):
        while steps >= 300 and not release.exists():
            time.sleep(0.05)
    return _wrap(trainee, stall)


def kill_member_one_once(spec):
    """Member 1 SIGKILLs its own process 300 steps into its second interval, once
    (a marker file in its folder remembers)."""
    trainee = build_ppo(spec)
    marker = Path(spec.out) / "killed-once"
    if _member(spec) != 1 or marker.exists():
        return trainee

    def maybe_die(steps):
        if steps >= 1024 + 300:
            marker.parent.mkdir(parents=True, exist_ok=True)
            marker.write_text(str(os.getpid()))
            os.kill(os.getpid(), signal.SIGKILL)
    return _wrap(trainee, maybe_die)


def member_two_always_dies(spec):
    """Member 2 SIGKILLs its own process 100 steps after every start."""
    trainee = build_ppo(spec)
    if _member(spec) != 2:
        return trainee

    def die(steps):
        if steps >= 100:
            os.kill(os.getpid(), signal.SIGKILL)
    return _wrap(trainee, die)
