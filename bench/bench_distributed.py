"""Offline DQN training throughput with 1 and 2 CPU ranks (torch.distributed, gloo,
one fiberrl process per rank), in one run.

    python bench/bench_distributed.py [--episodes 4000] [--epochs 3] [--batch 512] [--backend local]

Logs CartPole-v1 under a random policy, runs the Timeline with 4 output shards, and
trains the same DQN (double + dueling, 128x128) with 1 rank in this process and with
2 ranks, without CPE or evaluation; prints training samples per second (global batch
rows per second of gradient steps, the mean over epochs after the first) and the ratio.
"""
from __future__ import annotations

import argparse
import logging
import tempfile
import time
from pathlib import Path

import torch

logger = logging.getLogger("bench_distributed")


def _rank(ctx, timeline: Path, spec: dict, epochs: int, batch: int) -> dict:
    import gymnasium as gym
    from rl.algos.dqn import DQN
    from rl.data import FeatureNormalizer
    from rl.data.spec import spec_features
    from rl.offline.dataset import OfflineDataset
    from rl.offline.preprocess import MaskedNormalizer
    from rl.offline.trainer import OfflineSettings, OfflineTrainer
    torch.set_num_threads(1)
    rank, world = (0, 1) if ctx is None else (ctx.rank, ctx.world_size)
    features = spec_features(spec)
    dataset = OfflineDataset.from_timeline(timeline, 0.99, features, ["0", "1"], shard=(rank, world))
    policy = DQN(gym.spaces.Box(-1e9, 1e9, (len(features),)), gym.spaces.Discrete(2), seed=0,
                 preprocessor=MaskedNormalizer(FeatureNormalizer(spec, features)),
                 config={"hidden": (128, 128), "tau": 0.005})
    settings = OfflineSettings(epochs=epochs, batch_size=batch, target_update_every=1, cpe_mdps=0,
                               checkpoint=False)
    summary = OfflineTrainer(policy, dataset, settings, rank=rank, world_size=world).train()
    return summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=4000)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch", type=int, default=512)
    parser.add_argument("--backend", default=None)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    logging.getLogger("rl").setLevel(logging.WARNING)
    import fiberrl
    from rl.data import generate_logged_data, run_timeline
    from rl.data.identify import IdentifyOptions, identify_features
    from rl.data.sampling import sample_features
    from rl.distributed import launch
    if args.backend:
        fiberrl.init(backend=args.backend)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        generate_logged_data("CartPole-v1", args.episodes, 1.0, root / "logs.parquet", seed=0)
        meta = run_timeline(str(root / "logs.parquet"), root / "timeline", 0.99, shards=4)
        samples, counts = sample_features(str(root / "timeline"), field="state_features")
        spec = identify_features(samples, {}, counts, IdentifyOptions(), field="state_features")
        rows = []
        for world in (1, 2):
            started = time.perf_counter()
            if world == 1:
                summary = _rank(None, root / "timeline", spec, args.epochs, args.batch)
            else:
                summary = launch(_rank, 2, args=(root / "timeline", spec, args.epochs, args.batch),
                                 resources={"mem": "2G"})[0]
            wall = time.perf_counter() - started
            rates = [e["samples_per_s"] for e in summary["epochs"][1:]] or \
                [summary["epochs"][0]["samples_per_s"]]
            rows.append((world, sum(rates) / len(rates), wall))
    logger.info("offline DQN on %d CartPole transitions, global batch %d, %d epochs, 2-core machine:",
                meta["rows"], args.batch, args.epochs)
    base = rows[0][1]
    for world, rate, wall in rows:
        logger.info("  %d rank%s: %9.0f samples/s  (%.2fx of 1 rank), %.1f s wall incl. start-up",
                    world, "" if world == 1 else "s", rate, rate / base, wall)


if __name__ == "__main__":
    main()
