"""bench_pool.py's ES-shaped measures: ``es_loop`` (the same 100k-float32 vector in
all 64 tasks of an iteration) and ``es_broadcast`` (a 40 MB vector new every
iteration, issue 32), each against its ideal on 2 workers."""
import statistics
import time

import numpy as np

from pool_bench_kit import WAIT_S, open_pool

ES_DIM, ES_POP, ES_SIGMA, ES_LR, ES_TASK_S = 100_000, 64, 0.02, 0.01, 0.002


def es_noise(seed):
    """The perturbation of ES member ``seed`` (same in every process)."""
    return np.random.default_rng(seed).standard_normal(ES_DIM, dtype=np.float32)


def es_eval(params, seed, reps):
    """Fitness of ``params + sigma * noise(seed)``; ``reps`` extra dot products set its cost."""
    noise = es_noise(seed)
    theta = params + ES_SIGMA * noise
    diff = theta - 1.0
    score = -float(diff @ diff)
    extra = 0.0
    for _ in range(reps):
        extra += float(theta @ noise)
    return score + 1e-12 * extra


def es_update(params, seeds, scores):
    """One ES step from the members' scores (noise regenerated from the seeds)."""
    weights = (scores - scores.mean()) / (scores.std() + 1e-8)
    grad = np.zeros_like(params)
    for seed, weight in zip(seeds, weights):
        grad += np.float32(weight) * es_noise(seed)
    return params + np.float32(ES_LR / (len(seeds) * ES_SIGMA)) * grad


def serial_times(evaluate, params, reps, samples):
    """Seconds each of ``samples`` serial calls ``evaluate(params, seed, reps)`` took."""
    timings = []
    for seed in range(samples):
        started = time.perf_counter()
        evaluate(params, seed, reps)
        timings.append(time.perf_counter() - started)
    return timings


def calibrate(evaluate, params, target_s, samples, probe_reps):
    """The ``reps`` that make ``evaluate(params, seed, reps)`` take ``target_s`` serially
    here, from the minimum of ``samples`` timings (the cost without the noise of a
    shared machine) at 0 and ``probe_reps``; returns (reps, base, min, median) seconds
    at those reps (base: at 0)."""
    def per_task(reps, stat=min):
        return stat(serial_times(evaluate, params, reps, samples))

    base = per_task(0)
    per_rep = max((per_task(probe_reps) - base) / probe_reps, 1e-7)
    reps = max(0, round((target_s - base) / per_rep))
    return reps, base, per_task(reps), per_task(reps, statistics.median)


def es_setup(quick):
    """Calibrate es_eval's ``reps`` to ~2 ms serially here; returns (kwargs, note)."""
    reps, _, best, median = calibrate(es_eval, np.zeros(ES_DIM, np.float32), ES_TASK_S,
                                      samples=30, probe_reps=200)
    note = (f"es task measured serially: min {best * 1e3:.2f} ms, "
            f"median {median * 1e3:.2f} ms (reps={reps})")
    return {"reps": reps, "task_s": median}, note


def m_es_loop(lib, quick, reps, task_s):
    """ES loop: 64 (params, seed) evaluations per iteration, 2 workers (iterations/s)."""
    iterations = 5 if quick else 10
    params = np.zeros(ES_DIM, np.float32)
    mapping = 0.0
    with open_pool(lib, 2) as pool:
        started = time.perf_counter()
        for it in range(iterations):
            seeds = [it * ES_POP + k for k in range(ES_POP)]
            tasks = [(params, seed, reps) for seed in seeds]
            map_started = time.perf_counter()
            scores = pool.starmap_async(es_eval, tasks).get(timeout=WAIT_S)
            mapping += time.perf_counter() - map_started
            params = es_update(params, seeds, np.asarray(scores, dtype=np.float64))
        elapsed = time.perf_counter() - started
    update_s = (elapsed - mapping) / iterations
    ideal_map_s = ES_POP * task_s / 2  # the serial median task time, spread over 2 workers
    return {"its": iterations / elapsed, "maps": iterations / mapping, "update": update_s * 1e3,
            "ideal": 1 / (update_s + ideal_map_s), "map_ideal": ideal_map_s / (mapping / iterations)}


BIG_DIM, BIG_TASK_S = 10_000_000, 0.020   # issue 32: a 40 MB vector, 20 ms tasks


_WORK = np.ones(100_000, np.float32)


def es_big_eval(params, seed, reps):
    """An ES member's fitness that reads the whole (large) ``params`` once, then ``reps``
    dot products of a 100k-float array of its own set its cost (whatever ``params``'s
    size: the control below passes a small one)."""
    score = float(params @ params) * 1e-9 + seed
    for _ in range(reps):
        score += float(_WORK @ _WORK) * 1e-12
    return score


def es_big_setup(quick):
    """Calibrate es_big_eval's ``reps`` to ~20 ms serially here; returns (kwargs, note)."""
    reps, base, best, median = calibrate(es_big_eval, np.ones(BIG_DIM, np.float32),
                                         BIG_TASK_S, samples=9, probe_reps=400)
    return {"reps": reps, "task_s": median}, (
        f"es_broadcast task measured serially: min {best * 1e3:.1f} ms, median "
        f"{median * 1e3:.1f} ms (reps={reps}; reading the vector alone {base * 1e3:.1f} ms)")


def m_es_broadcast(lib, quick, reps, task_s):
    """ES loop with a 40 MB vector new every iteration: 64 tasks of ~20 ms, 2 workers
    (seconds per iteration, and its ratio to the ideal: the caller's update plus the
    tasks' serial time spread over the workers). The serial task time is measured again
    just before each loop, so that the ideal follows the machine's load."""
    iterations = 3 if quick else 5
    params = np.ones(BIG_DIM, np.float32)
    task_s = statistics.median(serial_times(es_big_eval, params, reps, samples=5))
    mapping = 0.0
    with open_pool(lib, 2) as pool:
        started = time.perf_counter()
        for it in range(iterations):
            tasks = [(params, it * ES_POP + k, reps) for k in range(ES_POP)]
            map_started = time.perf_counter()
            scores = pool.starmap_async(es_big_eval, tasks).get(timeout=WAIT_S)
            mapping += time.perf_counter() - map_started
            params = params * np.float32(0.999) + np.float32(1e-6 * statistics.fmean(scores))
        elapsed = time.perf_counter() - started
        # the control: the same maps with a vector of 1,000 floats (nothing to broadcast),
        # right after, on the same pool: how close to the ideal this machine lets any map
        # come now (the other users' load takes its share of the two workers' cores)
        small = np.ones(1000, np.float32)
        control = time.perf_counter()
        for it in range(iterations):
            pool.starmap_async(es_big_eval, [(small, it * ES_POP + k, reps)
                                             for k in range(ES_POP)]).get(timeout=WAIT_S)
        control = (time.perf_counter() - control) / iterations
    per_it = elapsed / iterations
    update_s = (elapsed - mapping) / iterations
    ideal = update_s + ES_POP * task_s / 2
    return {"s_it": per_it, "map_s": mapping / iterations, "update": update_s * 1e3,
            "task": task_s * 1e3, "ideal": ideal, "x_ideal": per_it / ideal,
            "control": control, "x_control": (mapping / iterations) / control}
