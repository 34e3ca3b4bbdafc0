"""The master of test_slurm_warm.py, run as a script on the two-node Slurm cluster.

``python slurm_warm_master.py MODE [ARG]``: a pool whose workers are forked by warm
host jobs (``workers_per_job``); prints ``KEY value`` lines that the tests check.
A separate process because a test process's hub listens on loopback, which the
nodes' network namespaces cannot reach.
"""
import os
import signal
import socket
import subprocess
import sys
import time

import psutil

import fiberrl


def where(delay):
    """(host, pid) of the worker, after ``delay`` s."""
    time.sleep(delay)
    return socket.gethostname(), os.getpid()


def square_after(pair):
    delay, x = pair
    time.sleep(delay)
    return x * x


def say(word):
    """Print ``word`` with this worker's pid on its output (its log); return the pid."""
    print(f"said {word} in {os.getpid()}", flush=True)
    return os.getpid()


def _cli(*args):
    """``fiberrl ARGS...`` in a subprocess: (exit code, stdout)."""
    done = subprocess.run([sys.executable, "-m", "fiberrl.cli", *args], capture_output=True,
                          text=True, timeout=120)
    return done.returncode, done.stdout + done.stderr


def _forked(pid):
    """Whether ``pid`` was forked by a fork server (its parent runs the local backend's)."""
    parent = psutil.Process(pid).parent()
    return parent is not None and "fiberrl.backends.local" in " ".join(parent.cmdline())


def _pids(pool, workers):
    """Map until every one of ``workers`` workers has run a task: {pid: host}."""
    seen = {}
    while len(seen) < workers:
        seen.update({pid: host for host, pid in pool.map(where, [0.2] * 4 * workers, 1)})
    return seen


def _dump_jobs(signum, frame):
    """On SIGUSR1 (slurm_cluster.run_master, before it gives up on a hung master): the
    state of every child job and of the job watch, on stderr."""
    import multiprocessing.process as mp_process
    from fiberrl._runtime.liveness import existing_job_watch
    watch = existing_job_watch()
    lines = ["JOBS at SIGUSR1:"]
    for child in list(mp_process._children):
        popen = child._popen
        job = getattr(popen, "job", None)
        entry = watch.jobs.get(popen._token) if watch is not None and popen else None
        lines.append(f"  {child.name} job={getattr(job, 'id', None)} data={getattr(job, 'data', None)!r} "
                     f"rc={popen.returncode} "
                     f"ended_event={popen._ended.is_set()} token={popen._token} entry="
                     + (repr({k: getattr(entry, k) for k in entry.__slots__ if k != 'popen'})
                        if entry is not None else "None"))
    if watch is not None:
        lines.append(f"  watch: {len(watch.jobs)} jobs, poller alive "
                     f"{watch._poller is not None and watch._poller.is_alive()}")
    sys.stderr.write("\n".join(lines) + "\n")
    sys.stderr.flush()


def main(mode, arg=None):
    signal.signal(signal.SIGUSR1, _dump_jobs)
    fiberrl.init(backend="slurm", heartbeat_timeout=5)
    # 8-CPU nodes: 2 CPUs a worker, 4 a host job: one host job fills one node
    with fiberrl.Pool(8, cpu=2, workers_per_job=4) as pool:
        pids = _pids(pool, 8)
        print("HOSTS", sorted(set(pids.values())), flush=True)
        print("IDS", sorted(w.job_id for w in pool.workers()), flush=True)
        print("FORKED", all(_forked(pid) for pid in pids), flush=True)
        if mode == "sigkill":   # SIGKILL one worker mid-map
            result = pool.map_async(square_after, [(0.3, i) for i in range(80)], 1)
            time.sleep(1.0)
            victim = sorted(pids)[0]
            os.kill(victim, signal.SIGKILL)
            print("RESULTS_OK", result.get(timeout=120) == [i * i for i in range(80)], flush=True)
            print("SIBLINGS_ALIVE", all(psutil.pid_exists(p) for p in pids if p != victim),
                  flush=True)
        if mode == "kill":      # kill() one worker, terminate() another, mid-map
            result = pool.map_async(square_after, [(0.3, i) for i in range(80)], 1)
            time.sleep(1.0)
            killed, stopped = pool.workers()[:2]
            victims = [killed.pid, stopped.pid]
            jobs = [killed._popen.job, stopped._popen.job]  # the pool closes the processes
            killed.kill()
            stopped.terminate()
            backend = fiberrl.backends.default_backend()
            for key, job in zip(("KILLED", "STOPPED"), jobs):
                status = backend.wait(job, 30)
                print(key, status.exit_code, status.reason, flush=True)
            print("RESULTS_OK", result.get(timeout=120) == [i * i for i in range(80)], flush=True)
            others = [p for p in pids if p not in victims]
            print("SIBLINGS_ALIVE", len(others) == 6 and all(psutil.pid_exists(p) for p in others),
                  flush=True)
        if mode == "scancel":   # cancel one host job (4 workers) mid-map
            result = pool.map_async(square_after, [(0.3, i) for i in range(80)], 1)
            time.sleep(1.0)
            host = pool.workers()[0].job_id.rsplit(".", 1)[0]
            subprocess.run(["scancel", host], check=True, timeout=30)
            print("RESULTS_OK", result.get(timeout=180) == [i * i for i in range(80)], flush=True)
        if mode == "cli":       # fiberrl ps / logs / cancel of forked workers by their ids
            ids = sorted(w.job_id for w in pool.workers())
            code, listing = _cli("ps", "--backend", "slurm")
            print("PS_LISTS", code == 0 and all(i in listing.split() for i in ids), flush=True)
            by_pid = {w.pid: w.job_id for w in pool.workers()}
            said = {by_pid[pid] for pid in pool.map(say, ["hello-worker"] * 32, 1)}
            target = sorted(said)[0]
            code, log = _cli("logs", "--backend", "slurm", target)
            victim = next(pid for pid, job_id in by_pid.items() if job_id == target)
            print("LOGS_SHOW", code == 0 and f"said hello-worker in {victim}" in log, flush=True)
            code, _ = _cli("logs", "--backend", "slurm", ids[0].rsplit(".", 1)[0] + ".99")
            print("UNKNOWN_INDEX_EXIT", code, flush=True)
            result = pool.map_async(square_after, [(0.3, i) for i in range(40)], 1)
            time.sleep(1.0)
            code, out = _cli("cancel", "--backend", "slurm", target)
            print("CANCELLED", code == 0 and f"cancelled {target}" in out, flush=True)
            print("RESULTS_OK", result.get(timeout=120) == [i * i for i in range(40)], flush=True)
            deadline = time.monotonic() + 30
            while psutil.pid_exists(victim) and time.monotonic() < deadline:
                time.sleep(0.2)
            others = [pid for pid in by_pid if pid != victim]
            print("ONLY_TARGET_GONE", not psutil.pid_exists(victim)
                  and all(psutil.pid_exists(p) for p in others), flush=True)
        if mode == "node":      # take one node away mid-map (its slurmd and its processes)
            result = pool.map_async(where, [0.5] * 60, 1)
            time.sleep(3)
            subprocess.run(["bash", "-c", arg], check=True)
            late = result.get(timeout=150)
            print("LATE", sorted(set(h for h, _ in late[-10:])), flush=True)
        print("DEATHS", pool.stats().worker_deaths, flush=True)
        print("MAP_AFTER", pool.map(square_after, [(0.0, i) for i in range(16)])
              == [i * i for i in range(16)], flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:])
