"""The modules around a value model trained offline: the normalization in front of
it, and its scorer for export.

Offline datasets mark a missing feature with NaN (see :mod:`rl.offline.dataset`);
:class:`MaskedNormalizer` turns that into the presence mask the
:class:`~rl.data.normalization.FeatureNormalizer` takes, so the model's input is a
single tensor and the same module serves training, CPE and online evaluation.
"""
from __future__ import annotations

import torch
from torch import nn


class MaskedNormalizer(nn.Module):
    """``x [B, F]`` with NaN for missing features -> the normalized ``[B, D]``."""

    def __init__(self, normalizer: nn.Module) -> None:
        super().__init__()
        self.normalizer = normalizer
        self.output_dim = int(normalizer.output_dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        present = ~torch.isnan(x)
        return self.normalizer(torch.nan_to_num(x, nan=0.0), present)


class QScorer(nn.Module):
    """A DQN Q-network's torso and head on already normalized inputs, in a form
    ``torch.jit.script`` compiles (what :class:`rl.export.ExportedPolicy` scores with)."""

    def __init__(self, q_network: nn.Module) -> None:
        super().__init__()
        self.torso = q_network.torso
        self.dueling = bool(q_network.dueling)
        self.advantage = q_network.advantage if self.dueling else q_network.head
        self.value = q_network.value if self.dueling else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.torso(x)
        a = self.advantage(h)
        if self.dueling:
            return self.value(h) + a - a.mean(dim=1, keepdim=True)
        return a
