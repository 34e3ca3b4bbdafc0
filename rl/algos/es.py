"""OpenAI Evolution Strategies on a ``fiberrl.Pool``.

Salimans, Ho, Chen, Sidor and Sutskever (2017), "Evolution Strategies as a
Scalable Alternative to Reinforcement Learning", arXiv:1703.03864.

One generation, as :meth:`ES.generation` runs it::

    learner                                          pool workers (rl.algos.es_worker)
    draw n noise offsets i_j (shared noise table)
    episode seeds s_j = f(seed, generation, j)
    split the n pairs into tasks of k pairs  ----->  per task: theta +- sigma * eps_j,
                                                     one episode each from seed s_j
    returns R[n, 2]  <-----------------------------  (only returns and lengths come back)
    u = centered_ranks(R)  (in [-0.5, 0.5])
    g = sum_j (u_j+ - u_j-) eps_j / (2n)
    theta += Adam(-g + weight_decay * theta)

Design decisions:

- **Antithetic sampling**: every noise vector is evaluated as ``+eps`` and
  ``-eps`` (mirrored sampling): the even-order terms of the fitness's Taylor
  expansion cancel in ``F(theta + sigma eps) - F(theta - sigma eps)``, which
  lowers the variance of the estimate at no extra cost per episode.
- **Shared noise table** (:mod:`rl.algos.noise_table`): learner and workers build
  the same table from the run's seed; a perturbation travels as one integer.
- **Common random numbers**: both members of a pair start from the same
  episode seed, derived from ``(seed, generation, pair index)``.
- **Centered rank shaping** with ties averaged: returns become ranks scaled to
  ``[-0.5, 0.5]`` (invariant to the reward scale, robust to outliers). Tied
  returns share their mean rank, so a pair that both hit CartPole's 500 cap
  contributes nothing instead of noise from the sort order.
- **Gradient scale**: as in the reference implementation, the estimate is not
  divided by ``sigma`` (Adam is invariant to that scale); ``weight_decay``
  is added to the negated estimate before Adam, so its strength is relative to
  rank-shaped returns, as in the paper's configs.
- **Adam** with ``beta1=0.9, beta2=0.999, eps=1e-8``; the update is
  ``-lr * sqrt(1 - beta2^t) / (1 - beta1^t) * m / (sqrt(v) + eps)``.
- **Deterministic policies**: perturbed members act greedily (argmax for
  discrete actions, the squashed mean for Box actions); ES explores in
  parameter space, so ``compute_actions`` ignores ``explore``.
- **No observation normalization** (left out on purpose): OpenAI-ES keeps
  running observation statistics for MuJoCo, whose observations span orders of
  magnitude. The environments here (CartPole, Pendulum, Gridworld) have
  observations of order 1 to 10 and CartPole meets its bar without them; they
  would make the objective non-stationary and add state that every task and
  checkpoint must carry. Scale observations in the env for other tasks.
- **Reproducible**: given ``seed``, the parameters after N generations are the
  same whatever the number of workers or the backend: tasks are formed
  independently of the pool, every episode depends only on its parameters and
  seed, and results are combined in task order. (Changing ``episodes_per_task``
  gave identical results too in our runs, but batched float rounding is not
  guaranteed to be independent of the batch size.)
- **Tasks**: ``episodes_per_task`` episodes per pool task, so a population of
  thousands is a few hundred tasks. All tasks of a generation carry the *same*
  ``theta`` array object, so on a ``fiberrl.Pool`` a ``theta`` of 64 KiB or more
  (16k+ parameters) crosses the wire once per worker per generation, not once per
  task, and from 1 MiB (256k+ parameters) once per host, mapped from shared memory by
  the workers there (the pool's argument cache, :mod:`fiberrl.pool.shared`); a smaller
  one (CartPole's default policy has 1,282 parameters, 5 KB) simply rides inside each
  task.
"""
from __future__ import annotations

import logging
import os
import time
from typing import Any, Optional, Sequence, Tuple

import numpy as np

from ..envs import EnvSpec, make_env
from ..population import Generation, PopulationAlgorithm
from .es_worker import ESTask, evaluate_task
from .noise_table import DEFAULT_SIZE, shared_table
from .numpy_policy import NumpyMLP

logger = logging.getLogger(__name__)

ADAM_BETA1, ADAM_BETA2, ADAM_EPS = 0.9, 0.999, 1e-8


def centered_ranks(values: np.ndarray) -> np.ndarray:
    """Ranks of ``values`` scaled to ``[-0.5, 0.5]`` (same shape; ties share their mean rank).

    The smallest value maps to -0.5, the largest to 0.5, and the result sums to zero.
    """
    values = np.asarray(values, dtype=np.float64)
    flat = values.reshape(-1)
    if not np.all(np.isfinite(flat)):
        raise ValueError("centered_ranks got a NaN or infinite return")
    if flat.size < 2:
        return np.zeros_like(values)
    order = np.argsort(flat, kind="stable")
    _, first, counts = np.unique(flat[order], return_index=True, return_counts=True)
    ranks = np.empty(flat.size, np.float64)
    ranks[order] = np.repeat(first + (counts - 1) / 2.0, counts)
    return (ranks / (flat.size - 1) - 0.5).reshape(values.shape)


class Adam:
    """Adam (Kingma and Ba 2015) on a flat float64 vector; :meth:`step` returns the update."""

    def __init__(self, dim: int, learning_rate: float) -> None:
        self.learning_rate = float(learning_rate)
        self.m = np.zeros(dim)
        self.v = np.zeros(dim)
        self.t = 0

    def step(self, gradient: np.ndarray) -> np.ndarray:
        """The update to add to the parameters for a gradient to descend."""
        self.t += 1
        self.m = ADAM_BETA1 * self.m + (1.0 - ADAM_BETA1) * gradient
        self.v = ADAM_BETA2 * self.v + (1.0 - ADAM_BETA2) * gradient * gradient
        rate = self.learning_rate * np.sqrt(1.0 - ADAM_BETA2 ** self.t) / (1.0 - ADAM_BETA1 ** self.t)
        return -rate * self.m / (np.sqrt(self.v) + ADAM_EPS)


class ES(PopulationAlgorithm):
    """OpenAI-ES (Salimans et al. 2017) with its population evaluated on a ``fiberrl.Pool``.

    The defaults are tuned for CartPole-v1: over seeds 0-19 the deterministic
    evaluation (10 episodes) first reached 475 after a median of 41,000 and at
    most 104,000 training env steps (budget: 200,000). A sweep over population
    (24-64), sigma (0.05-0.2), learning rate (0.03-0.2), weight decay (0-0.02)
    and networks ((), (8,), (16,), (32,), (64,), (32, 32)) found no setting with
    a lighter tail; a linear policy was the slowest. ``bench/bench_es.py`` measures
    seeds 0, 1, 2. Other environments need their own ``population`` and ``sigma``.

    Args:
        env: a gymnasium id (``"CartPole-v1"``) or a picklable constructor; it
            is made in every worker, so an env *object* is refused.
        population: episodes per generation, an even number >= 2 (``n = population
            / 2`` antithetic pairs; default 32). Pitfall: one generation's env
            steps are about ``population * episode length``, so on CartPole
            (500 steps once solved) 32 means up to 16,000 steps per generation;
            a larger population gives a better estimate but fewer updates per
            step budget.
        sigma: standard deviation of the parameter perturbations, in parameter
            units (default 0.05; hidden weights start with unit-norm rows, so
            this is about 5% of a row's norm). Too small and deterministic argmax
            policies see no change in return (tied ranks, no signal); too large
            and the estimate stops being local.
        learning_rate: Adam step size: roughly the largest change of any one
            parameter per generation, in parameter units (default 0.1).
        weight_decay: L2 coefficient ``c`` (default 0.005): Adam descends
            ``-g + c * theta`` where ``g`` is the rank-shaped estimate (see the
            module doc). It keeps weights small so that ``sigma`` stays
            meaningful; 0 disables it (on CartPole that gave a heavier tail).
        hidden: hidden layer widths of the tanh MLP (default ``(32, 32)``,
            1,282 parameters on CartPole; ``()`` is a linear policy).
        noise_table_size: numbers in the shared noise table (float32, 4 bytes
            each, built in the learner and once in every worker process: about
            0.02 s and 4 MB per million; default 10 million). Must be at least
            the parameter count, and should be much larger so slices rarely overlap.
        episodes_per_task: episodes (perturbed policies) per pool task, even
            (default 8). Larger tasks cost less per-task overhead and step more
            episodes per batched forward pass; smaller ones balance the load
            better. Pitfall: with fewer tasks than workers some workers idle.
        max_episode_steps: stop training episodes after this many steps
            (``None``: the env's own limit, and at most 100,000). Evaluation by
            :func:`rl.evaluation.evaluate` is not affected.
        seed: a non-negative int; fixes the initial parameters, the noise
            table, the noise offsets and the episode seeds.
        pool: a ``fiberrl.Pool`` (or any object with ``map``) owned by the
            caller; ``close()`` leaves it open.
        workers: with ``pool=None``, the size of the ``fiberrl.Pool`` that ES
            creates (default: ``os.cpu_count()``) and closes in ``close()``.
    """

    def __init__(self, env: EnvSpec, *, population: int = 32, sigma: float = 0.05,
                 learning_rate: float = 0.1, weight_decay: float = 0.005,
                 hidden: Sequence[int] = (32, 32), noise_table_size: int = DEFAULT_SIZE,
                 episodes_per_task: int = 8, max_episode_steps: Optional[int] = None,
                 seed: int = 0, pool: Any = None, workers: Optional[int] = None) -> None:
        _check_args(population, sigma, learning_rate, weight_decay, noise_table_size,
                    episodes_per_task, max_episode_steps, seed, workers)
        env_object = not isinstance(env, type) and hasattr(env, "step")
        if env_object or not (isinstance(env, str) or callable(env)):
            raise TypeError("ES needs an env id or a picklable env constructor (it makes the "
                            f"env in every worker), got {type(env).__name__}")
        self.env = env
        self.population = int(population)
        self.sigma = float(sigma)
        self.weight_decay = float(weight_decay)
        self.episodes_per_task = int(episodes_per_task)
        self.max_episode_steps = None if max_episode_steps is None else int(max_episode_steps)
        self.seed = int(seed)
        self.noise_table_size = int(noise_table_size)

        probe = make_env(env)
        try:
            self.policy = NumpyMLP.for_spaces(probe.observation_space, probe.action_space, hidden)
        finally:
            probe.close()
        dim = self.policy.num_params
        if dim > self.noise_table_size:
            raise ValueError(f"noise_table_size={self.noise_table_size} is smaller than the "
                             f"policy's {dim} parameters")
        init_seq, index_seq = np.random.SeedSequence(self.seed).spawn(2)
        self.theta = self.policy.init_params(np.random.default_rng(init_seq)).astype(np.float64)
        self.rng = np.random.default_rng(index_seq)  # draws the noise offsets
        self.adam = Adam(dim, learning_rate)
        self.generations = 0
        self.env_steps = 0
        self.table = shared_table(self.seed, self.noise_table_size)

        self._owns_pool = pool is None
        if pool is None:
            import fiberrl
            pool = fiberrl.Pool(workers or os.cpu_count() or 1)
        self.pool = pool
        logger.debug("ES on %s: %d parameters, population %d, %d episodes per task",
                     env, dim, self.population, self.episodes_per_task)

    # -- one generation ---------------------------------------------------------------
    def generation(self) -> Generation:
        """Evaluate ``population`` perturbed policies on the pool and take one Adam step."""
        if self.pool is None:
            raise ValueError("this ES is closed (its pool was closed by close())")
        started = time.perf_counter()
        dim, pairs = self.policy.num_params, self.population // 2
        indices = self.table.sample_index(self.rng, dim, pairs)
        episode_seeds = np.random.SeedSequence([self.seed, self.generations]).generate_state(
            pairs, dtype=np.uint32).astype(np.int64)
        theta32 = self.theta.astype(np.float32)  # one object for every task: shared (see above)
        per_task = self.episodes_per_task // 2
        tasks = [ESTask(self.env, self.policy, theta32, self.sigma, self.seed, self.noise_table_size,
                        indices[i:i + per_task], episode_seeds[i:i + per_task], self.max_episode_steps)
                 for i in range(0, pairs, per_task)]

        map_started = time.perf_counter()
        results = self.pool.map(evaluate_task, tasks, chunksize=1)
        pool_s = time.perf_counter() - map_started
        returns = np.concatenate([r.returns for r in results])  # [pairs, 2]: (+eps, -eps)
        lengths = np.concatenate([r.lengths for r in results])

        ranks = centered_ranks(returns)
        estimate = self.table.weighted_sum(ranks[:, 0] - ranks[:, 1], indices, dim) / returns.size
        update = self.adam.step(-estimate + self.weight_decay * self.theta)
        self.theta += update
        self.generations += 1
        steps = int(lengths.sum())
        self.env_steps += steps

        stats = {
            "return_mean": float(returns.mean()), "return_max": float(returns.max()),
            "return_min": float(returns.min()), "return_std": float(returns.std()),
            "episode_length_mean": float(lengths.mean()),
            "grad_norm": float(np.linalg.norm(estimate)), "update_norm": float(np.linalg.norm(update)),
            "param_norm": float(np.linalg.norm(self.theta)),
            "tasks": float(len(tasks)), "pool_eval_s": pool_s,
            "worker_s": float(sum(r.seconds for r in results)),
            "generation_s": time.perf_counter() - started, "generation": float(self.generations),
        }
        logger.debug("generation %d: return mean %.1f max %.1f, %d steps, %.2f s",
                     self.generations, stats["return_mean"], stats["return_max"], steps,
                     stats["generation_s"])
        episodes = [(float(r), int(n)) for r, n in zip(returns.reshape(-1), lengths.reshape(-1))]
        return Generation(episodes=episodes, env_steps=steps, stats=stats)

    # -- acting -----------------------------------------------------------------------
    def compute_actions(self, obs: np.ndarray, explore: bool = True) -> Tuple[np.ndarray, dict]:
        """Greedy actions of the unperturbed parameters (``explore`` is ignored: see the
        module doc); extras hold the network outputs under ``"outputs"``."""
        outputs = self.policy.forward(self.theta.astype(np.float32), self.policy.preprocess(obs))
        return self.policy.actions(outputs), {"outputs": outputs}

    # -- checkpoints ------------------------------------------------------------------
    def state_dict(self) -> dict:
        """Parameters, Adam moments and step, counters and the offset RNG's state."""
        return {
            "theta": self.theta.copy(), "adam_m": self.adam.m.copy(), "adam_v": self.adam.v.copy(),
            "adam_t": self.adam.t, "generations": self.generations, "env_steps": self.env_steps,
            "rng": self.rng.bit_generator.state, "seed": self.seed,
            "noise_table_size": self.noise_table_size,
        }

    def load_state_dict(self, state: dict) -> None:
        """Restore :meth:`state_dict`'s output; later generations continue identically."""
        theta = np.asarray(state["theta"], np.float64)
        if theta.shape != self.theta.shape:
            raise ValueError(f"state holds {theta.shape} parameters, this ES has {self.theta.shape}")
        if (state["seed"], state["noise_table_size"]) != (self.seed, self.noise_table_size):
            raise ValueError("state comes from an ES with another seed or noise table "
                             f"({state['seed']}, {state['noise_table_size']}); build this one with "
                             "the same seed and noise_table_size")
        self.theta = theta.copy()
        self.adam.m = np.asarray(state["adam_m"], np.float64).copy()
        self.adam.v = np.asarray(state["adam_v"], np.float64).copy()
        self.adam.t = int(state["adam_t"])
        self.generations = int(state["generations"])
        self.env_steps = int(state["env_steps"])
        self.rng.bit_generator.state = state["rng"]

    def close(self) -> None:
        """Close and join the pool if ES created it (a caller's pool is left alone)."""
        if self._owns_pool and self.pool is not None:
            self.pool.close()
            self.pool.join()
            self.pool = None

    def __enter__(self) -> "ES":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _check_args(population: int, sigma: float, learning_rate: float, weight_decay: float,
                noise_table_size: int, episodes_per_task: int, max_episode_steps: Optional[int],
                seed: int, workers: Optional[int]) -> None:
    """Raise ValueError for arguments ES cannot run with."""
    if not isinstance(population, (int, np.integer)) or population < 2 or population % 2:
        raise ValueError(f"population must be an even int >= 2 (antithetic pairs), got {population!r}")
    if not sigma > 0:
        raise ValueError(f"sigma must be > 0, got {sigma!r}")
    if not learning_rate > 0:
        raise ValueError(f"learning_rate must be > 0, got {learning_rate!r}")
    if not weight_decay >= 0:
        raise ValueError(f"weight_decay must be >= 0, got {weight_decay!r}")
    if noise_table_size < 1:
        raise ValueError(f"noise_table_size must be positive, got {noise_table_size!r}")
    if episodes_per_task < 2 or episodes_per_task % 2:
        raise ValueError(f"episodes_per_task must be an even int >= 2, got {episodes_per_task!r}")
    if max_episode_steps is not None and max_episode_steps < 1:
        raise ValueError(f"max_episode_steps must be >= 1 or None, got {max_episode_steps!r}")
    if not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ValueError(f"seed must be a non-negative int, got {seed!r}")
    if workers is not None and workers < 1:
        raise ValueError(f"workers must be >= 1, got {workers!r}")
