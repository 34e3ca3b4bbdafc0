"""How long a waiting receiver polls before it sleeps.

Waking a process that sleeps on another core costs ~40 us on a VM (the core's idle
exit and an inter-processor interrupt): more than a short message's whole round trip
between two awake processes. So a receiver that expects an answer soon first polls
without blocking for up to ``spin_wait_us`` (a configuration setting), yielding its
core between polls so that a peer on the same core runs at once, and sleeps only if
nothing came. The spin is adaptive (:func:`worth_spinning`): after a wait that took
much longer than the spin, the next wait sleeps at once, so a slow or idle peer
costs no polling. The bound is generous (8 spins), because a reply that missed the
spin arrives late by a wake-up: with a tight bound, one slow spell would switch the
spin off for good.
"""
from __future__ import annotations

import functools
import os


def spin_budget() -> float:
    """Seconds a waiting receiver may poll before it sleeps (0 on a single CPU)."""
    from ..config import get_config
    return get_config().spin_wait_us * 1e-6 if several_cpus() else 0.0


#: a wait that took longer than this many spins means the peer is slow: sleep at once
SLOW_PEER_SPINS = 8


def worth_spinning(last_wait: float, spin: float) -> bool:
    """Whether to spin before the next wait, given how long the last one took."""
    return bool(spin) and last_wait <= SLOW_PEER_SPINS * spin


@functools.lru_cache(maxsize=None)
def several_cpus() -> bool:
    """Whether this process may run on more than one CPU (else spinning only delays
    the peer it waits for)."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return (cpus or 1) > 1


__all__ = ["spin_budget", "several_cpus", "worth_spinning", "SLOW_PEER_SPINS"]
