"""Which address this process should listen on so that its jobs can reach it.

A job inherits its parent's configuration, including ``listen_host``; on another
machine (a Slurm node, a container, a pod) that address is not its own. The rule
every backend follows: the configured address if it belongs to this machine; else,
inside a job, this machine's address on the route back to the parent's hub; else
the backend's own choice.
"""
from __future__ import annotations

import os
import socket
from typing import Callable, Optional

#: set in every job: the address of the parent's hub (``tcp://host:port``)
HUB_ENV = "FIBERRL_HUB"


def is_local_address(host: str) -> bool:
    """True if this machine can bind ``host``."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.bind((host, 0))
        return True
    except OSError:
        return False


def address_towards(host: str) -> Optional[str]:
    """This machine's address on the route to ``host`` (None if there is no route)."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect((host, 9))
            return probe.getsockname()[0]
    except OSError:
        return None


def parent_hub_host() -> Optional[str]:
    """The host of the parent's hub when this process is a job, else None."""
    parent = os.environ.get(HUB_ENV, "")
    if not parent.startswith("tcp://"):
        return None
    return parent[len("tcp://"):].rsplit(":", 1)[0]


def listen_host(configured: Optional[str], fallback: Callable[[], str]) -> str:
    """Where to listen: ``configured`` if it is this machine's, else the address on the
    route back to the parent (in a job), else ``fallback()``."""
    if configured and is_local_address(configured):
        return configured
    parent = parent_hub_host()
    if parent:
        address = address_towards(parent)
        if address and is_local_address(address):
            return address
    return fallback()
