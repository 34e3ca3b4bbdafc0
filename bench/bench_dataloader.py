"""torch DataLoader throughput: workers as fiberrl jobs vs the stdlib's spawn context.

    python bench/bench_dataloader.py [--workers 2] [--batches 200] [--batch-size 32]
                                     [--item-kib 48] [--item-ms 0.2] [--rounds 3] [-v]

One ``DataLoader(dataset, num_workers=N, multiprocessing_context=ctx)`` per context,
same dataset (each item a float32 tensor of ``--item-kib`` KiB, built in
``--item-ms`` ms of CPU), ``persistent_workers=True``. Measured: batches/s over a
whole epoch after a warm-up epoch (so worker start-up is excluded), and the
start-up itself (first batch of a fresh loader). The ratio is fiberrl / spawn.
Median of ``--rounds``. A measurement, not a test: the machine may be shared.
"""
import argparse
import logging
import multiprocessing
import os
import platform
import statistics
import sys
import time

for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import torch  # noqa: E402
from torch.utils.data import DataLoader, Dataset  # noqa: E402

import fiberrl  # noqa: E402

log = logging.getLogger("bench_dataloader")

CONTEXTS = {
    "spawn": lambda: multiprocessing.get_context("spawn"),
    "fiberrl": lambda: fiberrl.get_context(),
}
COLUMNS = "{:<22} {:>10} {:>10} {:>8} {:>14}"


class Synthetic(Dataset):
    """``length`` items; each a float32 tensor of ``item_kib`` KiB after ``item_ms`` of work."""

    def __init__(self, length: int, item_kib: int, item_ms: float) -> None:
        self.length, self.numel, self.item_s = length, item_kib * 256, item_ms / 1000.0

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int):
        deadline = time.perf_counter() + self.item_s
        while time.perf_counter() < deadline:
            pass
        return torch.full((self.numel,), float(index)), index


def _epoch(loader: DataLoader) -> int:
    count = 0
    for _batch in loader:
        count += 1
    return count


def measure(ctx_name: str, args: argparse.Namespace) -> dict:
    """Start-up seconds and steady batches/s of one context (medians of the rounds)."""
    dataset = Synthetic(args.batches * args.batch_size, args.item_kib, args.item_ms)
    startups, rates = [], []
    for round_ in range(args.rounds):
        torch.manual_seed(round_)
        loader = DataLoader(dataset, batch_size=args.batch_size, num_workers=args.workers,
                            persistent_workers=True, shuffle=True,
                            multiprocessing_context=CONTEXTS[ctx_name]())
        started = time.perf_counter()
        iterator = iter(loader)
        next(iterator)
        startups.append(time.perf_counter() - started)
        for _batch in iterator:  # the rest of the warm-up epoch
            pass
        started = time.perf_counter()
        count = _epoch(loader)
        rates.append(count / (time.perf_counter() - started))
        loader._iterator._shutdown_workers()
        log.info("%s round %d: start-up %.2f s, %.1f batches/s", ctx_name, round_,
                 startups[-1], rates[-1])
    return {"startup_s": statistics.median(startups), "batches_per_s": statistics.median(rates)}


def main() -> None:
    """Parse the command line, measure each context, print the side-by-side table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--batches", type=int, default=200, help="batches per epoch")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--item-kib", type=int, default=48, help="KiB per item")
    parser.add_argument("--item-ms", type=float, default=0.2, help="CPU ms per item")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("-v", "--verbose", action="store_true")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    sys.stdout.reconfigure(line_buffering=True)
    print(f"bench_dataloader: python {platform.python_version()}, torch {torch.__version__}, "
          f"{os.cpu_count()} cpus; {args.workers} workers, {args.batches} batches of "
          f"{args.batch_size} x {args.item_kib} KiB, {args.item_ms} ms/item, "
          f"median of {args.rounds}")
    results = {name: measure(name, args) for name in CONTEXTS}
    print(COLUMNS.format("measure", "spawn", "fiberrl", "unit", "fiberrl/spawn"))
    for key, unit in (("batches_per_s", "1/s"), ("startup_s", "s")):
        spawn, ours = results["spawn"][key], results["fiberrl"][key]
        print(COLUMNS.format(key, f"{spawn:.2f}", f"{ours:.2f}", unit, f"{ours / spawn:.2f}"))


if __name__ == "__main__":
    main()
