"""What a pool's master costs per worker, and how it behaves at 64-1,024 workers (issue 23).

    python bench/bench_scale.py [--workers 64 256] [--backend local|slurm|docker] [--cpu 1]
                                [--only idle noop sleep kill node es broadcast] [--fork-reference]
                                [--per-job 1 16]

For each pool size: the time from ``Pool(n)`` to every worker connected; the master's
file descriptors, threads and RSS (and their growth per worker over the master before
the pool); its CPU per second while the pool idles (heartbeats); the workers' median
RSS/USS; no-op ``map`` tasks/s (chunksize 1 and default); Fiber's overhead test
(``sleep(d)`` tasks, chunksize 1, d = 10 ms and 100 ms, elapsed/ideal; with
``--fork-reference`` the stdlib fork pool of the same size runs it too, side by side);
SIGKILL of 10% of the workers at once mid-map (every result back? extra seconds over
the same map without kills; seconds until the pool is whole again); rl's ES with a
population of 1,024 (seconds per generation, split into the pool's map and the learner,
and the task time per worker); ``broadcast``: the bytes that leave the master per map of
a new 40 MiB vector shared by all its tasks, counted in copies of the vector (one per
host, or none on this host's workers, since issue 32; one per worker before); with ``--backend
slurm`` and ``node``, one node of the ``multi`` cluster lost (its slurmd and every
process in its namespace): seconds until its tasks ran again elsewhere.

``--per-job 1 16`` runs each size once per ``workers_per_job`` value, in this order
(Slurm: 1 is one job per worker, each a fresh interpreter; 16 forks 16 workers from
each warm host job), and adds the memory per worker counted whole: the PSS of every
process a worker needs on its node (the worker, and the ancestors up to and including
``slurmd``'s ``slurmstepd``: the agent and fork server of a host job, shared by its
workers) over the number of workers.

These are measurements on a shared 2-core machine, not tests: every figure moves with
the other users' load; ratios taken in one run are the ones to compare.
"""
import argparse
import logging
import os
import shutil
import signal
import statistics
import subprocess
import sys
import time

import psutil

import fiberrl

log = logging.getLogger("bench_scale")
MIB = 1024 * 1024


def noop(_):
    """Does nothing."""
    return None


def nap(seconds):
    """Sleeps ``seconds``; returns this worker's host name and pid."""
    time.sleep(seconds)
    import socket
    return socket.gethostname(), os.getpid()


def nap_noted(job):
    """``nap(seconds)`` that first notes this attempt (task index, host, start time)
    in a file of its own under ``directory``, a file system the nodes share."""
    seconds, index, directory = job
    import socket
    host = socket.gethostname()
    with open(os.path.join(directory, f"{index}.{host}.{os.getpid()}"), "w") as fh:
        fh.write(repr(time.time()))
    return nap(seconds)


def rerun_delays(directory, node, killed_at):
    """Seconds from the kill until each task that was running on ``node`` started again
    elsewhere (from :func:`nap_noted`'s files)."""
    attempts = {}
    for name in os.listdir(directory):
        index, host, _pid = name.rsplit(".", 2)
        with open(os.path.join(directory, name)) as fh:
            attempts.setdefault(int(index), []).append((float(fh.read()), host))
    delays = []
    for tries in attempts.values():
        tries.sort()
        lost = [t for t, host in tries if host == node and t < killed_at]
        later = [t for t, host in tries if host != node and t > killed_at]
        if lost and later and len(tries) > 1:
            delays.append(later[0] - killed_at)
    return sorted(delays)


def master_usage():
    """(fds, threads, rss MiB) of this process."""
    me = psutil.Process()
    return me.num_fds(), me.num_threads(), me.memory_info().rss / MIB


def wait_alive(pool, n, timeout):
    """Seconds until ``pool.stats().alive == n`` (raises after ``timeout``)."""
    started = time.monotonic()
    while pool.stats().alive < n:
        if time.monotonic() - started > timeout:
            raise TimeoutError(f"only {pool.stats().alive} of {n} workers up after {timeout} s")
        time.sleep(0.02)
    return time.monotonic() - started


def idle_cpu(seconds):
    """CPU seconds per second this process used while sleeping ``seconds``."""
    me = psutil.Process()
    before = me.cpu_times()
    time.sleep(seconds)
    after = me.cpu_times()
    return (after.user + after.system - before.user - before.system) / seconds


def memory_per_worker(pool):
    """Medians of the workers' (RSS, USS, PSS) and the PSS of everything they need on their
    node (themselves, and their ancestors up to slurmstepd or this process) per worker,
    MiB; and how many workers were seen."""
    me = os.getpid()
    seen, rss, uss, pss = set(), [], [], []
    workers = [w.pid for w in pool.workers() if w.pid is not None]
    for pid in workers:
        try:
            proc = psutil.Process(pid)
            info = proc.memory_full_info()
            rss.append(info.rss / MIB)
            uss.append(info.uss / MIB)
            pss.append(info.pss / MIB)
            seen.add(pid)
            for parent in proc.parents():
                if parent.pid in (me, 1):
                    break
                seen.add(parent.pid)
                if parent.name() == "slurmstepd":
                    break
        except (psutil.Error, ValueError):
            continue
    total = 0.0
    for pid in seen:
        try:
            total += psutil.Process(pid).memory_full_info().pss / MIB
        except psutil.Error:
            continue
    if not rss:
        return 0, 0, 0, 0, 0
    med = statistics.median
    return med(rss), med(uss), med(pss), total / len(rss), len(rss)


def sleep_overhead(pool, n, d, per_worker):
    """elapsed/ideal of ``n * per_worker`` sleep(d) tasks, chunksize 1."""
    started = time.perf_counter()
    pool.map(nap, [d] * (n * per_worker), chunksize=1)
    return (time.perf_counter() - started) / (per_worker * d)


def kill_tenth(pool, n, per_worker=4, d=0.5):
    """Map n*per_worker sleep(d) tasks; SIGKILL 10% of the workers at once after half a task.
    Returns (seconds without kills, seconds with, seconds from the kill until n workers
    were connected again, or None if not within the map)."""
    started = time.perf_counter()
    pool.map(nap, [d] * (n * per_worker), chunksize=1)
    calm = time.perf_counter() - started
    victims = [w.pid for w in pool.workers()][: max(1, n // 10)]
    started = time.perf_counter()
    result = pool.map_async(nap, [d] * (n * per_worker), chunksize=1)
    time.sleep(d * 0.5)
    for pid in victims:
        os.kill(pid, signal.SIGKILL)
    killed = time.perf_counter()
    whole, dropped = None, False
    while not result.ready():
        alive = pool.stats().alive
        dropped = dropped or alive < n
        if dropped and whole is None and alive == n:
            whole = time.perf_counter() - killed
        time.sleep(0.01)
    results = result.get(timeout=600)
    faulty = time.perf_counter() - started
    assert len(results) == n * per_worker and all(r is not None for r in results)
    return calm, faulty, whole


def lose_node(pool, n, conf, d=0.5, per_worker=6):
    """Kill one multi-cluster node (slurmd + its namespace's processes) mid-map.
    Returns (node, seconds from the kill until the map was done, total seconds, deaths,
    hosts the results came from, seconds from the kill until each task that was running
    on the lost node started again elsewhere)."""
    import tempfile
    notes = tempfile.mkdtemp(prefix="lose-node-", dir=os.environ.get("FIBERRL_BENCH_SHARED", "/var/tmp"))
    started = time.perf_counter()
    result = pool.map_async(nap_noted, [(d, i, notes) for i in range(n * per_worker)], chunksize=1)
    time.sleep(d * 1.5)
    node = "fbrl-m1"
    state = os.path.dirname(conf)
    pid = open(os.path.join(state, f"slurmd-{node}.pid")).read().strip()
    killed, killed_at = time.perf_counter(), time.time()
    subprocess.run(["bash", "-c", f"kill -9 {pid}; ip netns pids {node} | xargs -r kill -9"],
                   check=True)
    try:
        results = result.get(timeout=900)
        done = time.perf_counter()
    finally:  # the node comes back (slurm-up.sh restarts its slurmd and resumes it)
        root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        restart = subprocess.Popen(["bash", os.path.join(root, "scripts", "slurm-up.sh"), "multi"],
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    restart.wait(300)
    hosts = {host for host, _ in results}
    delays = rerun_delays(notes, node, killed_at)
    shutil.rmtree(notes, ignore_errors=True)
    return node, done - killed, done - started, pool.stats().worker_deaths, hosts, delays


def vector_norm(vector, seed):
    """A task that reads a large shared vector once (ES-shaped)."""
    import numpy
    return float(numpy.dot(vector, vector)) + seed


def broadcast_copies(pool, n, mib=40, per_worker=4, rounds=3):
    """Bytes that leave this process per broadcast of a new ``mib`` MiB vector to
    ``per_worker * n`` tasks, in copies of the vector (median of ``rounds``), and the
    hosts the workers run on."""
    import numpy
    import socket
    copies = []
    for r in range(rounds):
        vector = numpy.full(mib * MIB // 4, float(r + 1), dtype=numpy.float32)
        before = pool.stats().payload_bytes_sent
        results = pool.starmap(vector_norm, [(vector, k) for k in range(per_worker * n)],
                               chunksize=1)
        assert results[0] == float(vector @ vector)
        copies.append((pool.stats().payload_bytes_sent - before) / vector.nbytes)
    hosts = {host for host, _ in pool.map(nap, [0.05] * (2 * n), chunksize=1)}
    return statistics.median(copies), hosts, socket.gethostname() in hosts


def es_generations(pool, n, generations=3):
    """rl's ES, population 1,024 on CartPole (50-step episodes, 2 per task: 512 tasks):
    median seconds per generation, in the pool's map, and of worker time per worker."""
    from rl.algos.es import ES
    es = ES("CartPole-v1", pool=pool, population=1024, episodes_per_task=2,
            max_episode_steps=50, noise_table_size=1_000_000, seed=0)
    es.generation()  # warm-up: noise tables and envs built in every worker
    stats = [es.generation().stats for _ in range(generations)]
    med = lambda key: statistics.median(s[key] for s in stats)  # noqa: E731
    return med("generation_s"), med("pool_eval_s"), med("worker_s") / n


def fork_reference(n, args):
    """The stdlib fork pool's sleep overhead at the same size."""
    import multiprocessing
    out = {}
    with multiprocessing.get_context("fork").Pool(n) as pool:
        pool.map(nap, [0.01] * n, chunksize=1)
        for d, k in ((0.01, 20), (0.1, 5)):
            out[d] = sleep_overhead(pool, n, d, k)
    return out


def run(n, args, per_job=1):
    """Every chosen measure at ``n`` workers; prints one block; returns the seconds from
    ``Pool(n)`` to all workers up (None if they did not come up)."""
    only = set(args.only)
    base_fds, base_threads, base_rss = master_usage()
    cpu_before = psutil.Process().cpu_times()
    started = time.monotonic()
    hints = {"cpu": args.cpu} if args.cpu else {}
    if per_job > 1:
        hints["workers_per_job"] = per_job
    pool = fiberrl.Pool(n, **hints)
    try:
        try:
            up = wait_alive(pool, n, args.start_timeout)
        except TimeoutError as exc:
            print(f"\n== {n} workers, backend {args.backend}, workers_per_job {per_job}: {exc} "
                  f"(load average {os.getloadavg()[0]:.1f})")
            return None
        cpu_after = psutil.Process().cpu_times()
        start_cpu = (cpu_after.user + cpu_after.system - cpu_before.user - cpu_before.system)
        fds, threads, rss = master_usage()
        starting = fiberrl.config.get_config().extra.get("slurm_starting_per_job", "default")
        print(f"\n== {n} workers, backend {args.backend}, workers_per_job {per_job}, "
              f"slurm_starting_per_job {starting} (load average "
              f"{os.getloadavg()[0]:.1f}, 2-core machine shared with others)")
        print(f"  Pool({n}) to all workers up          {up:8.2f} s   "
              f"({(time.monotonic() - started):.2f} s with the constructor)")
        print(f"  master CPU during the start-up       {start_cpu:8.2f} s   "
              f"({start_cpu / n * 1e3:.1f} ms per worker)")
        print(f"  master fds                           {fds:8d}     (+{(fds - base_fds) / n:.2f} per worker)")
        print(f"  master threads                       {threads:8d}     (+{threads - base_threads})")
        print(f"  master RSS                           {rss:8.1f} MiB (+{(rss - base_rss) * 1024 / n:.0f} KiB per worker)")
        wrss, wuss, wpss, whole, seen = memory_per_worker(pool)
        print(f"  worker RSS / USS / PSS (median of {seen}) {wrss:6.1f} / {wuss:.1f} / {wpss:.1f} MiB")
        print(f"  memory per worker, whole (PSS)       {whole:8.1f} MiB (workers, host jobs, "
              f"slurmstepd)")
        if "idle" in only:
            print(f"  master CPU while idle                {idle_cpu(args.idle_s) * 1e3:8.1f} ms/s "
                  f"(over {args.idle_s:.0f} s)")
        if "noop" in only:
            for chunk in (1, None):
                count = 20 * n
                t0 = time.perf_counter()
                pool.map(noop, range(count), chunksize=chunk)
                rate = count / (time.perf_counter() - t0)
                print(f"  no-op map, chunksize {chunk!s:<4}           {rate:8.0f} tasks/s ({count} tasks)")
        if "sleep" in only:
            ref = fork_reference(n, args) if args.fork_reference else {}
            for d, k in ((0.01, 20), (0.1, 5)):
                ours = sleep_overhead(pool, n, d, k)
                theirs = f"   stdlib fork {ref[d]:.2f}x, fiberrl/fork {ours / ref[d]:.2f}" if d in ref else ""
                print(f"  sleep {d * 1e3:3.0f} ms x {k * n}, chunk 1         {ours:8.2f} x ideal{theirs}")
        if "kill" in only:
            calm, faulty, back = kill_tenth(pool, n)
            whole = f"{back:.2f} s after the kill" if back is not None else "only after the map"
            print(f"  SIGKILL {max(1, n // 10)} workers mid-map (sleep 0.5 s x {4 * n}): all results back; "
                  f"{calm:.2f} s calm, {faulty:.2f} s with kills (+{faulty - calm:.2f} s); "
                  f"pool whole again {whole}")
        if "es" in only:
            gen, pool_s, per_worker = es_generations(pool, n)
            print(f"  ES population 1,024 (512 tasks), CartPole 50 steps: {gen:.2f} s/generation; "
                  f"{pool_s:.2f} s in the map, {gen - pool_s:.2f} s in the learner, "
                  f"{per_worker:.3f} s of task time per worker")
        if "broadcast" in only:
            copies, hosts, here = broadcast_copies(pool, n)
            print(f"  broadcast of a new 40 MiB vector to {4 * n} tasks: {copies:.2f} copies "
                  f"left this process (median of 3); workers on {len(hosts)} host(s)"
                  f"{', this one among them' if here else ''}")
        if "node" in only and args.backend == "slurm":
            node, since, total, deaths, hosts, delays = lose_node(pool, n, os.environ["SLURM_CONF"])
            print(f"  node {node} lost mid-map: map done {since:.2f} s after the kill ({total:.2f} s in all), "
                  f"{deaths} worker deaths; results came from {len(hosts)} hosts")
            if delays:
                print(f"  its {len(delays)} running tasks started again elsewhere "
                      f"{delays[0]:.2f}-{delays[-1]:.2f} s after the kill "
                      f"(median {delays[len(delays) // 2]:.2f} s)")
    finally:
        pool.terminate()
        pool.join()
    return up


def main():
    """Parse the command line and run every size."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, nargs="+", default=[64, 256])
    parser.add_argument("--backend", default="local", choices=["local", "slurm", "docker"])
    parser.add_argument("--cpu", type=float, default=None, help="CPUs each worker asks for")
    parser.add_argument("--only", nargs="+", default=["idle", "noop", "sleep", "kill", "node", "es"],
                        choices=["idle", "noop", "sleep", "kill", "node", "es", "broadcast"])
    parser.add_argument("--fork-reference", action="store_true",
                        help="run the stdlib fork pool's sleep test at the same sizes")
    parser.add_argument("--idle-s", type=float, default=5.0)
    parser.add_argument("--start-timeout", type=float, default=900.0)
    parser.add_argument("--per-job", type=int, nargs="+", default=[1],
                        help="workers_per_job values to run each size with (Slurm)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.ERROR)  # the kills' warnings are expected
    sys.stdout.reconfigure(line_buffering=True)
    fiberrl.init(backend=args.backend)
    for per_job in args.per_job:
        ups = [(n, run(n, args, per_job)) for n in args.workers]
        steps = [f"{a} -> {b}: {tb / ta:.2f}x the time for {b / a:.2f}x the workers"
                 for (a, ta), (b, tb) in zip(ups, ups[1:]) if ta and tb]
        if steps:
            print(f"\nstart-up (workers_per_job {per_job}): " + "; ".join(steps))


if __name__ == "__main__":
    main()
