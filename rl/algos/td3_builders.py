"""``fiberrl train ddpg`` and ``fiberrl train td3``: :class:`rl.algos.td3.DDPG` and
:class:`rl.algos.td3.TD3` on ``--num-envs`` envs (default 1), stepped in this
process, or in ``--workers`` fiberrl processes when ``--workers`` > 0.

``--set key=value`` settings go to the policy's config (keys of
:data:`rl.algos.td3.TD3_DEFAULTS`), e.g. ``--set learning_starts=5000``.
"""
from __future__ import annotations

import logging
import math

from ..train import Trainee, TrainSpec, register

logger = logging.getLogger(__name__)


def _build(policy_class: type, spec: TrainSpec) -> Trainee:
    """``policy_class`` on a vector env made from ``spec``; the env is closed on failure."""
    from ..envs import make_vector_env
    num_envs = spec.num_envs or 1
    if spec.workers > 0:
        env = make_vector_env(spec.env, num_envs, seed=spec.seed, in_processes=True,
                              envs_per_process=math.ceil(num_envs / spec.workers))
    else:
        env = make_vector_env(spec.env, num_envs, seed=spec.seed)
    try:
        agent = policy_class(env.observation_space, env.action_space,
                             config=dict(spec.overrides), seed=spec.seed)
    except BaseException:
        env.close()
        raise
    return Trainee(agent, env, [env.close])


@register("td3")
def build_td3(spec: TrainSpec) -> Trainee:
    """TD3 (twin critics, delayed actor, target smoothing) on a vector env."""
    from .td3 import TD3
    return _build(TD3, spec)


@register("ddpg")
def build_ddpg(spec: TrainSpec) -> Trainee:
    """DDPG (TD3 with its refinements off) on a vector env."""
    from .td3 import DDPG
    return _build(DDPG, spec)
