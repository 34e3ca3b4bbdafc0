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

from ..registry import Trainee, TrainSpec, register, step_trainee

logger = logging.getLogger(__name__)


@register("dqn")
def build_dqn(spec: TrainSpec) -> Trainee:
    """DQN on a vector env of ``spec.num_envs`` (default 1) members."""
    from .dqn import DQN
    config = {"total_steps": spec.total_steps, **spec.overrides}
    return step_trainee(spec, lambda env: DQN(env.observation_space, env.action_space,
                                              config=config, seed=spec.seed))


@register("parametric_dqn")
def build_parametric_dqn(spec: TrainSpec) -> Trainee:
    """Parametric-action DQN on ``spec.env`` wrapped with ParametricActions."""
    from ..envs.parametric import parametric_env
    from .parametric_dqn import ParametricDQN
    make = functools.partial(parametric_env, spec.env)
    probe = make()  # the layout, read in this process
    layout = probe.layout
    probe.close()
    config = {**layout.policy_config(), "total_steps": spec.total_steps, **spec.overrides}
    return step_trainee(spec, lambda env: ParametricDQN(env.observation_space, env.action_space,
                                                        config=config, seed=spec.seed),
                        env_spec=make, eval_env=make)
