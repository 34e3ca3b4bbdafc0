"""The built-in algorithms of ``fiberrl train``: how each one is set up from a
:class:`rl.train.TrainSpec`.

- ``es``: :class:`rl.algos.es.ES` with ``--workers`` pool workers (at least 1).
- ``ppo``: :data:`rl.algos.ppo.PPO` on ``--num-envs`` envs (default 4), stepped in
  this process, or in ``--workers`` fiberrl processes when ``--workers`` > 0;
  continuous action spaces start from ``CONTINUOUS_DEFAULTS``.
- ``dqn``, ``parametric_dqn``: :mod:`rl.algos.dqn_builders` (``--num-envs`` envs, default 1).
- ``ddpg``, ``td3``: :mod:`rl.algos.td3_builders` (``--num-envs`` envs, default 1).

``--set key=value`` settings go to the algorithm's constructor (ES) or config (PPO).
"""
from __future__ import annotations

import logging

from .algos import dqn_builders, td3_builders  # noqa: F401  (they register themselves)
from .registry import Trainee, TrainSpec, register, step_trainee

logger = logging.getLogger(__name__)


@register("es")
def build_es(spec: TrainSpec) -> Trainee:
    """OpenAI-ES; the population is evaluated on a pool of ``spec.workers`` workers."""
    from .algos.es import ES
    agent = ES(spec.env, seed=spec.seed, workers=max(1, spec.workers), **spec.overrides)
    return Trainee(agent, None, [agent.close])


@register("ppo")
def build_ppo(spec: TrainSpec) -> Trainee:
    """PPO on a vector env (in this process, or in ``spec.workers`` fiberrl processes)."""
    from .algos.ppo import CONTINUOUS_DEFAULTS, PPO
    from .envs import is_discrete

    def make_agent(env):
        defaults = {} if is_discrete(env.action_space) else CONTINUOUS_DEFAULTS
        config = {**defaults, "total_steps": spec.total_steps, **spec.overrides}
        return PPO(env.observation_space, env.action_space, config=config, seed=spec.seed)
    return step_trainee(spec, make_agent, default_num_envs=4)
