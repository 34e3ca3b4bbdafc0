"""``wait(object_list, timeout)``: the stdlib's ``multiprocessing.connection.wait``, for
fiberrl's connections mixed with anything that has a file descriptor.

A fiberrl :class:`~fiberrl.connection.Connection` is ready when a message or end of
file is *pending*, which its descriptor alone cannot say: messages may already have
been read off its streams into the connection, a sender's stream may end without the
pipe ending (another copy of the other end still holds it), and a peer that dies
before ever connecting is only noticed by asking the pipe's rendezvous. So the
connection answers for itself (``_ready_for_wait``), its inbox's descriptor wakes
the wait when something arrives, and the wait wakes every ``_wait_slice()``
seconds to let it ask the rendezvous. Everything else (process sentinels, the
stdlib's connections, sockets, objects with ``fileno()``) is polled as the stdlib
does.

This module imports nothing else of fiberrl: fiberrl's objects take part through
the three private methods above (duck typing), so :mod:`fiberrl.connection` can
import it without a cycle, and fiberrl never calls ``multiprocessing.connection.wait``
(which code that maps ``multiprocessing`` to fiberrl would turn back into this).
"""
from __future__ import annotations

import logging
import select
import time
from typing import Any, Dict, Iterable, List, Optional

logger = logging.getLogger(__name__)

__all__ = ["wait"]

_EVENTS = select.POLLIN | select.POLLPRI | select.POLLHUP | select.POLLERR


def _fd_of(obj: Any) -> int:
    """The descriptor of ``obj`` (an int, or an object with ``fileno()``)."""
    if isinstance(obj, int):
        return obj
    fileno = getattr(obj, "fileno", None)
    if fileno is None:
        raise TypeError(f"cannot wait on {type(obj).__name__} object {obj!r:.80}: "
                        "it is neither a file descriptor nor has fileno()")
    fd = fileno()
    if not isinstance(fd, int) or fd < 0:
        raise ValueError(f"invalid file descriptor {fd!r} from {obj!r:.80}")
    return fd


def _answers_itself(obj: Any) -> bool:
    return hasattr(obj, "_ready_for_wait") and not isinstance(obj, int)


def wait(object_list: Iterable[Any], timeout: Optional[float] = None) -> List[Any]:
    """Wait until at least one object of ``object_list`` is ready; return the ready ones.

    ``timeout`` in seconds (None: no limit); on timeout the list is empty. Objects:
    fiberrl connections (ready when a message or end of file is pending), process
    sentinels (ints), the stdlib's connections, sockets, and anything with
    ``fileno()``. The result keeps the order of ``object_list``.
    """
    objects = list(object_list)
    deadline = None if timeout is None else time.monotonic() + max(0.0, timeout)
    own = [obj for obj in objects if _answers_itself(obj)]
    while True:
        ready_own = {id(obj) for obj in own if obj._ready_for_wait()}
        poller = select.poll()
        owners: Dict[int, List[Any]] = {}
        for obj in objects:
            fd = obj._wait_fd() if _answers_itself(obj) else _fd_of(obj)
            if fd not in owners:
                poller.register(fd, _EVENTS)
            owners.setdefault(fd, []).append(obj)
        if ready_own:
            wait_s: Optional[float] = 0.0
        else:
            wait_s = None if deadline is None else max(0.0, deadline - time.monotonic())
            slices = [obj._wait_slice() for obj in own]
            if slices:
                wait_s = min(slices) if wait_s is None else min(wait_s, *slices)
        fired = _poll(poller, wait_s)
        ready_ids = set(ready_own)
        for fd in fired:
            for obj in owners.get(fd, ()):
                if not _answers_itself(obj):
                    ready_ids.add(id(obj))
        if own and not ready_own:   # something arrived, or time to ask the rendezvous
            ready_ids.update(id(obj) for obj in own if obj._ready_for_wait())
        if ready_ids:
            return [obj for obj in objects if id(obj) in ready_ids]
        if deadline is not None and time.monotonic() >= deadline:
            return []


def _poll(poller: "select.poll", wait_s: Optional[float]) -> List[int]:
    """Descriptors with an event within ``wait_s`` seconds (None: no limit)."""
    ms = None if wait_s is None else int(wait_s * 1000 + 0.999)
    return [fd for fd, _events in poller.poll(ms)]
