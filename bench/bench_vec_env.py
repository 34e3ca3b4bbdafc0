"""RL's hot path: vector envs stepped over pipes, fiberrl beside the stdlib, idle or loaded.

    python bench/bench_vec_env.py [--envs 2,4] [--busy-us 0,300] [--steps 2000] [--runs 3]
                                  [--load N] [--one-layout] [--ppo] [--ppo-steps 20000]
    python bench/bench_vec_env.py --paired [--steps 300] [--blocks 40] [--envs 2,4] [--load N]
                                  [--one-layout]

For every number of envs and env step cost (CartPole-v1, plus a busy wait of
``--busy-us`` microseconds per step), interleaved runs of:

- ``AVE fork``: gymnasium's ``AsyncVectorEnv`` (defaults: shared memory, one pipe per
  env) on the stdlib's fork context, the peer;
- ``AVE spawn``: the same on the stdlib's spawn context (fresh interpreters, as
  fiberrl's jobs are), for reference;
- ``AVE fiberrl``: the same with its ``multiprocessing`` bound to fiberrl
  (``import fiberrl as multiprocessing``); target >= 0.9x AVE fork;
- ``PVE fiberrl``: ``rl``'s own :class:`rl.envs.ProcessVectorEnv` (one fiberrl process
  per env); target >= 1.0x AVE fork;
- ``PVE packed``: the same with the envs packed into one process per core
  (``envs_per_process=ceil(envs / cores)``, as ``fiberrl train --workers $(nproc)``
  builds it), for reference.

Each run is a fresh interpreter; the table gives median steps/s over all envs and the
CPU of the whole process tree per 1,000 env steps.

``--paired`` measures the AVE and PVE gates without the machine's drift: one interpreter
builds ``AVE fork``, ``AVE forkserver`` (the stdlib's default on Linux from Python 3.14),
``AVE spawn``, ``AVE fiberrl`` and ``PVE fiberrl`` side by side, then steps them in turn,
``--steps`` vector steps a block for ``--blocks`` blocks (the order rotated every
block), and reports for each the median over blocks of its steps/s divided by fork's
in the same block, with the CPU per env step of the parent's stepping thread and of
the env processes apart. Separate runs on a shared VM swing by 1.5x from minute to minute;
paired blocks agree within ~0.05x. ``--ppo`` adds ``fiberrl train ppo``
on ``SlowCartPole-v1`` (300 us per step) with ``--workers 2`` against ``--workers 0``
(target >= 1.5x), and, when ``stable-baselines3`` is installed, the peer's speed-up on
the same envs: its PPO with the same settings on ``SubprocVecEnv`` (fork) against
``DummyVecEnv``. ``--load N`` runs it all with N CPU-bound processes alongside.
``--one-layout`` runs it all with address-space randomization off, so that every
process has the address layout a forked child has (``setarch -R``): fresh interpreters
(the stdlib's spawn and forkserver, fiberrl's jobs) taking turns on a core with
processes of other layouts run Python slower than forked ones, and this separates that
cost from a library's own (docs/benchmarks.md, stops 47 and 53).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from machine_load import (add_layout_option, add_load_option, apply_layout_option,  # noqa: E402
                          cpu_load, describe, process_cpu)

TARGETS = ("AVE fork", "AVE spawn", "AVE fiberrl", "PVE fiberrl", "PVE packed")
GOALS = {"AVE fiberrl": 0.9, "PVE fiberrl": 1.0, "PVE packed": 1.0}


def one_run(target: str, envs: int, steps: int, busy_us: float) -> dict:
    """Step ``envs`` envs ``steps`` times under ``target`` in this interpreter."""
    import multiprocessing
    import types

    import numpy as np
    import psutil

    import slow_envs

    def tree_cpu() -> float:
        me = psutil.Process()
        total = sum(me.cpu_times()[:2])
        for child in me.children(recursive=True):
            try:
                total += sum(child.cpu_times()[:2])
            except psutil.Error:
                pass
        return total

    make = [lambda: slow_envs.make_slow_cartpole(busy_us) for _ in range(envs)]
    if target.startswith("PVE"):
        from rl.envs import ProcessVectorEnv
        per_process = 1 if target == "PVE fiberrl" else -(-envs // len(os.sched_getaffinity(0)))
        env = ProcessVectorEnv("slow_envs:SlowCartPole-v1", envs, seed=0, busy_us=busy_us,
                               envs_per_process=per_process)
        env.reset(seed=0)
        step = env.step
    else:
        from gymnasium.vector import AsyncVectorEnv
        from gymnasium.vector import async_vector_env
        context = target.split()[1]
        if context == "fiberrl":
            import fiberrl
            view = types.ModuleType("multiprocessing")
            view.__dict__.update({k: getattr(multiprocessing, k) for k in dir(multiprocessing)
                                  if not k.startswith("__")})
            view.get_context = lambda method=None: fiberrl.get_context()
            async_vector_env.multiprocessing = view
            context = None
        env = AsyncVectorEnv(make, context=context)
        env.reset(seed=0)
        step = env.step
    actions = np.random.default_rng(0).integers(0, 2, size=(steps + 50, envs))
    for i in range(50):
        step(actions[i])
    cpu, started = tree_cpu(), time.perf_counter()
    for i in range(steps):
        step(actions[50 + i])
    wall = time.perf_counter() - started
    cpu = tree_cpu() - cpu
    env.close()
    return {"steps_per_s": envs * steps / wall, "cpu_ms_per_1k": cpu / (envs * steps) * 1e6}


class _Stepped:
    """One vector env of the paired run, with its block figures."""

    def __init__(self, env, envs: int) -> None:
        self.env, self.envs = env, envs
        processes = env.procs if hasattr(env, "procs") else env.processes   # PVE, AVE
        self.pids = [proc.pid for proc in processes]
        self.forget()

    def forget(self) -> None:
        """Drop the figures so far (the warm-up's)."""
        self.rates, self.env_cpu, self.parent_cpu = [], [], []

    def block(self, actions) -> float:
        env_cpu = sum(process_cpu(pid) for pid in self.pids)
        parent_cpu, started = time.thread_time(), time.perf_counter()
        for action in actions:
            self.env.step(action)
        wall = time.perf_counter() - started
        env_steps = len(actions) * self.envs
        self.parent_cpu.append((time.thread_time() - parent_cpu) / env_steps * 1e6)
        self.env_cpu.append((sum(process_cpu(pid) for pid in self.pids) - env_cpu)
                            / env_steps * 1e6)
        self.rates.append(env_steps / wall)
        return self.rates[-1]


def paired(args: argparse.Namespace) -> None:
    """AVE fork, forkserver, spawn and fiberrl, and PVE fiberrl, stepped in turn in one
    interpreter."""
    import multiprocessing
    import types

    import numpy as np
    from gymnasium.vector import AsyncVectorEnv
    from gymnasium.vector import async_vector_env

    import fiberrl
    import slow_envs
    from rl.envs import ProcessVectorEnv

    for envs in args.envs:
        for busy_us in args.busy_us:
            make = [lambda: slow_envs.make_slow_cartpole(busy_us) for _ in range(envs)]
            sides = {"AVE fork": AsyncVectorEnv(make, context="fork"),
                     "AVE forkserver": AsyncVectorEnv(make, context="forkserver"),
                     "AVE spawn": AsyncVectorEnv(make, context="spawn")}
            view = types.ModuleType("multiprocessing")
            view.__dict__.update({k: getattr(multiprocessing, k) for k in dir(multiprocessing)
                                  if not k.startswith("__")})
            view.get_context = lambda method=None: fiberrl.get_context()
            real = async_vector_env.multiprocessing
            async_vector_env.multiprocessing = view
            try:
                sides["AVE fiberrl"] = AsyncVectorEnv(make, context=None)
            finally:
                async_vector_env.multiprocessing = real
            sides["PVE fiberrl"] = ProcessVectorEnv("slow_envs:SlowCartPole-v1", envs, seed=0,
                                                    busy_us=busy_us)
            sides = {name: _Stepped(env, envs) for name, env in sides.items()}
            actions = np.random.default_rng(0).integers(0, 2, size=(args.steps, envs))
            for side in sides.values():
                side.env.reset(seed=0)
                side.block(actions[:50])   # connections made, caches warm
                side.forget()
            names = list(sides)
            ratios = {name: [] for name in names}
            for block in range(args.blocks):
                order = names[block % len(names):] + names[:block % len(names)]
                rates = {name: sides[name].block(actions) for name in order}
                for name in names:
                    ratios[name].append(rates[name] / rates["AVE fork"])
            for side in sides.values():
                side.env.close()
            print(f"{envs} envs, {busy_us:.0f} us env step; {args.blocks} blocks of "
                  f"{args.steps} vector steps each, in turn")
            for name, side in sides.items():
                low, _, high = statistics.quantiles(ratios[name], n=4)
                print(f"  {name:14} {statistics.median(side.rates):8.0f} steps/s, "
                      f"{statistics.median(ratios[name]):.2f}x AVE fork in the same block "
                      f"(middle half {low:.2f}-{high:.2f}); CPU per env step: parent "
                      f"{statistics.median(side.parent_cpu):5.1f} us, envs "
                      f"{statistics.median(side.env_cpu):5.1f} us")
            for name, goal in (("AVE fiberrl", 0.9), ("PVE fiberrl", 1.0)):
                ratio = statistics.median(ratios[name])
                print(f"  {name} target >= {goal}x AVE fork: "
                      f"{'met' if ratio >= goal else 'NOT met'}")


def run_fresh(target: str, envs: int, steps: int, busy_us: float) -> dict:
    """:func:`one_run` in a fresh interpreter (cwd: a temporary directory)."""
    out = subprocess.run([sys.executable, os.path.abspath(__file__), "--one", target,
                          str(envs), str(steps), str(busy_us)], capture_output=True,
                         text=True, timeout=600, cwd=tempfile.gettempdir(),
                         env={**os.environ, "PYTHONPATH": HERE + os.pathsep
                              + os.environ.get("PYTHONPATH", "")})
    if out.returncode:
        raise RuntimeError(f"{target} failed:\n{out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def vector_envs(args: argparse.Namespace) -> None:
    print(f"{'envs':>4} {'busy us':>7}  " + "  ".join(f"{t:>18}" for t in TARGETS))
    for envs in args.envs:
        for busy_us in args.busy_us:
            results = {t: [] for t in TARGETS}
            for _ in range(args.runs):   # interleaved: the machine's state drifts
                for target in TARGETS:
                    results[target].append(run_fresh(target, envs, args.steps, busy_us))
            med = {t: (statistics.median(r["steps_per_s"] for r in results[t]),
                       statistics.median(r["cpu_ms_per_1k"] for r in results[t]))
                   for t in TARGETS}
            cells = "  ".join(f"{rate:>7.0f}/s {cpu:>5.0f} ms" for rate, cpu in med.values())
            print(f"{envs:>4} {busy_us:>7.0f}  {cells}")
            peer = med["AVE fork"][0]
            for target, goal in GOALS.items():
                ratio = med[target][0] / peer
                runs = " ".join(f"{r['steps_per_s']:.0f}" for r in results[target])
                print(f"{'':>14}{target} / AVE fork: {ratio:.2f}x (target >= {goal}: "
                      f"{'met' if ratio >= goal else 'NOT met'}); runs {runs}; fork runs "
                      + " ".join(f"{r['steps_per_s']:.0f}" for r in results["AVE fork"]))


def _ppo_rate(env: str, workers: int, steps: int) -> float:
    """Env steps per second of one ``fiberrl train ppo`` run's training loop."""
    fiberrl_cli = os.path.join(os.path.dirname(sys.executable), "fiberrl")
    with tempfile.TemporaryDirectory() as out:
        subprocess.run([fiberrl_cli, "train", "ppo", "--env", env, "--total-steps", str(steps),
                        "--workers", str(workers), "--eval-every", str(steps * 10),
                        "--eval-episodes", "1", "--no-progress", "--seed", "0",
                        "--out", os.path.join(out, "run")],
                       check=True, capture_output=True, cwd=out, env={**os.environ, "PYTHONPATH": HERE})
        with open(os.path.join(out, "run", "summary.json")) as fh:
            summary = json.load(fh)
    return summary["env_steps"] / summary["wall_s"]


def ppo_workers(args: argparse.Namespace) -> None:
    """``fiberrl train ppo`` on a 300 us env, 2 env processes against none: env steps per
    second of the training loop (summary.json's ``wall_s``: interpreter and torch
    start-up left out, one evaluation episode at the end left in).

    The learner's own time (acting and learning, serial whatever the workers) bounds
    the speed-up (Amdahl): with ``L`` its time per env step, measured on a cheap
    CartPole-v1 with ``--workers 0``, and ``E`` the 300 us step, two env processes can
    at best turn ``L + E`` into ``L + E / 2``."""
    rates = {0: [], 2: [], "cheap": []}
    for _ in range(args.runs):
        for workers in (0, 2):
            rates[workers].append(_ppo_rate("slow_envs:SlowCartPole-v1", workers, args.ppo_steps))
        rates["cheap"].append(_ppo_rate("CartPole-v1", 0, args.ppo_steps))
    w0, w2, cheap = (statistics.median(rates[key]) for key in (0, 2, "cheap"))
    learner, env_step = 1 / cheap, 1 / w0 - 1 / cheap
    bound = (learner + env_step) / (learner + env_step / 2)
    print(f"fiberrl train ppo, SlowCartPole-v1 (300 us steps), {args.ppo_steps} steps, 4 envs: "
          f"--workers 0 {w0:.0f} steps/s, --workers 2 {w2:.0f} steps/s: {w2 / w0:.2f}x "
          f"(target >= 1.5: {'met' if w2 / w0 >= 1.5 else 'NOT met'}); runs "
          f"{[round(r) for r in rates[0]]} / {[round(r) for r in rates[2]]}")
    print(f"  the learner's own time: {learner * 1e6:.0f} us per env step (CartPole-v1, --workers "
          f"0: {cheap:.0f} steps/s), the env's {env_step * 1e6:.0f} us: two env processes can at "
          f"best give {bound:.2f}x")
    # what the stdlib reaches in the same loop: a stand-in learner busy for 4 * learner
    # per vector step, the 4 envs stepped in this process, by AsyncVectorEnv on fork, or
    # by ProcessVectorEnv packed two per process (as --workers 2 builds it)
    vector_learner_us = 4 * learner * 1e6
    serial = statistics.median(run_learner_loop("serial", vector_learner_us) for _ in range(args.runs))
    others = {t: statistics.median(run_learner_loop(t, vector_learner_us) for _ in range(args.runs))
              for t in ("AVE fork", "PVE packed")}
    print(f"  the same loop with a {vector_learner_us:.0f} us stand-in learner per vector step: "
          + ", ".join(f"{t} {rate / serial:.2f}x" for t, rate in others.items())
          + f" the envs stepped in the learner's process ({serial:.0f} steps/s)")
    sb3_speedup(args)


def _sb3_rate(vec_env: str, steps: int) -> float:
    """Env steps per second of Stable-Baselines3's PPO (4 SlowCartPole envs, 128 steps,
    4 epochs, minibatch 128: ``fiberrl train ppo``'s settings) on ``vec_env``
    (``dummy``: in its own process; ``fork``: ``SubprocVecEnv`` on the fork context),
    in a fresh interpreter; torch and the first rollout are left out. torch gets one
    thread, as in ``fiberrl train`` (with more, its idle threads spin in the cores the
    env processes need)."""
    out = subprocess.run([sys.executable, os.path.abspath(__file__), "--sb3", vec_env, str(steps)],
                         capture_output=True, text=True, timeout=600, cwd=tempfile.gettempdir(),
                         env={**os.environ, "PYTHONPATH": HERE})
    if out.returncode:
        raise RuntimeError(f"SB3 on {vec_env} failed:\n{out.stderr[-2000:]}")
    return float(out.stdout.split()[-1])


def sb3_run(vec_env: str, steps: int) -> float:
    """The body of :func:`_sb3_rate`."""
    import torch
    from stable_baselines3 import PPO as SB3PPO
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.vec_env import DummyVecEnv, SubprocVecEnv

    import slow_envs
    if vec_env == "dummy":
        kwargs = {"vec_env_cls": DummyVecEnv}
    else:
        kwargs = {"vec_env_cls": SubprocVecEnv, "vec_env_kwargs": {"start_method": vec_env}}
    torch.set_num_threads(1)
    env = make_vec_env(lambda: slow_envs.make_slow_cartpole(300), n_envs=4, seed=0, **kwargs)
    try:
        model = SB3PPO("MlpPolicy", env, n_steps=128, batch_size=128, n_epochs=4, seed=0,
                       verbose=0, device="cpu")
        model.learn(1024)
        started = time.perf_counter()
        model.learn(steps)
        return steps / (time.perf_counter() - started)
    finally:
        env.close()


def sb3_speedup(args: argparse.Namespace) -> None:
    """The peer on the same envs: SB3's PPO with env processes against without."""
    import importlib.util
    if importlib.util.find_spec("stable_baselines3") is None:
        print("  (stable-baselines3 is not installed: the peer's figure is left out)")
        return
    rates = {"dummy": [], "fork": []}
    for _ in range(args.runs):
        for vec_env in rates:
            rates[vec_env].append(_sb3_rate(vec_env, args.ppo_steps))
    dummy, fork = (statistics.median(rates[key]) for key in ("dummy", "fork"))
    print(f"  the peer, Stable-Baselines3 PPO, same envs and settings: SubprocVecEnv (fork) "
          f"{fork:.0f} steps/s, DummyVecEnv {dummy:.0f}: {fork / dummy:.2f}x; runs "
          f"{[round(r) for r in rates['fork']]} / {[round(r) for r in rates['dummy']]}")


def run_learner_loop(target: str, learner_us: float, steps: int = 1000) -> float:
    """Env steps per second of a loop that spends ``learner_us`` busy, then steps 4
    SlowCartPole envs (``serial``: in this process), in a fresh interpreter."""
    out = subprocess.run([sys.executable, os.path.abspath(__file__), "--learner-loop", target,
                          str(learner_us), str(steps)], capture_output=True, text=True,
                         timeout=600, cwd=tempfile.gettempdir(),
                         env={**os.environ, "PYTHONPATH": HERE})
    if out.returncode:
        raise RuntimeError(f"{target} failed:\n{out.stderr[-2000:]}")
    return float(out.stdout.split()[-1])


def learner_loop(target: str, learner_us: float, steps: int) -> float:
    """The body of :func:`run_learner_loop`."""
    import numpy as np

    import slow_envs
    if target == "serial":
        from rl.envs import InProcessVectorEnv
        env = InProcessVectorEnv("slow_envs:SlowCartPole-v1", 4, seed=0)
    elif target == "AVE fork":
        from gymnasium.vector import AsyncVectorEnv
        env = AsyncVectorEnv([lambda: slow_envs.make_slow_cartpole(300)] * 4, context="fork")
    else:
        from rl.envs import ProcessVectorEnv
        env = ProcessVectorEnv("slow_envs:SlowCartPole-v1", 4, seed=0,
                               envs_per_process=-(-4 // len(os.sched_getaffinity(0))))
    env.reset(seed=0)
    actions = np.zeros(4, dtype=np.int64)
    for _ in range(50):
        env.step(actions)
    started = time.perf_counter()
    for _ in range(steps):
        until = time.perf_counter() + learner_us * 1e-6
        while time.perf_counter() < until:
            pass
        env.step(actions)
    rate = 4 * steps / (time.perf_counter() - started)
    env.close()
    return rate


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--learner-loop":
        print(learner_loop(sys.argv[2], float(sys.argv[3]), int(sys.argv[4])))
        return
    if len(sys.argv) > 1 and sys.argv[1] == "--sb3":
        print(sb3_run(sys.argv[2], int(sys.argv[3])))
        return
    if len(sys.argv) > 1 and sys.argv[1] == "--one":
        target, envs, steps, busy_us = sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), \
            float(sys.argv[5])
        print(json.dumps(one_run(target, envs, steps, busy_us)))
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--envs", type=lambda s: [int(v) for v in s.split(",")], default=[2, 4])
    parser.add_argument("--busy-us", type=lambda s: [float(v) for v in s.split(",")],
                        default=[0.0, 300.0])
    parser.add_argument("--steps", type=int, default=2000, help="vector steps per run")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--ppo", action="store_true", help="also fiberrl train ppo --workers")
    parser.add_argument("--ppo-steps", type=int, default=20000)
    parser.add_argument("--no-vec", action="store_true", help="skip the vector-env table")
    parser.add_argument("--paired", action="store_true",
                        help="instead of the table: AVE fork, forkserver, spawn and fiberrl "
                             "stepped in turn in one interpreter (--steps per block: 300)")
    parser.add_argument("--blocks", type=int, default=40, help="blocks of a --paired run")
    add_load_option(parser)
    add_layout_option(parser)
    args = parser.parse_args()
    apply_layout_option(args, sys.argv)
    print(describe(args.load))
    with cpu_load(args.load):
        if args.paired:
            paired(args)
        elif not args.no_vec:
            vector_envs(args)
        if args.ppo:
            ppo_workers(args)


if __name__ == "__main__":
    main()
