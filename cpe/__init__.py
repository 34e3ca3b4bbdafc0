"""Counterfactual policy evaluation: score a target policy from logged data.

Bandit logs (:class:`BanditLog`) get inverse propensity scoring, self-normalised
IPS, the direct method and doubly robust (Dudik, Langford & Li 2011); logged
episodes (:class:`Trajectories`) get per-decision and weighted importance
sampling, the direct method, sequential doubly robust (Jiang & Li 2016), weighted
doubly robust and MAGIC (Thomas & Brunskill 2016).  :func:`evaluate` runs them
with bootstrap standard errors and intervals and returns a :class:`Report`.

Example::

    import cpe
    log = cpe.BanditLog(actions, rewards, logged_propensities, target_probs, reward_estimates)
    report = cpe.evaluate(log, seed=0)
    print(report.table())
    report["dr"].value, report["dr"].ci_low, report["dr"].ci_high
"""

from cpe.bandit import BANDIT_ESTIMATORS
from cpe.data import BanditLog, DataError, Trajectories
from cpe.estimate import Estimate, Report
from cpe.evaluate import DEFAULT_N_BOOTSTRAP, evaluate
from cpe.loading import load
from cpe.sequential import SEQUENTIAL_ESTIMATORS
from cpe.simplex_qp import minimize_on_simplex

__all__ = [
    "BANDIT_ESTIMATORS",
    "BanditLog",
    "DataError",
    "DEFAULT_N_BOOTSTRAP",
    "Estimate",
    "Report",
    "SEQUENTIAL_ESTIMATORS",
    "Trajectories",
    "evaluate",
    "load",
    "minimize_on_simplex",
]
