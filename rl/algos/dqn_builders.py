"""``fiberrl train dqn`` and ``fiberrl train parametric_dqn``: how each is set up from a
:class:`rl.train.TrainSpec`.

- ``dqn``: :class:`rl.algos.dqn.DQN` (double + dueling by default) on ``--num-envs``
  envs (default 1), stepped in this process, or in ``--workers`` fiberrl processes
  when ``--workers`` > 0 (rarely worth it: DQN takes one gradient step per few env
  steps, so cheap envs are best stepped in place).
- ``parametric_dqn``: :class:`rl.algos.parametric_dqn.ParametricDQN` on the env
  wrapped with :class:`rl.envs.parametric.ParametricActions` (one-hot action
  features, every action listed); the layout keys of the config are filled in.
  Its :class:`rl.train.Trainee` carries ``eval_env``, the wrapped env's constructor:
  evaluations must use it, since the policy reads the wrapped observation layout.

``--set key=value`` settings go to the policy's config.
"""
from __future__ import annotations

import functools
import logging
import math
from typing import Any

from ..train import Trainee, TrainSpec, register

logger = logging.getLogger(__name__)


def _vector_env(spec: TrainSpec, env_spec: Any) -> Any:
    from ..envs import make_vector_env
    num_envs = spec.num_envs or 1
    if spec.workers > 0:
        return make_vector_env(env_spec, num_envs, seed=spec.seed, in_processes=True,
                               envs_per_process=math.ceil(num_envs / spec.workers))
    return make_vector_env(env_spec, num_envs, seed=spec.seed)


@register("dqn")
def build_dqn(spec: TrainSpec) -> Trainee:
    """DQN on a vector env of ``spec.num_envs`` (default 1) members."""
    from .dqn import DQN
    env = _vector_env(spec, spec.env)
    try:
        config = {"total_steps": spec.total_steps, **spec.overrides}
        agent = DQN(env.observation_space, env.action_space, config=config, seed=spec.seed)
    except BaseException:
        env.close()
        raise
    return Trainee(agent, env, [env.close])


@register("parametric_dqn")
def build_parametric_dqn(spec: TrainSpec) -> Trainee:
    """Parametric-action DQN on ``spec.env`` wrapped with ParametricActions."""
    from ..envs.parametric import parametric_env
    from .parametric_dqn import ParametricDQN
    make = functools.partial(parametric_env, spec.env)
    probe = make()  # the layout, read in this process
    layout = probe.layout
    probe.close()
    env = _vector_env(spec, make)
    try:
        config = {**layout.policy_config(), "total_steps": spec.total_steps, **spec.overrides}
        agent = ParametricDQN(env.observation_space, env.action_space, config=config, seed=spec.seed)
    except BaseException:
        env.close()
        raise
    return Trainee(agent, env, [env.close], eval_env=make)
