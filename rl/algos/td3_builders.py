"""``fiberrl train ddpg`` and ``fiberrl train td3``: :class:`rl.algos.td3.DDPG` and
:class:`rl.algos.td3.TD3` on ``--num-envs`` envs (default 1), stepped in this
process, or in ``--workers`` fiberrl processes when ``--workers`` > 0.

``--set key=value`` settings go to the policy's config (keys of
:data:`rl.algos.td3.TD3_DEFAULTS`), e.g. ``--set learning_starts=5000``.
"""
from __future__ import annotations

import logging

from ..registry import Trainee, TrainSpec, register, step_trainee

logger = logging.getLogger(__name__)


def _build(policy_class: type, spec: TrainSpec) -> Trainee:
    """``policy_class`` on a vector env made from ``spec``."""
    return step_trainee(spec, lambda env: policy_class(
        env.observation_space, env.action_space, config=dict(spec.overrides), seed=spec.seed))


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
