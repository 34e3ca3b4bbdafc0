"""What a pipe's layout, its way of waiting and its library cost a vector-env step.

    python bench/bench_wake_paths.py [--blocks B] [--steps S] [--envs K] [--load N]

Issue 29's ``AsyncVectorEnv`` gap, taken apart. A parent steps K env processes in
lockstep, as gymnasium's ``AsyncVectorEnv`` does: it sends each a pickled step
command, then reads each one's pickled reply; an env works ~15 us per step (CartPole's
own step and its shared-memory write). Rows:

- ``one socket, read``: raw sockets and ``pickle``, one socket pair per env for both
  directions, each side asleep in ``recv`` (what the stdlib's ``Pipe()`` does);
- ``one socket, epoll``: the same, each side asleep in ``epoll_wait`` first;
- ``two sockets, read``: one connection per direction, as a fiberrl pipe has (each
  end's outbox is a stream of its own to the other end's inbox);
- ``two sockets, epoll``: that, asleep in ``epoll_wait`` (fiberrl's inbox);
- ``stdlib fork`` and ``fiberrl``: the same loop over the library's ``Pipe`` and
  ``Process``.

Every row's env processes are started first and live through the whole run; then the
rows take turns, S lockstep steps each, for B blocks (the order rotated every block).
A shared VM's speed drifts by 1.5x from minute to minute, so each row's figure is the
median over blocks of its steps/s divided by ``stdlib fork``'s in the same block:
paired, the drift cancels. CPU per env step (every process of the row) beside it.
Run it idle and with ``--load $(nproc)``. A measurement, not a test.
"""
import argparse
import multiprocessing
import os
import pickle
import select
import socket
import statistics
import sys
import time

from machine_load import add_load_option, cpu_load, describe, process_cpu

ENV_WORK_S = 15e-6
COMMAND = ("step", 1)
REPLY = ((None, 1.0, False, False, {}), True)
STDLIB = "stdlib fork"


def _work() -> None:
    started = time.perf_counter()
    while time.perf_counter() - started < ENV_WORK_S:
        pass


class _RawEnd:
    """One side of a raw link: sends on one socket, receives on the same or another,
    asleep either in the receive itself or in ``epoll_wait``."""

    def __init__(self, tx: socket.socket, rx: socket.socket, epoll: bool) -> None:
        self.tx, self.rx = tx, rx
        self.epoll = None
        if epoll:
            self.epoll = select.epoll()
            self.epoll.register(rx.fileno(), select.EPOLLIN)

    def send(self, obj) -> None:
        self.tx.sendall(pickle.dumps(obj))

    def recv(self):
        if self.epoll is not None:
            while True:
                try:
                    return pickle.loads(self.rx.recv(4096, socket.MSG_DONTWAIT))
                except BlockingIOError:
                    self.epoll.poll(1.0)
        return pickle.loads(self.rx.recv(4096))


def _env_loop(end) -> None:
    """An env process: answer step commands until told to stop (None)."""
    while True:
        command = end.recv()
        if command is None:
            return
        _work()
        end.send(REPLY)


class _Row:
    """K env processes and the parent's ends to them."""

    def __init__(self, ends, pids=(), procs=()) -> None:
        self.ends, self.pids, self.procs = ends, list(pids), list(procs)
        self.rates, self.cpu_per_step = [], []

    def step(self, steps: int) -> float:
        """Run ``steps`` lockstep steps; steps/s over all envs (and the CPU it took)."""
        cpu = self._cpu()
        started = time.perf_counter()
        for _ in range(steps):
            for end in self.ends:
                end.send(COMMAND)
            for end in self.ends:
                end.recv()
        wall = time.perf_counter() - started
        env_steps = steps * len(self.ends)
        self.cpu_per_step.append((self._cpu() - cpu) / env_steps * 1e6)
        rate = env_steps / wall
        self.rates.append(rate)
        return rate

    def _cpu(self) -> float:
        """CPU seconds of this process (every thread) and of the row's env processes
        (every thread, to the nanosecond: ``/proc/PID/task/TID/schedstat``)."""
        total = time.process_time()
        for pid in self.pids + [proc.pid for proc in self.procs]:
            total += process_cpu(pid)
        return total

    def close(self) -> None:
        for end in self.ends:
            end.send(None)
        for pid in self.pids:
            os.waitpid(pid, 0)
        for proc in self.procs:
            proc.join()


def _raw_row(envs: int, one_socket: bool, epoll: bool) -> _Row:
    ends, pids = [], []
    for _ in range(envs):
        if one_socket:
            parent, child = socket.socketpair()
            parent_end, child_links = (parent, parent), (child, child)
        else:
            down_p, down_c = socket.socketpair()
            up_p, up_c = socket.socketpair()
            parent_end, child_links = (down_p, up_p), (up_c, down_c)
        pid = os.fork()
        if pid == 0:
            _env_loop(_RawEnd(*child_links, epoll))
            os._exit(0)
        ends.append(_RawEnd(*parent_end, epoll))
        pids.append(pid)
    return _Row(ends, pids=pids)


def _library_row(lib, envs: int) -> _Row:
    ends, procs = [], []
    for _ in range(envs):
        parent, child = lib.Pipe()
        proc = lib.Process(target=_env_loop, args=(child,))
        proc.start()
        ends.append(parent)
        procs.append(proc)
    return _Row(ends, procs=procs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blocks", type=int, default=20)
    parser.add_argument("--steps", type=int, default=500, help="lockstep steps per block")
    parser.add_argument("--envs", type=int, default=2)
    parser.add_argument("--libraries-only", action="store_true",
                        help="only the stdlib and fiberrl rows (no raw sockets)")
    add_load_option(parser)
    args = parser.parse_args()
    import fiberrl
    with cpu_load(args.load):
        print(describe(args.load))
        rows = {} if args.libraries_only else {
            "one socket, read": _raw_row(args.envs, True, False),
            "one socket, epoll": _raw_row(args.envs, True, True),
            "two sockets, read": _raw_row(args.envs, False, False),
            "two sockets, epoll": _raw_row(args.envs, False, True),
        }
        rows[STDLIB] = _library_row(multiprocessing.get_context("fork"), args.envs)
        rows["fiberrl"] = _library_row(fiberrl, args.envs)
        names = list(rows)
        for row in rows.values():   # connections made, caches warm
            row.step(50)
            row.rates.clear()
            row.cpu_per_step.clear()
        ratios = {name: [] for name in names}
        for block in range(args.blocks):
            order = names[block % len(names):] + names[:block % len(names)]
            rates = {name: rows[name].step(args.steps) for name in order}
            for name in names:
                ratios[name].append(rates[name] / rates[STDLIB])
        for row in rows.values():
            row.close()
    print(f"{args.envs} envs; {args.blocks} blocks of {args.steps} lockstep steps per row, "
          f"rows taking turns; medians over blocks")
    print(f"{'':20} {'steps/s':>8} {'CPU us/env step':>16} {'/ ' + STDLIB + ', same block':>26}")
    for name in names:
        print(f"{name:20} {statistics.median(rows[name].rates):8.0f} "
              f"{statistics.median(rows[name].cpu_per_step):16.1f} "
              f"{statistics.median(ratios[name]):25.2f}x")


if __name__ == "__main__":
    sys.exit(main())
