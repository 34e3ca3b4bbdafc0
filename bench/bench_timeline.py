"""Benchmark: the sharded Timeline (rl.data) against a straightforward single-process
pandas implementation of the same semantics, in the same run.

    python bench/bench_timeline.py                       # 1M rows; 1, 2 and 4 workers
    python bench/bench_timeline.py --rows 1000000 10000000

Synthetic logged rows (episodes of 1-100 steps with gaps of 1-3 in sequence numbers,
8 state features each present with probability 0.9, 4 discrete actions) are written
once per size as 8 Parquet files; each MDP's rows are shuffled over all files. Every
measured run is a fresh subprocess, which reports its wall time, the CPU time of
itself and its pool workers (useful on a shared machine), its own peak RSS
(the coordinating process for rl.data; for pandas, the process holding the dataset)
and the largest RSS of any pool worker (sampled every 0.1 s). Peak RSS is ``VmHWM``:
``ru_maxrss`` would report the size of the benchmark's parent process, which a child
inherits through fork and exec. Before timing, both implementations run on a small
input and their outputs are compared column by column.

The pandas baseline holds the dataset as Python objects (about 3 GiB per million
rows), so by default it only runs up to 2M rows.

Needs pandas (``pip install pandas``), pyarrow and psutil.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import resource
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np

logger = logging.getLogger(__name__)

ROOT = Path(__file__).resolve().parent.parent
FILES = 8
FEATURES = 8
ACTIONS = np.array(["a0", "a1", "a2", "a3"])
GAMMA = 0.9
HORIZON = 10


# -- synthetic input -----------------------------------------------------------------------
def _block(rng, first_mdp: int, rows: int):
    """About ``rows`` logged rows of whole episodes, shuffled, as an Arrow table."""
    import pyarrow as pa
    lengths = rng.integers(1, 101, size=rows // 50 + 2)
    lengths = lengths[np.cumsum(lengths) <= rows]
    if lengths.sum() < rows:
        lengths = np.append(lengths, rows - lengths.sum())
    n = int(lengths.sum())
    episode = np.repeat(np.arange(len(lengths)), lengths)
    starts = np.repeat(np.cumsum(lengths) - lengths, lengths)
    gaps = rng.integers(1, 4, size=n)
    seq = np.cumsum(gaps)
    seq = seq - seq[starts] + 1_000 * rng.integers(0, 1000, size=len(lengths))[episode]
    present = rng.random((n, FEATURES)) < 0.9
    offsets = np.concatenate([[0], np.cumsum(present.sum(axis=1))]).astype(np.int32)
    keys = np.broadcast_to(np.arange(FEATURES).astype(str), (n, FEATURES))[present]
    values = rng.normal(size=(n, FEATURES))[present]
    table = pa.table({
        "mdp_id": pa.array(np.char.add("mdp-", (first_mdp + episode).astype(str))),
        "sequence_number": pa.array(seq.astype(np.int64)),
        "state_features": pa.MapArray.from_arrays(offsets, pa.array(keys), pa.array(values)),
        "action": pa.array(ACTIONS[rng.integers(0, 4, size=n)]),
        "action_probability": pa.array(rng.uniform(0.05, 1.0, size=n)),
        "reward": pa.array(rng.normal(size=n)),
    })
    return table.take(rng.permutation(n)), len(lengths)


def make_input(directory: Path, rows: int, seed: int = 0) -> Path:
    """Write (once) ``rows`` synthetic logged rows as FILES Parquet files."""
    import pyarrow.parquet as pq
    done = directory / "_DONE"
    if done.exists():
        return directory
    shutil.rmtree(directory, ignore_errors=True)
    directory.mkdir(parents=True)
    rng = np.random.default_rng(seed)
    writers, schema = [], None
    written, mdps = 0, 0
    while written < rows:
        block, episodes = _block(rng, mdps, min(1_000_000, rows - written))
        if schema is None:
            schema = block.schema
            writers = [pq.ParquetWriter(directory / f"logged-{i}.parquet", schema)
                       for i in range(FILES)]
        cuts = np.linspace(0, block.num_rows, FILES + 1).astype(int)
        for i, writer in enumerate(writers):
            writer.write_table(block.slice(cuts[i], cuts[i + 1] - cuts[i]), row_group_size=1 << 17)
        written += block.num_rows
        mdps += episodes
    for writer in writers:
        writer.close()
    done.write_text(json.dumps({"rows": written, "mdps": mdps}))
    return directory


# -- the pandas baseline ---------------------------------------------------------------------
def pandas_timeline(input_dir: Path, out: Path, gamma: float, horizon: int) -> int:
    """The Timeline in one process with pandas: read everything, sort, shift per MDP."""
    import pandas as pd
    import pyarrow as pa
    import pyarrow.parquet as pq
    frames = []
    for index, path in enumerate(sorted(input_dir.glob("*.parquet"))):
        frame = pd.read_parquet(path)
        frame["_order"] = (index << 40) + np.arange(len(frame))
        frames.append(frame)
    df = pd.concat(frames, ignore_index=True)
    df["mdp_id"] = df["mdp_id"].astype(str)
    df = df.sort_values(["mdp_id", "sequence_number", "_order"], kind="stable")
    df = df.reset_index(drop=True)
    groups = df.groupby("mdp_id", sort=False)
    following = groups[["sequence_number", "state_features", "action",
                        "action_probability"]].shift(-1)
    terminal = following["sequence_number"].isna().to_numpy()
    df["sequence_number_ordinal"] = groups.cumcount() + 1
    time_diff = following["sequence_number"] - df["sequence_number"]
    df["time_diff"] = time_diff.fillna(0).astype("int64")
    df["time_since_first"] = df["sequence_number"] - groups["sequence_number"].transform("first")
    df["next_state_features"] = [[] if t else s for t, s in
                                 zip(terminal, following["state_features"])]
    df["next_action"] = following["action"].fillna("")
    df["next_action_probability"] = following["action_probability"].fillna(0.0)
    ahead = np.stack([groups["reward"].shift(-k).to_numpy() for k in range(horizon + 1)], axis=1)
    df["reward_timeline"] = [[(k, r) for k, r in enumerate(row) if r == r] for row in ahead]
    rewards = df["reward"].to_numpy()
    seq = df["sequence_number"].to_numpy()
    values = np.empty(len(df))
    following_value = 0.0
    for i in range(len(df) - 1, -1, -1):
        if terminal[i]:
            following_value = rewards[i]
        else:
            following_value = rewards[i] + gamma ** float(seq[i + 1] - seq[i]) * following_value
        values[i] = following_value
    df["episode_value"] = values
    df["terminal"] = terminal
    columns = ["mdp_id", "sequence_number", "sequence_number_ordinal", "time_diff",
               "time_since_first", "state_features", "action", "action_probability", "reward",
               "next_state_features", "next_action", "next_action_probability",
               "reward_timeline", "episode_value", "terminal"]
    features = pa.map_(pa.string(), pa.float64())
    schema = pa.schema([("mdp_id", pa.string()), ("sequence_number", pa.int64()),
                        ("sequence_number_ordinal", pa.int64()), ("time_diff", pa.int64()),
                        ("time_since_first", pa.int64()), ("state_features", features),
                        ("action", pa.string()), ("action_probability", pa.float64()),
                        ("reward", pa.float64()), ("next_state_features", features),
                        ("next_action", pa.string()), ("next_action_probability", pa.float64()),
                        ("reward_timeline", pa.map_(pa.int64(), pa.float64())),
                        ("episode_value", pa.float64()), ("terminal", pa.bool_())])
    table = pa.Table.from_pandas(df[columns], schema=schema, preserve_index=False)
    out.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, out / "part-00000.parquet")
    return len(df)


def fiberrl_timeline(input_dir: Path, out: Path, workers: int, gamma: float, horizon: int) -> int:
    """The sharded Timeline on a fiberrl pool of ``workers`` processes."""
    import fiberrl
    from rl.data.sharding import run_timeline
    pool = fiberrl.Pool(workers)
    try:
        metadata = run_timeline(input_dir, out, gamma, pool=pool, reward_horizon=horizon)
    finally:
        pool.close()
        pool.join()
    return metadata["rows"]


# -- one measured run (a subprocess) ---------------------------------------------------------
def _watch_children(stop: threading.Event, peak: list) -> None:
    import psutil
    me = psutil.Process()
    while not stop.is_set():
        for child in me.children(recursive=True):
            try:
                peak[0] = max(peak[0], child.memory_info().rss)
            except psutil.Error:
                pass
        stop.wait(0.1)


def peak_rss() -> int:
    """This process's peak RSS in bytes: ``VmHWM`` (reset by exec, unlike ``ru_maxrss``,
    which a process started from a large parent inherits), else ``ru_maxrss``."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def run_one(args: argparse.Namespace) -> None:
    """Child process: one timed run; prints its figures as JSON."""
    stop, peak = threading.Event(), [0]
    watcher = threading.Thread(target=_watch_children, args=(stop, peak), daemon=True)
    watcher.start()
    start = time.perf_counter()
    if args.run_one == "pandas":
        rows = pandas_timeline(Path(args.input), Path(args.out), GAMMA, HORIZON)
    else:
        rows = fiberrl_timeline(Path(args.input), Path(args.out), args.workers[0], GAMMA, HORIZON)
    seconds = time.perf_counter() - start
    stop.set()
    watcher.join()
    cpu = 0.0  # this process and its reaped pool workers
    for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN):
        usage = resource.getrusage(who)
        cpu += usage.ru_utime + usage.ru_stime
    print(json.dumps({"rows": rows, "seconds": seconds, "cpu_seconds": cpu,
                      "coordinator_rss": peak_rss(),
                      "worker_rss": peak[0]}))


def measure(kind: str, input_dir: Path, out: Path, workers: int = 0) -> dict:
    """Run one configuration in a fresh subprocess and return its figures."""
    shutil.rmtree(out, ignore_errors=True)
    command = [sys.executable, __file__, "--run-one", kind, "--input", str(input_dir),
               "--out", str(out), "--workers", str(workers)]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{kind} run failed:\n{done.stderr[-3000:]}")
    result = json.loads(done.stdout.strip().splitlines()[-1])
    result["load"] = os.getloadavg()[0]  # other work on the machine skews the timings
    shutil.rmtree(out, ignore_errors=True)
    return result


def check_same_output(work: Path) -> None:
    """Both implementations on 20k rows: identical transitions."""
    import pyarrow.parquet as pq
    from rl.data.sharding import run_timeline
    from rl.data.transitions import read_table
    small = make_input(work / "input-check", 20_000, seed=1)
    for name in ("check-pandas", "check-rl"):
        shutil.rmtree(work / name, ignore_errors=True)
    pandas_timeline(small, work / "check-pandas", GAMMA, HORIZON)
    run_timeline(small, work / "check-rl", GAMMA, reward_horizon=HORIZON, shards=3)
    keys = [("mdp_id", "ascending"), ("sequence_number_ordinal", "ascending")]
    ours = read_table(work / "check-rl").sort_by(keys)
    theirs = pq.read_table(work / "check-pandas").sort_by(keys).select(ours.column_names)
    for name in ours.column_names:
        a, b = ours.column(name).combine_chunks(), theirs.column(name).combine_chunks()
        if name == "episode_value":
            ok = np.allclose(np.asarray(a), np.asarray(b), rtol=1e-9, atol=1e-12)
        else:
            ok = a.equals(b.cast(a.type)) if a.type != b.type else a.equals(b)
        if not ok:
            raise AssertionError(f"outputs differ in column {name!r}")
    for name in ("check-pandas", "check-rl"):
        shutil.rmtree(work / name, ignore_errors=True)
    print("check: rl.data and pandas outputs are identical on 20,000 rows")


def _mib(value: float) -> str:
    return f"{value / 2 ** 20:,.0f} MiB"


def main() -> None:
    """Check both implementations agree, then time every size and configuration."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[1_000_000])
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--pandas-max-rows", type=int, default=2_000_000,
                        help="skip the pandas baseline above this many rows (memory)")
    parser.add_argument("--dir", default="/tmp/bench_timeline", help="work directory")
    parser.add_argument("--run-one", choices=["pandas", "fiberrl"], help=argparse.SUPPRESS)
    parser.add_argument("--input", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.run_one:
        run_one(args)
        return
    work = Path(args.dir)
    work.mkdir(parents=True, exist_ok=True)
    check_same_output(work)
    print(f"machine: {os.cpu_count()} CPUs; gamma {GAMMA}, reward horizon {HORIZON}; "
          "load: 1-minute load average at the end of each run")
    header = (f"{'rows':>11} {'implementation':<17} {'seconds':>8} {'CPU s':>6} {'rows/s':>10} "
              f"{'vs pandas':>9} {'coordinator RSS':>16} {'max worker RSS':>15} {'load':>5}")
    results = []
    for rows in args.rows:
        start = time.perf_counter()
        input_dir = make_input(work / f"input-{rows}", rows)
        size = sum(p.stat().st_size for p in input_dir.glob("*.parquet"))
        print(f"\ninput: {rows:,} rows in {FILES} Parquet files, {_mib(size)} "
              f"(ready in {time.perf_counter() - start:.0f} s)")
        print(header)
        base = None
        if rows <= args.pandas_max_rows:
            base = measure("pandas", input_dir, work / "out")
            base.update(rows_total=rows, implementation="pandas", workers=1)
            results.append(base)
            print(f"{rows:>11,} {'pandas':<17} {base['seconds']:>8.1f} "
                  f"{base['cpu_seconds']:>6.1f} "
                  f"{rows / base['seconds']:>10,.0f} {1.0:>8.2f}x "
                  f"{_mib(base['coordinator_rss']):>16} {'-':>15} {base['load']:>5.1f}", flush=True)
        for workers in args.workers:
            result = measure("fiberrl", input_dir, work / "out", workers)
            result.update(rows_total=rows, implementation="rl.data", workers=workers)
            results.append(result)
            ratio = f"{base['seconds'] / result['seconds']:>8.2f}x" if base else f"{'-':>9}"
            name = f"rl.data {workers} worker" + ("s" if workers > 1 else "")
            print(f"{rows:>11,} {name:<17} {result['seconds']:>8.1f} "
                  f"{result['cpu_seconds']:>6.1f} "
                  f"{rows / result['seconds']:>10,.0f} {ratio} "
                  f"{_mib(result['coordinator_rss']):>16} {_mib(result['worker_rss']):>15} "
                  f"{result['load']:>5.1f}", flush=True)
    (work / "results.json").write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
