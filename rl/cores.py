"""This machine's cores, shared between the learner's torch threads and env processes.

torch starts one intra-op thread per core. When the env members step in processes
on the same machine (:class:`rl.envs.ProcessVectorEnv` on the local or Docker
backend), those threads take the cores the env processes step on: with PPO, 4
300 us envs in 2 processes on 2 cores, a learner with torch's default 2 threads
spent 1.5x as long per vector step as one with a single thread (acting 480-566 us
against 309-317, the env step 1,628-1,669 against 1,022-1,059; docs/benchmarks.md,
"Stop 52"). :func:`torch_threads_beside` leaves the env processes their cores.
"""
from __future__ import annotations

import contextlib
import logging
import sys
from typing import Iterator

# the count fiberrl's receivers use to decide whether a core is free to spin on: the
# process's affinity, capped by its cgroup's CPU quota (a container's --cpus)
from fiberrl._wire.spin import usable_cpus as usable_cores

logger = logging.getLogger(__name__)


@contextlib.contextmanager
def torch_threads_beside(env_processes: int) -> Iterator[None]:
    """For the block, cap torch's intra-op threads at the cores that ``env_processes``
    processes stepping envs on this machine leave free (at least one), and restore
    the previous count after it. Nothing changes when torch is not imported, when
    no env process shares this machine, or when the count is already that low."""
    torch = sys.modules.get("torch")
    if torch is None or env_processes < 1:
        yield
        return
    before = torch.get_num_threads()
    cap = max(1, usable_cores() - env_processes)
    if before <= cap:
        yield
        return
    logger.info("torch threads: %d for this run, not %d (%d env processes share the %d cores)",
                cap, before, env_processes, usable_cores())
    torch.set_num_threads(cap)
    try:
        yield
    finally:
        torch.set_num_threads(before)
