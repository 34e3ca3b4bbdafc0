"""Data-parallel training with one fiberrl ``Process`` per rank.

    results = rl.distributed.launch(train_rank, world_size=2, args=(config,))

:func:`launch` starts ``world_size`` fiberrl processes (so on Slurm each rank is a
job or a job step, on Docker a container, on Kubernetes a pod) and joins them into
one ``torch.distributed`` group; ``fn(ctx, *args)`` then runs in every rank with a
:class:`RankContext` (rank, world size, device), and :func:`launch` returns the
ranks' return values in rank order. Nobody sets an address or a port::

    launcher ──Pipe── rank 0: binds a TCPStore on fiberrl.host_address(), port 0
        │                     (the OS picks a free port) and reports host:port
        └──Pipe── rank r: receives host:port from the launcher, joins the store
    every rank: init_process_group(gloo on CPU | nccl on GPU, store=...) → fn(ctx, ...)

The launcher watches every rank while it waits. A rank that raises, or dies
(killed, out of memory, node failure), stops the whole run within about a second:
the other ranks are terminated and :class:`RankFailedError` names the rank, its
host and the reason (its traceback, or the backend's exit reason and exit code).
No rank outlives :func:`launch`.

Devices: ``devices=None`` runs every rank on the CPU with gloo. ``devices="cuda"``
gives each rank one GPU with NCCL: on the local backend rank ``r`` uses ``cuda:r``
of this machine; on cluster backends each rank asks its job for one GPU
(``gpu=1``, e.g. ``--gres=gpu:1`` on Slurm) and uses ``cuda:0``.
"""
from __future__ import annotations

import logging
import socket
import time
import traceback
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Callable, Dict, List, Optional, Sequence

import fiberrl

logger = logging.getLogger(__name__)

RENDEZVOUS_TIMEOUT_S = 300.0
FAILURE_GRACE_S = 1.0  # after a first failure, how long to wait for the others' reasons

# Errors a rank gets when *another* rank failed (its peer closed the connection):
# the consequence, not the cause, so they are reported only when nothing else is known.
_PEER_LOST_MARKERS = ("Connection closed by peer", "Connection reset by peer",
                      "remote worker", "NCCL communicator was aborted", "Broken pipe")


class RankFailedError(RuntimeError):
    """A rank of a distributed run failed; the message names the rank, host and reason."""

    def __init__(self, rank: int, host: str, reason: str) -> None:
        super().__init__(f"rank {rank} on {host or 'an unknown host'} failed: {reason}")
        self.rank, self.host, self.reason = rank, host, reason


@dataclass
class RankContext:
    """What a rank knows about itself."""

    rank: int
    world_size: int
    device: str  # "cpu" or "cuda:N"
    backend: str  # "gloo" or "nccl"

    @property
    def is_main(self) -> bool:
        """True on rank 0, which writes checkpoints and runs evaluation."""
        return self.rank == 0


def _rank_main(conn: Any, rank: int, world_size: int, device: str, fn: Callable[..., Any],
               args: tuple, timeout_s: float) -> None:
    """The body of every rank's process (see the module docstring)."""
    import torch
    import torch.distributed as dist
    backend = "nccl" if device.startswith("cuda") else "gloo"
    conn.send(("hello", socket.gethostname()))
    try:
        if device.startswith("cuda"):
            torch.cuda.set_device(torch.device(device))
        timeout = timedelta(seconds=timeout_s)
        if rank == 0:
            host = fiberrl.host_address()
            store = dist.TCPStore(host, 0, world_size, is_master=True, timeout=timeout,
                                  wait_for_workers=False)
            conn.send(("rendezvous", (host, store.port)))
        else:
            host, port = conn.recv()
            store = dist.TCPStore(host, port, world_size, is_master=False, timeout=timeout)
        dist.init_process_group(backend, store=store, rank=rank, world_size=world_size,
                                timeout=timeout)
        try:
            result = fn(RankContext(rank, world_size, device, backend), *args)
        finally:
            dist.destroy_process_group()
        conn.send(("result", result))
    except BaseException:
        conn.send(("error", traceback.format_exc()))
        raise SystemExit(1) from None  # the launcher reports it; no second traceback here


def _devices(devices: Any, world_size: int) -> List[str]:
    if devices is None or devices == "cpu":
        return ["cpu"] * world_size
    if devices == "cuda":
        local = _backend_is_local()
        if local:
            check_local_gpus(world_size)
        return [f"cuda:{r}" if local else "cuda:0" for r in range(world_size)]
    devices = list(devices)
    if len(devices) != world_size:
        raise ValueError(f"{len(devices)} devices for {world_size} ranks")
    return [str(d) for d in devices]


def check_local_gpus(world_size: int) -> None:
    """On the local backend rank ``r`` takes ``cuda:r``: refuse at once, before any rank
    starts, when this host has fewer GPUs than ranks (a rank would fail inside CUDA)."""
    import torch
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if count < world_size:
        raise ValueError(
            f"{world_size} rank(s) with devices='cuda' need {world_size} GPU(s) on this host "
            f"(the local backend gives rank r cuda:r), but torch sees {count}; use fewer "
            "ranks, devices='cpu', or a backend that places each rank on its own GPU")


def _backend_is_local() -> bool:
    from fiberrl.config import get_config
    return get_config().backend == "local"


def launch(fn: Callable[..., Any], world_size: int, args: Sequence[Any] = (),
           devices: Any = None, resources: Optional[Dict[str, Any]] = None,
           timeout_s: float = RENDEZVOUS_TIMEOUT_S, poll_s: float = 0.2) -> List[Any]:
    """Run ``fn(ctx, *args)`` in ``world_size`` ranks; their results in rank order.

    ``devices``: None/"cpu" (gloo), "cuda" (one GPU per rank, NCCL) or one device
    string per rank. ``resources``: what each rank's job asks for, as
    ``fiberrl.Process`` keywords (``cpu``, ``mem``, ``time_limit``, ``partition``...;
    a rank with torch needs a few hundred MiB). ``timeout_s`` bounds the rendezvous
    and every collective.
    Raises :class:`RankFailedError` when a rank fails (the others are stopped).
    """
    if world_size < 1:
        raise ValueError(f"world_size must be at least 1, got {world_size}")
    if not callable(fn):
        raise TypeError(f"fn must be callable, got {fn!r}")
    placement = _devices(devices, world_size)
    conns: List[Any] = []
    procs: List[Any] = []
    hosts = [""] * world_size
    results: List[Any] = [None] * world_size
    finished = [False] * world_size
    try:
        for rank, device in enumerate(placement):
            parent_end, child_end = fiberrl.Pipe()
            hints = dict(resources or {})
            if device.startswith("cuda") and not _backend_is_local():
                hints.setdefault("gpu", 1)
            proc = fiberrl.Process(target=_rank_main, name=f"rank-{rank}", daemon=True,
                                   args=(child_end, rank, world_size, device, fn, tuple(args),
                                         timeout_s), **hints)
            proc.start()
            child_end.close()
            conns.append(parent_end)
            procs.append(proc)
        failures: dict = {}
        failed_at: Optional[float] = None
        while not all(finished):
            for rank in range(world_size):
                if not finished[rank] and rank not in failures:
                    failure = _check_rank(rank, conns, procs[rank], hosts, results, finished)
                    if failure is not None:
                        failures[rank] = failure
                        failed_at = failed_at or time.monotonic()
            if failed_at is not None and (time.monotonic() - failed_at >= FAILURE_GRACE_S
                                          or len(failures) + sum(finished) == world_size):
                raise _root_cause(failures, hosts)
            time.sleep(poll_s)
        for proc in procs:
            proc.join(30)
        return results
    finally:
        _stop(procs)
        for conn in conns:
            conn.close()


def broadcast_module(module: Any, source: int = 0) -> None:
    """Give every rank ``source``'s parameters and buffers (an explicit DDP-style start)."""
    import torch.distributed as dist
    for tensor in list(module.parameters()) + list(module.buffers()):
        dist.broadcast(tensor.data, source)


def average_gradients(parameters: Any) -> None:
    """All-reduce the gradients of ``parameters`` and divide by the world size: what
    DistributedDataParallel does in its backward hooks, for models whose losses do
    not go through one ``forward`` (TD3's actor and critics)."""
    import torch.distributed as dist
    world = dist.get_world_size()
    for parameter in parameters:
        if parameter.grad is not None:
            dist.all_reduce(parameter.grad)
            parameter.grad /= world


def _check_rank(rank: int, conns: List[Any], proc: Any, hosts: List[str], results: List[Any],
                finished: List[bool]) -> Optional[str]:
    """Handle the rank's messages; a failure reason if it failed, else None."""
    conn = conns[rank]
    while conn.poll(0):
        try:
            kind, payload = conn.recv()
        except EOFError:
            break
        if kind == "hello":
            hosts[rank] = payload
        elif kind == "rendezvous":
            for other in conns[1:]:
                other.send(payload)
        elif kind == "result":
            results[rank], finished[rank] = payload, True
            return None
        elif kind == "error":
            return payload.strip().splitlines()[-1] + "\n" + payload
    if not proc.is_alive():
        proc.join(1)
        reason = proc.exit_reason or f"exit code {proc.exitcode}"
        return f"the process ended ({reason})"
    return None


def _root_cause(failures: dict, hosts: List[str]) -> RankFailedError:
    """The failure that caused the others: a rank that did not just lose a peer."""
    def lost_a_peer(reason: str) -> bool:
        return any(marker in reason for marker in _PEER_LOST_MARKERS)
    rank = min(failures, key=lambda r: (lost_a_peer(failures[r]), r))
    error = RankFailedError(rank, hosts[rank], failures[rank])
    others = sorted(set(failures) - {rank})
    if others:
        error.args = (error.args[0] + f"\n(ranks {others} failed after it)",)
    return error


def _stop(procs: List[Any]) -> None:
    """Terminate the ranks still running and wait for them."""
    for proc in procs:
        if proc.is_alive():
            proc.terminate()
    deadline = time.monotonic() + 15
    for proc in procs:
        proc.join(max(0.1, deadline - time.monotonic()))
        if proc.is_alive():
            proc.kill()
            proc.join(5)
