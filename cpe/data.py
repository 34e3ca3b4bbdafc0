"""Validated containers for logged decision data.

Two shapes of data are supported:

* :class:`BanditLog` -- one independent decision per row (contextual bandit).
* :class:`Trajectories` -- one row per step of an episode (MDP), in any order.

Both validate their inputs eagerly and raise :class:`ValueError` naming the
offending field, so that an estimator never silently produces NaN from bad data:
zero or NaN logged propensities, probabilities outside ``[0, 1]``, target
distributions that do not sum to one, mismatched lengths and out-of-range
actions are all rejected.  The arrays are stored as read-only private copies.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:  # pragma: no cover - typing only
    from cpe.episodes import EpisodeData

logger = logging.getLogger(__name__)

#: Allowed deviation of a target-probability row sum from one.
ROW_SUM_TOLERANCE = 1e-4


class DataError(ValueError):
    """Bad logged data. ``field`` is the argument it concerns (``logged_propensities``),
    ``index`` the 0-based position of the first bad row (None when no row is to blame);
    file readers use both to name the file's own field and line."""

    def __init__(self, message: str, index: int | None = None) -> None:
        super().__init__(message)
        self.field = message.split(":", 1)[0]
        self.index = index


def _first_index(mask: np.ndarray) -> int:
    """The 0-based index of the first row of ``mask`` with a set entry."""
    return int(np.flatnonzero(mask.reshape(len(mask), -1).any(axis=1))[0])


def _first_bad(mask: np.ndarray) -> str:
    """Describe how many rows of ``mask`` have a set entry and where the first one is
    (a 0-based index, as in the arrays passed in)."""
    rows = int(mask.reshape(len(mask), -1).any(axis=1).sum())
    return f"{rows} row(s), first at index {_first_index(mask)}"


def _readonly(array: np.ndarray) -> np.ndarray:
    """Return a read-only private copy of ``array``.

    Copying means later changes to the caller's array cannot bypass validation.
    """
    copy = np.array(array, copy=True)
    copy.setflags(write=False)
    return copy


def _as_float(name: str, values: Any, ndim: int) -> np.ndarray:
    """Convert ``values`` to a float64 array with ``ndim`` dimensions and finite entries."""
    try:
        array = np.asarray(values, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise DataError(f"{name}: cannot be converted to numbers ({exc})") from None
    if array.ndim != ndim:
        shape = "(N,)" if ndim == 1 else "(N, K)"
        raise DataError(f"{name}: expected an array of shape {shape}, got shape {array.shape}")
    bad = ~np.isfinite(array)
    if bad.any():
        raise DataError(f"{name}: contains NaN or infinite values in {_first_bad(bad)}",
                        _first_index(bad))
    return array


def _check_length(name: str, array: np.ndarray, n: int, reference: str) -> None:
    """Raise if ``array`` does not have ``n`` rows."""
    if array.shape[0] != n:
        raise DataError(f"{name}: has {array.shape[0]} rows but {reference} has {n}")


def _as_actions(values: Any, n_actions: int) -> np.ndarray:
    """Convert logged actions to int64 indices in ``[0, n_actions)``."""
    array = np.asarray(values)
    if array.ndim != 1:
        raise DataError(f"actions: expected an array of shape (N,), got shape {array.shape}")
    if array.dtype.kind in "iu":
        actions = array.astype(np.int64, copy=False)
    elif array.dtype.kind in "fb":
        floats = array.astype(np.float64)
        if not np.all(np.isfinite(floats)) or np.any(floats != np.round(floats)):
            raise DataError("actions: must be integer action indices")
        actions = floats.astype(np.int64)
    else:
        raise DataError(f"actions: must be integer action indices, got dtype {array.dtype}")
    out_of_range = (actions < 0) | (actions >= n_actions)
    if out_of_range.any():
        raise DataError(
            f"actions: values must lie in [0, {n_actions}) (the columns of target_probs); "
            f"{_first_bad(out_of_range)} out of range", _first_index(out_of_range)
        )
    return actions


def _check_probabilities(name: str, array: np.ndarray) -> None:
    """Raise if any entry of ``array`` lies outside ``[0, 1]``."""
    outside = (array < 0.0) | (array > 1.0)
    if outside.any():
        raise DataError(f"{name}: probabilities must lie in [0, 1]; {_first_bad(outside)} outside",
                        _first_index(outside))


def _as_propensities(values: Any, n: int) -> np.ndarray:
    """Validate the logging policy's probabilities of the logged actions."""
    name = "logged_propensities"
    try:
        array = np.asarray(values, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise DataError(f"{name}: cannot be converted to numbers ({exc})") from None
    if array.ndim != 1:
        raise DataError(f"{name}: expected an array of shape (N,), got shape {array.shape}")
    _check_length(name, array, n, "actions")
    missing = np.isnan(array)
    if missing.any():
        raise DataError(f"{name}: missing (NaN) values in {_first_bad(missing)}",
                        _first_index(missing))
    zero = array == 0.0
    if zero.any():
        raise DataError(
            f"{name}: zero propensity in {_first_bad(zero)}; importance weights would be "
            "infinite (the logging policy must give positive probability to logged actions)",
            _first_index(zero),
        )
    _check_probabilities(name, array)
    return array


def _as_target_probs(values: Any, n: int) -> np.ndarray:
    """Validate the evaluated policy's action distribution for every row."""
    name = "target_probs"
    array = _as_float(name, values, ndim=2)
    _check_length(name, array, n, "actions")
    if array.shape[1] < 1:
        raise DataError(f"{name}: needs at least one action column")
    _check_probabilities(name, array)
    off = np.abs(array.sum(axis=1) - 1.0) > ROW_SUM_TOLERANCE
    if off.any():
        raise DataError(
            f"{name}: rows must sum to 1 (tolerance {ROW_SUM_TOLERANCE:g}); {_first_bad(off)} do not",
            _first_index(off),
        )
    return array


def _as_model(name: str, values: Any, n: int, n_actions: int) -> np.ndarray:
    """Validate a model's per-action predictions (reward_estimates or q_estimates)."""
    array = _as_float(name, values, ndim=2)
    _check_length(name, array, n, "actions")
    if array.shape[1] != n_actions:
        raise DataError(
            f"{name}: has {array.shape[1]} action columns but target_probs has {n_actions}"
        )
    return array


def _common(
    actions: Any,
    rewards: Any,
    logged_propensities: Any,
    target_probs: Any,
    model: Any,
    model_name: str,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray | None]:
    """Validate the fields shared by bandit logs and trajectories."""
    n = int(np.shape(actions)[0]) if np.ndim(actions) >= 1 else -1
    if n < 0:
        raise DataError("actions: expected an array of shape (N,), got a scalar")
    if n == 0:
        raise DataError("actions: the log is empty")
    probs = _as_target_probs(target_probs, n)
    acts = _as_actions(actions, probs.shape[1])
    rew = _as_float("rewards", rewards, ndim=1)
    _check_length("rewards", rew, n, "actions")
    props = _as_propensities(logged_propensities, n)
    est = None if model is None else _as_model(model_name, model, n, probs.shape[1])
    return acts, rew, props, probs, est


class _LoggedRows:
    """What bandit logs and trajectories share: one row per logged decision."""

    actions: np.ndarray
    target_probs: np.ndarray

    @property
    def n(self) -> int:
        """Number of logged rows (decisions)."""
        return int(self.actions.shape[0])

    @property
    def n_actions(self) -> int:
        """Number of actions K."""
        return int(self.target_probs.shape[1])


class BanditLog(_LoggedRows):
    """Logged contextual-bandit decisions, one independent decision per row.

    Args:
        actions: ``(N,)`` logged action indices.
        rewards: ``(N,)`` observed rewards.
        logged_propensities: ``(N,)`` the logging policy's probability of the logged action.
        target_probs: ``(N, K)`` the evaluated policy's probabilities over the K actions.
        reward_estimates: optional ``(N, K)`` reward-model predictions for every action
            (needed by the ``dm`` and ``dr`` estimators).
    """

    def __init__(
        self,
        actions: Any,
        rewards: Any,
        logged_propensities: Any,
        target_probs: Any,
        reward_estimates: Any = None,
    ) -> None:
        acts, rew, props, probs, est = _common(
            actions, rewards, logged_propensities, target_probs, reward_estimates, "reward_estimates"
        )
        self.actions = _readonly(acts)
        self.rewards = _readonly(rew)
        self.logged_propensities = _readonly(props)
        self.target_probs = _readonly(probs)
        self.reward_estimates = None if est is None else _readonly(est)

    @property
    def has_model(self) -> bool:
        """Whether reward estimates were supplied."""
        return self.reward_estimates is not None

    def importance_weights(self) -> np.ndarray:
        """Per-row ratio pi(a|x) / mu(a|x) for the logged action."""
        rows = np.arange(self.n)
        return self.target_probs[rows, self.actions] / self.logged_propensities

    def __repr__(self) -> str:
        return f"BanditLog(n={self.n}, n_actions={self.n_actions}, has_model={self.has_model})"


def _as_sequence_numbers(values: Any, n: int) -> np.ndarray:
    """Validate ordering keys; integer input stays int64 (exact for large timestamps)."""
    array = np.asarray(values)
    if array.dtype.kind in "iu":
        if array.ndim != 1:
            raise DataError(
                f"sequence_numbers: expected an array of shape (N,), got shape {array.shape}"
            )
        array = array.astype(np.int64, copy=False)
    else:
        array = _as_float("sequence_numbers", array, ndim=1)
    _check_length("sequence_numbers", array, n, "actions")
    return array


def _as_mdp_ids(values: Any, n: int) -> np.ndarray:
    """Validate episode identifiers (numbers or strings)."""
    array = np.asarray(values)
    if array.ndim != 1:
        raise DataError(f"mdp_ids: expected an array of shape (N,), got shape {array.shape}")
    _check_length("mdp_ids", array, n, "actions")
    if array.dtype.kind == "f" and np.isnan(array).any():
        raise DataError(f"mdp_ids: missing (NaN) values in {_first_bad(np.isnan(array))}",
                        _first_index(np.isnan(array)))
    if array.dtype.kind == "O":
        if any(v is None for v in array.tolist()):
            raise DataError("mdp_ids: contains missing (None) values")
        array = array.astype(str)
    return array


class Trajectories(_LoggedRows):
    """Logged episodes, one row per step, rows in any order.

    Rows are grouped by ``mdp_ids`` and ordered within an episode by
    ``sequence_numbers`` (which only need to be increasing, not contiguous); the
    position of a row in its episode is its time step ``t`` for discounting.

    Args:
        mdp_ids: ``(N,)`` episode identifier of each row (numbers or strings).
        sequence_numbers: ``(N,)`` ordering key of the row within its episode.
        actions: ``(N,)`` logged action indices.
        rewards: ``(N,)`` observed rewards.
        logged_propensities: ``(N,)`` logging policy probability of the logged action.
        target_probs: ``(N, K)`` evaluated policy's probabilities over the K actions.
        q_estimates: optional ``(N, K)`` model estimates of Q(s_t, a) under the evaluated
            policy for every action (needed by ``dm``, ``dr``, ``wdr`` and ``magic``).
        gamma: discount factor in ``[0, 1]``.

    Episodes are assumed to end in a terminal state: the value after the last
    logged step is zero.
    """

    def __init__(
        self,
        mdp_ids: Any,
        sequence_numbers: Any,
        actions: Any,
        rewards: Any,
        logged_propensities: Any,
        target_probs: Any,
        q_estimates: Any = None,
        gamma: float = 1.0,
    ) -> None:
        acts, rew, props, probs, est = _common(
            actions, rewards, logged_propensities, target_probs, q_estimates, "q_estimates"
        )
        n = acts.shape[0]
        seq = _as_sequence_numbers(sequence_numbers, n)
        ids = _as_mdp_ids(mdp_ids, n)
        try:
            gamma_value = float(gamma)
        except (TypeError, ValueError):
            raise DataError(f"gamma: must be a number in [0, 1], got {gamma!r}") from None
        if not 0.0 <= gamma_value <= 1.0:
            raise DataError(f"gamma: must lie in [0, 1], got {gamma_value}")
        self.mdp_ids = _readonly(ids)
        self.sequence_numbers = _readonly(seq)
        self.actions = _readonly(acts)
        self.rewards = _readonly(rew)
        self.logged_propensities = _readonly(props)
        self.target_probs = _readonly(probs)
        self.q_estimates = None if est is None else _readonly(est)
        self.gamma = gamma_value
        self._episodes: EpisodeData | None = None

    @property
    def has_model(self) -> bool:
        """Whether Q estimates were supplied."""
        return self.q_estimates is not None

    def episodes(self) -> EpisodeData:
        """Sorted, padded ``(n_episodes, horizon)`` matrices (built once, then cached)."""
        if self._episodes is None:
            from cpe.episodes import build_episodes

            self._episodes = build_episodes(self)
        return self._episodes

    @property
    def n_episodes(self) -> int:
        """Number of distinct episodes."""
        return self.episodes().n_episodes

    def __repr__(self) -> str:
        return (
            f"Trajectories(n_rows={self.n}, n_actions={self.n_actions}, gamma={self.gamma}, "
            f"has_model={self.has_model})"
        )
