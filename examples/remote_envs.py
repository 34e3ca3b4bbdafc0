"""Step gymnasium environments that live in remote manager jobs, all at once.

    python examples/remote_envs.py [--envs 16] [--servers 4] [--steps 500] [--backend local]

Fiber's "RemoteEnvManager" pattern: each manager server is a fiberrl job holding some
environments; the learner holds asynchronous proxies and steps every environment in
one round of calls, collecting the results with ``gather``. A random policy stands
in for the learner; the script logs the episodes finished and their mean return.
"""
import argparse
import logging
import random
import time
from contextlib import ExitStack

import fiberrl
from fiberrl.asyncproxy import AsyncManager, gather

logger = logging.getLogger("remote_envs")


class EpisodeEnv:
    """A CartPole that resets itself at the end of an episode and keeps its returns."""

    def __init__(self, seed: int) -> None:
        import gymnasium as gym
        self.env = gym.make("CartPole-v1")
        self.observation, _ = self.env.reset(seed=seed)
        self.episode_return = 0.0
        self.returns = []

    def step(self, action: int):
        """One step; returns the observation the policy acts on next."""
        self.observation, reward, terminated, truncated, _ = self.env.step(action)
        self.episode_return += reward
        if terminated or truncated:
            self.returns.append(self.episode_return)
            self.episode_return = 0.0
            self.observation, _ = self.env.reset()
        return self.observation

    def finished_returns(self):
        """Returns of the episodes finished so far."""
        return list(self.returns)


class EnvManager(AsyncManager):
    """A manager job serving ``EpisodeEnv`` objects."""


EnvManager.register("Env", EpisodeEnv, exposed=("step", "finished_returns"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--envs", type=int, default=16)
    parser.add_argument("--servers", type=int, default=4, help="manager jobs to spread them over")
    parser.add_argument("--steps", type=int, default=500, help="steps of every environment")
    parser.add_argument("--backend", default=None, help="fiberrl backend (default: config)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if args.backend:
        fiberrl.init(backend=args.backend)
    with ExitStack() as stack:
        servers = [stack.enter_context(EnvManager()) for _ in range(max(1, args.servers))]
        envs = [servers[i % len(servers)].Env(seed=i) for i in range(args.envs)]
        rng = random.Random(0)
        started = time.perf_counter()
        for _ in range(args.steps):
            gather([env.step(rng.randrange(2)) for env in envs], timeout=120)
        elapsed = time.perf_counter() - started
        returns = [r for rs in gather([env.finished_returns() for env in envs]) for r in rs]
        for env in envs:
            env._close()
    logger.info("%d environments in %d manager jobs, %d steps each: %.2f s (%.0f steps/s)",
                len(envs), len(servers), args.steps, elapsed, len(envs) * args.steps / elapsed)
    logger.info("%d episodes finished, mean return %.1f (random policy)",
                len(returns), sum(returns) / max(1, len(returns)))


if __name__ == "__main__":
    main()
