"""Population-based training of PPO on Pendulum-v1 (issue 31): PBT against a random
search of the same members, and Ray Tune's PBT scheduler over the same PPO training.

    python bench/bench_pbt.py --part one                 # one member alone: time it first
    python bench/bench_pbt.py --part campaign --seeds 0 1 2 --out /tmp/pbt-bench
    python bench/bench_pbt.py --part ray --seeds 0 --out /tmp/pbt-bench   # needs ray[tune]

- campaign: per seed, PBT (``--pbt-interval`` 10,000) and the random search
  (interval 0) of the same 8 members, 100,000 env steps each, run one after the other
  in this order (PBT first for even seeds, random search first for odd ones). Prints the
  best member's final deterministic evaluation (10 episodes, the figure the issue's target
  is on), the same exported policy.pt re-evaluated on 50 episodes of unseen seeds (the
  best of 8 noisy evaluations is biased upwards), wall time, the PBT/random wall ratio,
  and where the members' time went (training, waiting for the controller).
- fixed: the same with ``num_epochs`` left out of the space, so both modes do the same
  work per env step and the wall ratio shows the framework's own cost.
- ray: Ray Tune's ``PopulationBasedTraining`` (asynchronous, quantile 0.25, resample
  0.25, perturbation every 10,000 env steps) over the same PPO training function, the
  same default search space and budget, 8 trials on a Ray of 8 logical CPUs (the same
  8-way oversubscription of the machine's cores as fiberrl's 8 member processes).

Benchmarks are run by hand on an otherwise quiet machine (``flock /tmp/fiberrl-heavy.lock``);
they are not tests.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

ENV, ALGO, MEMBERS, STEPS, INTERVAL = "Pendulum-v1", "ppo", 8, 100_000, 10_000
REEVAL_SEED, REEVAL_EPISODES = 50_000, 50


def _load(out: Path) -> float:
    """The exported policy.pt re-evaluated on fresh seeds (mean return)."""
    import numpy as np
    from rl.evaluation import evaluate
    from rl.serving import load

    class Served:
        def __init__(self, path):
            self.predictor = load(path)

        def compute_actions(self, obs, explore=True):
            rows = [{str(i): float(v) for i, v in enumerate(o)} for o in obs]
            return np.asarray([p.action for p in self.predictor.predict(rows)]), {}
    return evaluate(Served(out / "policy.pt"), ENV, REEVAL_EPISODES, seed=REEVAL_SEED).mean


def one(seed: int) -> None:
    """One member's budget alone, with PPO's continuous defaults (a plain run)."""
    from rl.train import TrainSpec, train
    started = time.perf_counter()
    summary = train(TrainSpec(ALGO, ENV, tempfile.mkdtemp(), seed=seed, total_steps=STEPS,
                              progress=False))
    print(f"one default run, seed {seed}: eval {summary['eval_mean']:.1f}, "
          f"{time.perf_counter() - started:.1f} s wall", flush=True)


def mean_epochs(out: Path) -> float:
    """PPO epochs per batch, averaged over every member's env steps (compute per step)."""
    state = json.loads((out / "population.json").read_text())
    total = 0.0
    for member in state["members"]:
        schedule = member["schedule"] + [[STEPS, None]]
        for (step, values), (end, _) in zip(schedule[:-1], schedule[1:]):
            total += values["num_epochs"] * (end - step)
    return total / (STEPS * len(state["members"]))


def population(seed: int, interval: int, out: Path, search=None) -> dict:
    """One population run; its figures."""
    from rl.pbt import PopulationSpec, train_population
    from rl.registry import TrainSpec
    started = time.perf_counter()
    summary = train_population(PopulationSpec(
        TrainSpec(ALGO, ENV, out, seed=seed, total_steps=STEPS, progress=False),
        population=MEMBERS, interval=interval, search=search))
    wall = time.perf_counter() - started
    return {"seed": seed, "mode": summary["mode"], "best": summary["eval_mean"],
            "best_member": summary["best_member"], "reeval": _load(out), "wall_s": wall,
            "exploits": summary["exploits"], "train_s": summary["train_s"],
            "cpu_s": summary["cpu_s"], "wait_s": summary["wait_s"],
            "controller_cpu_s": summary["controller_cpu_s"],
            "epochs": mean_epochs(out) if search is None else None,
            "restarts": sum(m["restarts"] for m in summary["population"]),
            "finals": sorted(round(m["final_eval"], 1) for m in summary["population"])}


def campaign(seeds, out: Path, search=None) -> list:
    """PBT and the random search per seed, interleaved; ``search`` None: the default space."""
    rows = []
    tag = "" if search is None else "fixed-"
    for seed in seeds:
        order = (INTERVAL, 0) if seed % 2 == 0 else (0, INTERVAL)
        for interval in order:
            row = population(seed, interval, out / f"{tag}{'pbt' if interval else 'rs'}-{seed}",
                             search)
            rows.append(row)
            print(json.dumps(row), flush=True)
    print("\n| seed | mode | best final eval (10 ep) | best re-evaluated (50 ep) | wall s |"
          " exploits | member CPU s | mean epochs | member wait s | controller CPU s | restarts |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        epochs = "-" if r["epochs"] is None else f"{r['epochs']:.1f}"
        print(f"| {r['seed']} | {r['mode']} | {r['best']:.1f} | {r['reeval']:.1f} | "
              f"{r['wall_s']:.1f} | {r['exploits']} | {r['cpu_s']:.0f} | {epochs} | "
              f"{r['wait_s']:.1f} | {r['controller_cpu_s']:.1f} | {r['restarts']} |")
    for seed in seeds:
        pbt = next(r for r in rows if r["seed"] == seed and r["mode"] == "pbt")
        rs = next(r for r in rows if r["seed"] == seed and r["mode"] == "random_search")
        print(f"seed {seed}: PBT wall / random-search wall = {pbt['wall_s'] / rs['wall_s']:.3f}")
    return rows


# -- Ray Tune's PBT over the same training -------------------------------------------
def ray_trainable(config: dict) -> None:
    """The same PPO member as fiberrl's, reporting to Ray Tune every INTERVAL env steps."""
    import torch
    from ray import tune
    from rl.builders import build_ppo
    from rl.evaluation import evaluate
    from rl.loop import Hook, run
    from rl.registry import TrainSpec
    from rl.stops import AfterSteps
    torch.set_num_threads(1)
    hyper = {k: v for k, v in config.items() if k != "seed"}
    trainee = build_ppo(TrainSpec(ALGO, ENV, "", seed=config["seed"], total_steps=STEPS,
                                  overrides=hyper))
    checkpoint = tune.get_checkpoint()

    class Report(Hook):
        next_at = INTERVAL

        def experiment_pre(self, state):
            if checkpoint is not None:
                with checkpoint.as_directory() as d:
                    saved = torch.load(Path(d) / "state.pt", weights_only=False)
                state.policy.load_state_dict(saved["policy"])
                state.restore(saved["run"])
            state.policy.set_hyperparameters(hyper)
            self.next_at = (state.env_steps // INTERVAL + 1) * INTERVAL

        def learn_post(self, state, stats):
            if self.next_at <= state.env_steps < STEPS:
                self.report(state)

        def experiment_post(self, state):
            self.report(state)

        def report(self, state):
            result = evaluate(state.policy, ENV, 10)
            with tempfile.TemporaryDirectory() as d:
                torch.save({"policy": state.policy.state_dict(), "run": state.counters()},
                           Path(d) / "state.pt")
                tune.report({"eval_mean": result.mean, "env_steps": state.env_steps},
                            checkpoint=tune.Checkpoint.from_directory(d))
            self.next_at = (state.env_steps // INTERVAL + 1) * INTERVAL
    try:
        run(trainee.agent, trainee.env, AfterSteps(STEPS), [Report()], seed=config["seed"])
    finally:
        for close in trainee.closers:
            close()


def ray_pbt(seed: int, out: Path) -> dict:
    import ray
    from ray import tune
    from ray.tune.schedulers import PopulationBasedTraining
    space = {"lr": tune.loguniform(1e-4, 3e-3), "gamma": [0.9, 0.95, 0.98, 0.99],
             "gae_lambda": [0.8, 0.9, 0.95, 0.98], "clip": tune.uniform(0.1, 0.3),
             "ent_coef": [0.0, 1e-4, 1e-3, 1e-2], "num_epochs": tune.randint(4, 16)}
    started = time.perf_counter()
    here = Path(__file__).resolve().parent
    ray.init(num_cpus=MEMBERS, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {"PYTHONPATH": f"{here.parent}{os.pathsep}{here}"}})
    try:
        scheduler = PopulationBasedTraining(
            time_attr="env_steps", perturbation_interval=INTERVAL, hyperparam_mutations=space,
            quantile_fraction=0.25, resample_probability=0.25)
        param_space = {"seed": tune.randint(0, 10**6),
                       **{k: (tune.choice(v) if isinstance(v, list) else v)
                          for k, v in space.items()}}
        tuner = tune.Tuner(
            ray_trainable, param_space=param_space,
            tune_config=tune.TuneConfig(scheduler=scheduler, num_samples=MEMBERS,
                                        metric="eval_mean", mode="max"),
            run_config=tune.RunConfig(storage_path=str(out.resolve()), name=f"ray-{seed}",
                                      verbose=0, stop={"env_steps": STEPS}))
        results = tuner.fit()
        finals = [r.metrics.get("eval_mean") for r in results]
        best = max(f for f in finals if f is not None)
    finally:
        ray.shutdown()
    return {"seed": seed, "mode": "ray_tune_pbt", "best": best,
            "wall_s": time.perf_counter() - started,
            "finals": sorted(round(f, 1) for f in finals if f is not None)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--part", choices=("one", "campaign", "fixed", "ray"), default="campaign",
                        help="fixed: the campaign with the default space less num_epochs, so "
                             "that PBT and the random search do the same work per env step")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--out", type=Path, default=Path(tempfile.mkdtemp(prefix="bench-pbt-")))
    args = parser.parse_args()
    os.system("uptime")
    if args.part == "one":
        for seed in args.seeds:
            one(seed)
    elif args.part == "campaign":
        campaign(args.seeds, args.out)
    elif args.part == "fixed":
        from rl.pbt import default_space
        space = default_space(ALGO, discrete=False)
        space.pop("num_epochs")
        campaign(args.seeds, args.out, search=space)
    else:
        for seed in args.seeds:
            print(json.dumps(ray_pbt(seed, args.out)), flush=True)
    os.system("uptime")


if __name__ == "__main__":
    main()
