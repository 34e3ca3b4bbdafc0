"""Sorting shuffled step rows into padded per-episode matrices.

Rows are sorted once by ``(mdp_id, sequence_number)`` with :func:`numpy.lexsort`
and scattered into ``(n_episodes, horizon)`` matrices, where ``horizon`` is the
longest episode.  Padding follows the convention of Jiang & Li (2016) and
Thomas & Brunskill (2016): after its last step an episode sits in an absorbing
state with reward 0, model value 0 and per-step importance ratio 1, so

* the cumulative importance weight ``W[i, t] = prod_{k<=t} rho[i, k]`` of an
  ended episode keeps its final value (it still counts in the normalisers of
  the weighted estimators, it is neither dropped nor zeroed);
* rewards, ``Q(s_t, a_t)`` and ``V(s_t) = sum_a pi(a|s_t) Q(s_t, a)`` are zero.

Every estimator is then vectorised numpy over these matrices.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from typing import Any

import numpy as np


logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class EpisodeData:
    """Padded per-episode matrices built from :class:`~cpe.data.Trajectories`.

    Attributes:
        lengths: ``(n,)`` number of logged steps per episode.
        gamma: discount factor.
        discounts: ``(T,)`` ``gamma ** t``.
        rewards: ``(n, T)`` rewards, zero after the end.
        weights: ``(n, T)`` cumulative importance weights ``W_t = prod_{k<=t} rho_k``,
            held at their final value after the end.
        q_logged: ``(n, T)`` ``Q(s_t, a_t)``, zero after the end (``None`` without a model).
        v_target: ``(n, T)`` ``V(s_t) = sum_a pi(a|s_t) Q(s_t, a)``, zero after the end
            (``None`` without a model).
        episode_ids: ``(n,)`` the mdp id of each padded row.
    """

    lengths: np.ndarray
    gamma: float
    discounts: np.ndarray
    rewards: np.ndarray
    weights: np.ndarray
    q_logged: np.ndarray | None
    v_target: np.ndarray | None
    episode_ids: np.ndarray

    @property
    def n_episodes(self) -> int:
        """Number of episodes."""
        return int(self.lengths.shape[0])

    @property
    def horizon(self) -> int:
        """Length of the longest episode (number of padded columns)."""
        return int(self.rewards.shape[1])

    @property
    def weights_prev(self) -> np.ndarray:
        """``(n, T)`` cumulative weight of the previous step (``W_{-1} = 1``)."""
        prev = np.empty_like(self.weights)
        prev[:, 0] = 1.0
        prev[:, 1:] = self.weights[:, :-1]
        return prev

    def logged_returns(self) -> np.ndarray:
        """``(n,)`` discounted return of every logged episode."""
        return self.rewards @ self.discounts


def _episode_codes(ids: np.ndarray) -> np.ndarray:
    """Sortable integer/float keys that group rows by episode."""
    if ids.dtype.kind in "iufb":
        return ids
    _, codes = np.unique(ids, return_inverse=True)
    return codes.reshape(-1)


def _sort_order(codes: np.ndarray, seq: np.ndarray) -> np.ndarray:
    """Row order sorting by episode, then sequence number.

    Integer ids and integral sequence numbers are packed into one int64 key (one
    argsort, much faster than :func:`numpy.lexsort`); otherwise lexsort is used.
    Already-sorted input is detected and left alone.
    """
    integral = seq.dtype.kind in "iu" or bool(np.all(seq == np.floor(seq)))
    if codes.dtype.kind in "iub" and integral and int(seq.max()) - int(seq.min()) < 2**62:
        c = codes.astype(np.int64) - int(codes.min())
        s = seq.astype(np.int64) - int(seq.min())
        span = int(s.max()) + 1
        if int(c.max()) < (2**62) // span:
            key = c * span + s
            if np.all(key[1:] >= key[:-1]):
                return np.arange(key.shape[0])
            return np.argsort(key)
    return np.lexsort((seq, codes))


def _scatter(values: np.ndarray, episode: np.ndarray, step: np.ndarray, shape: tuple[int, int],
             fill: float) -> np.ndarray:
    """Place per-row ``values`` into a ``shape`` matrix at ``(episode, step)``."""
    out = np.full(shape, fill, dtype=np.float64)
    out[episode, step] = values
    return out


def build_episodes(traj: Any) -> EpisodeData:
    """Sort the rows of ``traj`` and build padded episode matrices.

    Raises:
        ValueError: if a ``(mdp_id, sequence_number)`` pair occurs twice, or if the
            cumulative importance weights overflow float64.
    """
    codes = _episode_codes(traj.mdp_ids)
    order = _sort_order(codes, traj.sequence_numbers)
    sorted_codes = codes[order]
    sorted_seq = traj.sequence_numbers[order]
    n_rows = order.shape[0]

    new_episode = np.empty(n_rows, dtype=bool)
    new_episode[0] = True
    np.not_equal(sorted_codes[1:], sorted_codes[:-1], out=new_episode[1:])
    duplicate = ~new_episode[1:] & (sorted_seq[1:] == sorted_seq[:-1])
    if duplicate.any():
        first = int(order[1:][duplicate][0])
        raise ValueError(
            "sequence_numbers: duplicate (mdp_id, sequence_number) pair "
            f"({traj.mdp_ids[first]!r}, {traj.sequence_numbers[first]}) at row {first}"
        )
    starts = np.flatnonzero(new_episode)
    lengths = np.diff(np.append(starts, n_rows))
    episode = np.cumsum(new_episode) - 1
    step = np.arange(n_rows) - starts[episode]
    shape = (starts.shape[0], int(lengths.max()))

    rows = np.arange(n_rows)
    # Gather per-row scalars in the original order, then permute 1-D vectors only.
    rho = (traj.target_probs[rows, traj.actions] / traj.logged_propensities)[order]
    with np.errstate(over="ignore"):
        weights = np.cumprod(_scatter(rho, episode, step, shape, 1.0), axis=1)
    if not np.all(np.isfinite(weights)):
        raise ValueError(
            "logged_propensities: cumulative importance weights overflow float64; "
            "the target and logging policies are too far apart over these horizons"
        )
    rewards = _scatter(traj.rewards[order], episode, step, shape, 0.0)

    q_logged = v_target = None
    if traj.q_estimates is not None:
        q_rows = traj.q_estimates[rows, traj.actions][order]
        q_logged = _scatter(q_rows, episode, step, shape, 0.0)
        values = np.einsum("ij,ij->i", traj.target_probs, traj.q_estimates)[order]
        v_target = _scatter(values, episode, step, shape, 0.0)

    discounts = traj.gamma ** np.arange(shape[1], dtype=np.float64)
    logger.debug("built %d episodes, horizon %d", shape[0], shape[1])
    return EpisodeData(
        lengths=lengths,
        gamma=traj.gamma,
        discounts=discounts,
        rewards=rewards,
        weights=weights,
        q_logged=q_logged,
        v_target=v_target,
        episode_ids=traj.mdp_ids[order[starts]],
    )
