"""Slurm benchmarks: how fast fiberrl gets work onto a real Slurm cluster.

    SLURM_CONF=... python bench/bench_slurm.py [--quick] [-v]

(``eval "$(bash scripts/slurm-up.sh | tail -1)"`` starts the one-node test cluster
and sets SLURM_CONF.) Measures, each printed side by side in one run:

- process start: ``Process.start()`` to the job running fiberrl code (its hello),
  median over several processes, as a job (sbatch) and as a job step inside an
  allocation (srun);
- ``Pool(16)``: constructor to the first result and to all 16 workers up, with
  workers as 16 individual jobs, as one job array (the default), and as job steps
  inside an allocation;
- the pool's no-op map rate and ES-like loop (from bench_pool.py), Slurm vs local.

Figures inside an allocation come from this script re-run as a batch job
(``sbatch --wait -c 16``), which prints them as JSON. These are measurements, not
tests: the machine may be shared and noisy.
"""
import argparse
import json
import logging
import os
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_pool  # noqa: E402  (pins BLAS threads before numpy loads)

import fiberrl  # noqa: E402

log = logging.getLogger("bench_slurm")
WAIT_S = 180.0


def _hello_seconds(proc, started, timeout=WAIT_S):
    """Seconds from ``started`` until the job said hello (its pid became known)."""
    end = time.monotonic() + timeout
    while proc._popen._hello_host is None:  # set when the job's hello arrives
        if time.monotonic() > end:
            raise TimeoutError(f"{proc.name} did not start within {timeout:.0f} s")
        time.sleep(0.002)
    return time.perf_counter() - started


def process_start(count):
    """Median seconds from Process.start() to the job running, ``count`` processes in turn."""
    samples = []
    for _ in range(count):
        proc = fiberrl.Process(target=time.sleep, args=(0,))
        started = time.perf_counter()
        proc.start()
        samples.append(_hello_seconds(proc, started))
        proc.join(WAIT_S)
    return statistics.median(samples)


def pool_start(workers=16):
    """(seconds to the first result, seconds until every worker is up) of Pool(workers)."""
    started = time.perf_counter()
    pool = fiberrl.Pool(workers)
    try:
        pool.apply_async(bench_pool.ident, (1,)).get(timeout=WAIT_S)
        first = time.perf_counter() - started
        end = time.monotonic() + WAIT_S
        while pool.stats().alive < workers:
            if time.monotonic() > end:
                raise TimeoutError(f"only {pool.stats().alive} of {workers} workers up")
            time.sleep(0.005)
        return first, time.perf_counter() - started
    finally:
        pool.terminate()
        pool.join()


def pool_figures(quick):
    """No-op map rate (k tasks/s, 4 workers, default chunksize) and ES iterations/s."""
    with bench_pool.open_pool(fiberrl, 4) as pool:
        noop = bench_pool.map_rate(pool, 20_000, None, 3 if quick else 10) / 1e3
    reps, _ = bench_pool.es_setup(quick)
    es = bench_pool.m_es_loop(fiberrl, quick, reps["reps"])["its"]
    return {"noop_ktasks_s": noop, "es_its_s": es}


def inside_allocation(quick):
    """The figures measured from inside an allocation (this script as a batch job)."""
    out = {"process_start_s": process_start(3 if quick else 5)}
    out["pool16_first_s"], out["pool16_all_s"] = pool_start()
    return out


def run_in_allocation(quick, cpus=16):
    """Re-run this script with --inside as a batch job; its JSON figures."""
    with tempfile.TemporaryDirectory(prefix="bench_slurm_") as tmp:
        out = os.path.join(tmp, "out")
        command = [sys.executable, os.path.abspath(__file__), "--inside"] + (["--quick"] if quick else [])
        env = {**os.environ, "FIBERRL_BACKEND": "slurm"}
        done = subprocess.run(["sbatch", "--wait", "--parsable", f"-c{cpus}", "--mem=8G",
                               f"--output={out}", "--wrap", " ".join(command)],
                              env=env, capture_output=True, text=True, timeout=900)
        text = done.stderr + (open(out).read() if os.path.exists(out) else "")
    for line in text.splitlines():
        if line.startswith("FIGURES "):
            return json.loads(line[len("FIGURES "):])
    raise RuntimeError(f"the batch job printed no figures:\n{text[-3000:]}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--inside", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("-v", action="store_true")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO if args.v else logging.WARNING)
    if args.inside:
        fiberrl.init(backend="slurm", extra={"slurm_forward_output": False})
        print("FIGURES " + json.dumps(inside_allocation(args.quick)), flush=True)
        return
    if not os.environ.get("SLURM_CONF") and not os.path.exists("/etc/slurm/slurm.conf"):
        sys.exit("no Slurm cluster: eval \"$(bash scripts/slurm-up.sh | tail -1)\" first")
    quiet = {"slurm_forward_output": False}
    fiberrl.init(backend="local")
    local = pool_figures(args.quick)
    fiberrl.init(backend="slurm", extra=quiet)
    figures = {"job": {"process_start_s": process_start(3 if args.quick else 9)}}
    fiberrl.init(backend="slurm", extra={**quiet, "slurm_array": False})
    figures["job"]["pool16_first_s"], figures["job"]["pool16_all_s"] = pool_start()
    fiberrl.init(backend="slurm", extra=quiet)
    figures["array"] = dict(zip(("pool16_first_s", "pool16_all_s"), pool_start()))
    figures["step"] = run_in_allocation(args.quick)
    slurm = pool_figures(args.quick)
    fiberrl.config.reset()

    print(f"\nSlurm start-up ({'quick' if args.quick else 'full'} run; seconds, lower is better)")
    print(f"{'measure':<34}{'16 jobs':>10}{'job array':>11}{'job steps':>11}")
    print(f"{'Process start -> running':<34}{figures['job']['process_start_s']:>10.3f}"
          f"{'-':>11}{figures['step']['process_start_s']:>11.3f}")
    for key, label in (("pool16_first_s", "Pool(16) -> first result"),
                       ("pool16_all_s", "Pool(16) -> all 16 workers up")):
        print(f"{label:<34}{figures['job'][key]:>10.3f}{figures['array'][key]:>11.3f}"
              f"{figures['step'][key]:>11.3f}")
    print("\nPool throughput, Slurm vs local (4 workers; higher is better)")
    print(f"{'measure':<34}{'local':>10}{'slurm':>11}{'slurm/local':>13}")
    for key, label in (("noop_ktasks_s", "no-op map (k tasks/s)"),
                       ("es_its_s", "ES loop (iterations/s)")):
        print(f"{label:<34}{local[key]:>10.2f}{slurm[key]:>11.2f}{slurm[key] / local[key]:>13.2f}")


if __name__ == "__main__":
    main()
