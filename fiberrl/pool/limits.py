"""The master's file-descriptor budget for a pool of many workers.

Each worker costs the master :data:`FDS_PER_WORKER` descriptors: its pool stream and
its job's watch stream (a job's output and end come through its fork server's one
socket on the local backend, through the backend elsewhere; its sentinel is made only
if asked for). A soft ``RLIMIT_NOFILE`` of 1,024, the
usual default, would stop a pool near 120 workers with ``EMFILE`` deep inside some
thread; instead :func:`ensure_fd_room` raises the soft limit up to the hard one at
``Pool()`` (and ``resize()``), or fails there with how many descriptors are needed.
"""
from __future__ import annotations

import logging
import os

logger = logging.getLogger(__name__)

#: descriptors the master holds per worker (measured: 2.0 at 256 local workers; 8 before
#: issue 32)
FDS_PER_WORKER = 2
#: descriptors kept free for everything else the program opens
MARGIN = 64


def open_fds() -> int:
    """Descriptors this process holds now (0 where it cannot tell)."""
    for path in ("/proc/self/fd", "/dev/fd"):
        try:
            return len(os.listdir(path))
        except OSError:
            continue
    return 0


def ensure_fd_room(workers: int) -> None:
    """Make room for ``workers`` more workers' descriptors, or raise ``OSError`` saying
    how many are needed and what the limits are."""
    try:
        import resource
    except ImportError:  # not a POSIX system: nothing to check
        return
    need = open_fds() + workers * FDS_PER_WORKER + MARGIN
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or need <= soft:
        return
    if hard != resource.RLIM_INFINITY and need > hard:
        raise OSError(
            f"a pool of {workers} more workers needs about {need} file descriptors in this "
            f"process ({FDS_PER_WORKER} per worker plus {need - workers * FDS_PER_WORKER} "
            f"open or spare), but RLIMIT_NOFILE allows {soft} (hard limit {hard}): raise "
            f"the hard limit (ulimit -Hn, or limits.conf) or use fewer workers")
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    logger.info("raised this process's open-file limit from %d to %s for a pool of %d workers",
                soft, "unlimited" if hard == resource.RLIM_INFINITY else hard, workers)
