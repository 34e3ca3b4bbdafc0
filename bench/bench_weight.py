"""What fiberrl's runtime costs a process: listening sockets, threads, descriptors, USS.

    python bench/bench_weight.py

Two subjects, measured with psutil from the outside:

* the *master*: a process holding a ``Pool(2)``, a ``Queue``, a ``Pipe``, a ``Lock``
  and a ``Manager``, each used once (so every listener it needs is open);
* an *idle child*: a started ``Process`` that sleeps and has created nothing.

The stdlib (spawn context) holding the same objects is printed beside it. These are
counts, not timings, so the machine's noise does not move them (USS moves a little).
"""
from __future__ import annotations

import argparse
import multiprocessing
import os
import time
from typing import Any, Dict

import psutil

import fiberrl


def sleep_forever(seconds: float) -> None:
    """An idle child: sleeps and creates nothing."""
    time.sleep(seconds)


def _socket_inodes(pid: int) -> set:
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[len("socket:["):-1])
    return inodes


def listening(pid: int) -> int:
    """Listening sockets of ``pid``: TCP in state LISTEN, Unix with SO_ACCEPTCONN."""
    inodes, found = _socket_inodes(pid), 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as rows:
            for row in rows.readlines()[1:]:
                fields = row.split()
                found += fields[3] == "0A" and fields[9] in inodes
    with open("/proc/net/unix") as rows:
        for row in rows.readlines()[1:]:
            fields = row.split()  # Num RefCount Protocol Flags Type St Inode [Path]
            found += int(fields[3], 16) & 0x10000 != 0 and fields[6] in inodes
    return found


def weigh(pid: int) -> Dict[str, Any]:
    """The figures of one process."""
    proc = psutil.Process(pid)
    return {"listening": listening(pid), "threads": proc.num_threads() - 1,
            "fds": proc.num_fds(), "uss_mib": proc.memory_full_info().uss / 2**20}


def hold_everything(lib: Any) -> list:
    """Make and use once each object the master of the issue holds."""
    pool = lib.Pool(2)
    pool.map(abs, range(8))
    queue = lib.Queue()
    queue.put(1)
    queue.get(timeout=30)
    a, b = lib.Pipe()
    a.send(1)
    b.recv()
    lock = lib.Lock()
    with lock:
        pass
    manager = lib.Manager()
    shared = manager.dict()
    shared[1] = 1
    return [pool, queue, a, b, lock, manager, shared]


def measure(name: str, lib: Any) -> Dict[str, Dict[str, Any]]:
    """Weigh this process holding everything, and an idle child of ``lib``."""
    held = hold_everything(lib)
    time.sleep(0.5)  # let background threads settle
    master = weigh(os.getpid())
    child = lib.Process(target=sleep_forever, args=(60,))
    child.start()
    time.sleep(1.5)
    idle = weigh(child.pid)
    child.terminate()
    child.join(10)
    pool, manager = held[0], held[5]
    pool.terminate()
    pool.join()
    manager.shutdown()
    return {"master": master, "idle child": idle}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", choices=["stdlib", "fiberrl"], help="measure one library")
    args = parser.parse_args()
    libs = {"stdlib": multiprocessing.get_context("spawn"), "fiberrl": fiberrl}
    if args.only:
        libs = {args.only: libs[args.only]}
    results = {name: measure(name, lib) for name, lib in libs.items()}
    print(f"{'subject':<12} {'library':<8} {'listening':>9} {'threads':>8} {'fds':>5} {'USS MiB':>8}")
    for subject in ("master", "idle child"):
        for name, figures in results.items():
            f = figures[subject]
            print(f"{subject:<12} {name:<8} {f['listening']:>9} {f['threads']:>8} {f['fds']:>5} "
                  f"{f['uss_mib']:>8.1f}")


if __name__ == "__main__":
    main()
