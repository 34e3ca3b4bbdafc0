"""The Slurm backend on a real Slurm cluster (scripts/slurm-up.sh): what only Slurm has.

The bodies shared with the local backend (Process, Queue, Pipe, Pool, Manager) are
the ``any_backend`` tests of the other modules; these are Slurm's own: job arrays,
job steps inside an allocation, resource requests, every terminal state's reason,
faults (scancel mid-map, over --mem, over --time, a node lost) and time-limit
replacement. The two-node tests run their master in a subprocess, because a test
process's hub listens on loopback, which the other nodes' namespaces cannot reach.
"""
import os
import subprocess
import sys
import time

import pytest

import backend_bindings
import fiberrl
import job_streams
import pool_helpers
import slurm_cluster
from fiberrl.backends.base import JobSpec, JobState
from fiberrl.backends.slurm.jobs import parse_duration, status_of
from fiberrl.backends.slurm import submit as slurm_submit

pytestmark = pytest.mark.slurm


@pytest.fixture
def slurm(tmp_path):
    """This test runs on the one-node Slurm cluster; no job outlives it."""
    with backend_bindings.bound("slurm", tmp_path):
        yield


def _sleep_forever():
    time.sleep(3600)


def _hold_memory(megabytes):
    block = bytearray(megabytes << 20)
    for i in range(0, len(block), 4096):
        block[i] = 1
    time.sleep(120)


def _print_and_exit(code):
    print("last words of the job", flush=True)
    sys.exit(code)


# -- requests (pure: what fiberrl hands to sbatch) -------------------------------------
def test_resource_hints_map_onto_sbatch_options():
    spec = JobSpec(command=["python"], cpu=1.5, mem=(1 << 30) + 1, gpu=2,
                   extra={"time_limit": 90, "partition": "gpu", "sbatch_options": "--exclusive -C a100"})
    options = slurm_submit.resource_options(spec, {"slurm_account": "rl", "slurm_qos": "low"})
    assert options == ["--cpus-per-task=2", "--mem=1025M", "--gres=gpu:2", "--time=2",
                       "--partition=gpu", "--account=rl", "--qos=low", "--exclusive", "-C", "a100"]
    assert slurm_submit.slurm_time("1-12:00:00") == "1-12:00:00"
    with pytest.raises(fiberrl.errors.ConfigError, match="time_limit"):
        slurm_submit.slurm_time("soon")
    with pytest.raises(TypeError, match="unknown resource hint"):
        fiberrl.Process(target=print, walltime=5)


def test_array_script_selects_each_task_and_keeps_shared_variables_out():
    specs = [JobSpec(command=["python", "-m", "fiberrl.spawn"], cwd="/work dir",
                     env={"FIBERRL_SECRET": "s3cret", "FIBERRL_TOKEN": f"token-{i}"})
             for i in range(3)]
    shared = slurm_submit.shared_env(specs)
    script = slurm_submit.batch_script(specs, shared)
    assert shared == {"FIBERRL_SECRET": "s3cret"}
    assert "s3cret" not in script
    for i in range(3):
        assert f"  {i})\n    export FIBERRL_TOKEN=token-{i}\n" in script
    assert "cd '/work dir' && exec python -m fiberrl.spawn" in script
    command = slurm_submit.sbatch_command(specs, "/tmp/x.sh", "/logs/%A_%a.out", {})
    assert "--array=0-2" in command and "--no-requeue" in command and "s3cret" not in command


def test_a_job_step_asks_for_its_share_of_the_allocations_memory():
    spec = JobSpec(command=["python", "-m", "fiberrl.spawn"], name="Pool-1-worker-3",
                   extra={"partition": "big", "time_limit": 60})
    mem = slurm_submit.allocation_mem_per_cpu({"SLURM_MEM_PER_NODE": "8192",
                                               "SLURM_CPUS_ON_NODE": "16"})
    command = slurm_submit.srun_command(spec, "77", "/logs/step.out", mem)
    assert command[:4] == ["srun", "--jobid=77", "--ntasks=1", "--nodes=1"]
    assert "--exact" in command and "--cpus-per-task=1" in command
    assert "--mem-per-cpu=512M" in command
    assert not any(o.startswith(("--partition", "--time")) for o in command)  # the allocation's
    assert command[-3:] == ["python", "-m", "fiberrl.spawn"]
    spec.mem = 1 << 30
    assert "--mem=1024M" in slurm_submit.srun_command(spec, "77", "/l", mem)


@pytest.mark.parametrize("record,state,code,reason", [
    ({"State": "COMPLETED", "exit_code": "0"}, JobState.SUCCEEDED, 0, ""),
    ({"State": "FAILED", "exit_code": str(3 << 8), "Reason": "NonZeroExitCode"},
     JobState.FAILED, 3, "exit code 3"),
    ({"State": "FAILED", "exit_code": "11", "Reason": "JobLaunchFailure"},
     JobState.FAILED, -11, "SIGSEGV"),
    ({"State": "CANCELLED", "exit_code": "15"}, JobState.CANCELLED, -15, "CANCELLED"),
    ({"State": "TIMEOUT", "exit_code": "0"}, JobState.FAILED, -15, "TIMEOUT"),
    ({"State": "NODE_FAIL", "exit_code": "0", "NodeList": "n7"}, JobState.FAILED, -9,
     "NODE_FAIL: node n7"),
    ({"State": "OUT_OF_MEMORY", "exit_code": "0"}, JobState.FAILED, -9, "out of memory"),
    ({"State": "PREEMPTED", "exit_code": "0"}, JobState.FAILED, -15, "PREEMPTED"),
    ({"State": "PENDING", "Reason": "Resources"}, JobState.PENDING, None, "Resources"),
])
def test_every_terminal_state_has_an_exit_code_and_a_reason(record, state, code, reason):
    status = status_of({"Reason": "None", **record})
    assert (status.state, status.exit_code) == (state, code)
    assert reason in status.reason


def test_durations():
    assert parse_duration("1-02:03:04") == 93784 and parse_duration("4:59") == 299
    assert parse_duration("UNLIMITED") is None


# -- on the cluster ---------------------------------------------------------------------
def test_a_pool_is_one_job_array(slurm, make_pool):
    pool = make_pool(4)
    assert pool.map(pool_helpers.square, range(20)) == [i * i for i in range(20)]
    ids = [w.job_id for w in pool.workers()]
    assert len({i.split("_")[0] for i in ids}) == 1, ids
    assert sorted(int(i.split("_")[1]) for i in ids) == [0, 1, 2, 3]


def test_failed_job_reason_and_log(slurm):
    proc = fiberrl.Process(target=_print_and_exit, args=(3,))
    proc.start()
    proc.join(60)
    assert proc.exitcode == 3
    assert "exit code 3" in proc.exit_reason
    assert "last words of the job" in proc.job_logs()


@pytest.mark.parametrize("fail", [False, True])
def test_a_jobs_stdout_goes_to_this_process_stdout_and_its_stderr_to_stderr(slurm, capfd, fail):
    """As a local child's streams do: ``script > out.log 2> err.log`` gets each job's
    errors, its traceback too, in err.log."""
    proc = fiberrl.Process(target=job_streams.print_to_both_streams, args=(fail,))
    proc.start()
    proc.join(90)
    assert proc.exitcode == (1 if fail else 0)
    texts = job_streams.assert_streams_apart(capfd, fail)
    logs = proc.job_logs()
    assert all(text in logs for text in texts), logs


def _print_to_stderr_then_sleep():
    print("written before the cancel", file=sys.stderr, flush=True)
    time.sleep(3600)


def test_slurms_cancel_notice_is_not_forwarded_but_the_jobs_stderr_is(slurm, capfd):
    """slurmstepd writes "*** JOB ... CANCELLED AT ..." into a cancelled job's stderr
    file: the job's end is reported as its exit code and reason, not printed."""
    proc = fiberrl.Process(target=_print_to_stderr_then_sleep)
    proc.start()
    err, deadline = "", time.monotonic() + 60
    while "written before the cancel" not in err and time.monotonic() < deadline:
        err += capfd.readouterr().err
        time.sleep(0.05)
    assert "written before the cancel" in err, err
    errors_file = proc._popen.job.data.errors
    proc.terminate()
    proc.join(90)
    assert proc.exitcode is not None and proc.exitcode < 0, proc.exit_reason
    assert pool_helpers.wait_until(lambda: "CANCELLED AT" in open(errors_file).read(), 30)
    time.sleep(1.0)   # five looks of the follower
    captured = capfd.readouterr()
    assert "CANCELLED AT" not in captured.err + captured.out + err, captured


def _report_pid(queue):
    queue.put(os.getpid())


def test_pid_is_known_once_start_returns(slurm):
    """As with the stdlib (concurrent.futures keys its workers by pid): the first read
    waits for the job to connect back, and gives its pid on its node."""
    queue = fiberrl.SimpleQueue()
    procs = [fiberrl.Process(target=_report_pid, args=(queue,)) for _ in range(3)]
    for proc in procs:
        proc.start()
    pids = [proc.pid for proc in procs]
    assert all(isinstance(pid, int) and pid > 0 for pid in pids), pids
    assert sorted(queue.get() for _ in procs) == sorted(pids)
    for proc in procs:
        proc.join(60)
    never_started = fiberrl.Process(target=print)
    assert never_started.pid is None


def test_impossible_request_fails_at_submit_with_slurms_message(slurm, make_pool):
    proc = fiberrl.Process(target=print, cpu=512)
    with pytest.raises(fiberrl.errors.BackendError,
                       match=r"--cpus-per-task=512\): sbatch: error: Batch job submission failed"):
        proc.start()
    assert proc.exitcode is None
    pool = make_pool(2, mem="900G", max_task_retries=1)
    with pytest.raises(fiberrl.JobFailedError, match="(?s)--mem=921600M.*Batch job submission failed"):
        pool.apply(pool_helpers.square, (3,))


def test_job_over_its_memory_is_reported_out_of_memory(slurm):
    proc = fiberrl.Process(target=_hold_memory, args=(400,), mem="100M")
    proc.start()
    proc.join(90)
    assert proc.exitcode is not None and proc.exitcode < 0, proc.exit_reason
    assert "out of memory" in proc.exit_reason


def test_job_over_its_time_limit_times_out(slurm):
    proc = fiberrl.Process(target=_sleep_forever, time_limit=60)
    proc.start()
    proc.join(200)
    assert proc.exitcode is not None and proc.exitcode < 0
    assert proc.exit_reason.startswith("TIMEOUT")


def test_scancel_of_a_busy_worker_mid_map_loses_nothing(slurm, make_pool):
    pool = make_pool(3)
    result = pool.map_async(pool_helpers.sleep_then_square, [(0.3, i) for i in range(40)], 1)
    assert pool_helpers.wait_until(lambda: pool.stats().pending == 3, 60), pool.stats()
    victim = pool.workers()[0].job_id
    subprocess.run(["scancel", victim], check=True, timeout=30)
    assert result.get(timeout=180) == [i * i for i in range(40)]
    assert pool.stats().worker_deaths >= 1


def test_stopping_a_job_slurm_no_longer_knows_is_no_warning(slurm, caplog):
    """A pool stops its replacement workers when it ends; Slurm may have forgotten one
    (a whole pending array cancelled lists only the array; an ended job ages out).
    scancel says "Invalid job id": the job is gone, which a normal exit does not warn of."""
    import logging
    from fiberrl.backends import default_backend
    from fiberrl.backends.base import Job
    from fiberrl.backends.slurm import _JobData
    job = Job(id="99999999_1", backend="slurm", spec=JobSpec(command=["python"]),
              data=_JobData(log=os.devnull))
    with caplog.at_level(logging.DEBUG, logger="fiberrl"):
        default_backend().terminate(job)
        default_backend().terminate(job, force=True)
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []
    # (scancel without --signal says nothing of an unknown array task; with it, it fails)
    assert any("99999999_1 is already gone" in r.getMessage() for r in caplog.records)


def test_workers_near_their_time_limit_are_replaced(slurm, make_pool):
    # 1-minute jobs, replaced when 30 s are left (the margin is capped at half the
    # limit); the map needs about 40 s of work, so both first workers are replaced
    fiberrl.init(backend="slurm", time_limit_margin=45,
                 extra=fiberrl.config.get_config().extra)
    pool = make_pool(2, time_limit=60)
    squares = pool.map(pool_helpers.sleep_then_square, [(1.0, i) for i in range(80)], 1)
    assert squares == [i * i for i in range(80)]
    stats = pool.stats()
    assert stats.time_limit_replacements >= 2, stats
    assert stats.worker_deaths == 0, stats


ALLOCATION_MASTER = """
import os, sys
import fiberrl

def where(_):
    return os.environ.get("SLURM_JOB_ID"), os.environ.get("SLURM_STEP_ID")

def speak(i):
    import time
    print("STEP OUT", i, flush=True)
    print("STEP ERR", i, file=sys.stderr, flush=True)
    time.sleep(1.0)   # forwarded while the step runs

if __name__ == "__main__":
    with fiberrl.Pool(3) as pool:
        seen = set(pool.map(where, range(30), 1))
        ids = [w.job_id for w in pool.workers()]
        pool.map(speak, range(3), 1)
    print("ALLOCATION", os.environ["SLURM_JOB_ID"])
    print("SEEN", sorted(seen))
    print("IDS", ids)
"""


def test_inside_an_allocation_the_backend_is_slurm_and_workers_are_job_steps(slurm, tmp_path):
    master = tmp_path / "master.py"
    master.write_text(ALLOCATION_MASTER)
    out, err = tmp_path / "master.out", tmp_path / "master.err"
    env = {**os.environ, "PYTHONPATH": os.getcwd()}  # no FIBERRL_BACKEND: detected
    env.pop("FIBERRL_BACKEND", None)
    job = subprocess.run(["sbatch", "--parsable", "--wait", "-c", "4", "--mem=2G", f"--output={out}",
                          f"--error={err}", "--wrap", f"{sys.executable} {master}"],
                         env=env, capture_output=True, text=True, timeout=240)
    text = out.read_text()
    assert job.returncode == 0, job.stderr + text
    allocation = text.split("ALLOCATION ")[1].split()[0]
    seen = eval(text.split("SEEN ")[1].splitlines()[0])
    assert {job_id for job_id, _ in seen} == {allocation}  # no new job: steps of the master's
    assert all(step not in (None, "batch") for _, step in seen)
    assert eval(text.split("IDS ")[1].splitlines()[0])[0].startswith(f"{allocation}:")
    errors = err.read_text()   # each step's stderr reaches the master's stderr
    assert all(f"STEP OUT {i}" in text and f"STEP ERR {i}" in errors for i in range(3)), \
        (text, errors)
    assert "STEP ERR" not in text and "STEP OUT" not in errors, (text, errors)


# -- two nodes ----------------------------------------------------------------------------
TWO_NODE_MASTER = """
import socket, subprocess, sys, time
import fiberrl

def host_after(delay):
    time.sleep(delay)
    return socket.gethostname()

def host_pid_after(delay):
    import os
    time.sleep(delay)
    return socket.gethostname(), os.getpid()

if __name__ == "__main__":
    fiberrl.init(backend="slurm", heartbeat_timeout=5)
    workers, cpu = (16, 1) if sys.argv[1] == "kill-tenth" else (4, 4)
    with fiberrl.Pool(workers, cpu=cpu) as pool:  # 8-CPU nodes: 8 or 2 workers on each
        hosts = set(pool.map(host_after, [0.2] * 40, 1))
        print("HOSTS", sorted(hosts), flush=True)
        if sys.argv[1] == "kill-tenth":  # SIGKILL 2 of the 16 workers at once mid-map
            import os, signal
            pids = sorted({pid for _, pid in pool.map(host_pid_after, [0.3] * 48, 1)})
            result = pool.map_async(host_pid_after, [0.5] * 64, 1)
            time.sleep(1.0)
            killed = time.monotonic()
            for pid in pids[:2]:
                os.kill(pid, signal.SIGKILL)
            done = result.get(timeout=150)
            print("ALL", len(done), "AFTER", round(time.monotonic() - killed, 2), flush=True)
            print("DEATHS", pool.stats().worker_deaths, flush=True)
        if sys.argv[1] == "kill-node":
            result = pool.map_async(host_after, [0.5] * 60, 1)
            time.sleep(3)
            subprocess.run(["bash", "-c", sys.argv[2]], check=True)
            late = result.get(timeout=150)
            print("LATE", sorted(set(late[-10:])), flush=True)
            print("DEATHS", pool.stats().worker_deaths, flush=True)
"""


def _two_node_master(tmp_path, *args):
    conf = slurm_cluster.up("two-node")
    master = tmp_path / "master.py"
    master.write_text(TWO_NODE_MASTER)
    env = {**os.environ, "SLURM_CONF": conf, "FIBERRL_EXTRA": f'{{"slurm_log_dir": "{tmp_path}"}}'}
    env.pop("FIBERRL_BACKEND", None)
    try:
        done = slurm_cluster.run_master([sys.executable, str(master), *args], env)
    finally:
        slurm_cluster.assert_no_live_jobs(conf, grace=30)
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    return done.stdout


def test_a_pool_spans_two_nodes(tmp_path):
    out = _two_node_master(tmp_path, "spread")
    assert "HOSTS ['fbrl-n1', 'fbrl-n2']" in out, out


@pytest.mark.slow
def test_two_of_sixteen_workers_on_two_nodes_killed_at_once(tmp_path):
    """Issue 23's fault test at suite size: 12% of the workers SIGKILLed at once mid-map;
    every result comes back (bench/bench_scale.py runs it at 64-256 workers)."""
    out = _two_node_master(tmp_path, "kill-tenth")
    assert "HOSTS ['fbrl-n1', 'fbrl-n2']" in out, out
    assert "ALL 64 " in out, out
    assert "DEATHS 2" in out, out


def test_losing_a_node_the_pool_finishes_on_the_other(tmp_path):
    kill_n1 = ("kill -9 $(cat /var/tmp/fiberrl-slurm/two-node/slurmd-fbrl-n1.pid) ; "
               "ip netns pids fbrl-n1 | xargs -r kill -9")
    try:
        out = _two_node_master(tmp_path, "kill-node", kill_n1)
    finally:
        slurm_cluster.up("two-node")  # brings fbrl-n1's slurmd back
    assert "HOSTS ['fbrl-n1', 'fbrl-n2']" in out, out
    assert "LATE ['fbrl-n2']" in out, out
    assert "DEATHS 0" not in out, out
