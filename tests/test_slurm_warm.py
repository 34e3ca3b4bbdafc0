"""Pool workers forked from warm host jobs on Slurm (``workers_per_job``, issue 23 item 3).

The resilience contract of a pool of plain Slurm jobs holds: a worker's death re-runs
its tasks and leaves its siblings (forked by the same host job) running; ``kill()`` and
``terminate()`` of one worker reach that worker alone; a host job cancelled, or its
node lost, re-runs all of its workers' tasks. On the real two-node cluster, with the
master in a subprocess (see slurm_warm_master.py).
"""
import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

import fiberrl
import slurm_cluster
from fiberrl.backends.base import JobSpec, JobState, JobStatus
from fiberrl.backends.slurm import warm
from fiberrl.errors import ConfigError

pytestmark = pytest.mark.slurm
MASTER = Path(__file__).with_name("slurm_warm_master.py")


# -- the option, checked where it is given ------------------------------------------------
@pytest.mark.parametrize("value,error", [(0, ValueError), (-2, ValueError), ("4", TypeError),
                                         (2.5, TypeError), (True, TypeError)])
def test_a_bad_workers_per_job_fails_at_pool_with_the_stdlib_type(value, error):
    with pytest.raises(error, match="workers_per_job"):
        fiberrl.Pool(2, workers_per_job=value)


@pytest.mark.parametrize("key,value", [("slurm_workers_per_job", "many"),
                                       ("slurm_starting_per_job", 0)])
def test_a_bad_setting_fails_when_the_slurm_backend_is_made(monkeypatch, tmp_path, key, value):
    monkeypatch.setattr(fiberrl.backends.slurm.shutil, "which", lambda name: "/usr/bin/" + name)
    fiberrl.init(backend="slurm", extra={key: value, "slurm_log_dir": str(tmp_path)})
    try:
        with pytest.raises(ConfigError, match=key):
            fiberrl.backends.slurm.SlurmBackend()
    finally:
        fiberrl.config.reset()
    assert issubclass(ConfigError, ValueError)


# -- requests (pure) ----------------------------------------------------------------------
def test_host_jobs_ask_for_the_sum_of_their_workers_and_hold_no_shared_variable(tmp_path):
    specs = [JobSpec(command=["/py", "-m", "fiberrl.spawn"], name=f"w{i}", cpu=2, mem=1 << 30,
                     cwd="/work", env={"SECRET": "s", "TOKEN": f"t{i}"},
                     extra={"workers_per_job": 4, "time_limit": 60}) for i in range(6)]
    groups = warm.groups(specs, 4)
    assert [len(g) for g in groups] == [4, 2]
    host = warm.host_spec(groups[0], str(tmp_path / "t0"), {"SECRET": "s"}, "/py")
    assert host.command == ["/py", "-m", warm.AGENT_MODULE, str(tmp_path / "t0")]
    assert (host.cpu, host.mem, host.env) == (8, 4 << 30, {"SECRET": "s"})
    assert host.extra == {"time_limit": 60}
    warm.write_request(str(tmp_path / "t0"), groups[0], {"SECRET": "s"},
                       warm.starting_per_job({}, host))
    path = tmp_path / "t0" / warm.REQUEST_FILE
    assert oct(path.stat().st_mode & 0o777) == "0o600"
    request = json.loads(path.read_text())
    assert [j["env"] for j in request["jobs"]] == [{"TOKEN": f"t{i}"} for i in range(4)]
    assert request["max_starting"] == 8   # one per CPU of the host job by default
    assert warm.starting_per_job({}, host, hosts=16) == 4   # 64 over all host jobs at most
    assert warm.starting_per_job({"slurm_starting_per_job": 32}, host, hosts=16) == 32
    assert "SECRET" not in path.read_text()


def test_a_forked_workers_status_follows_its_exit_file_then_its_host_job(tmp_path):
    slot = warm.WarmSlot(host="7_0", task_dir=str(tmp_path), index=3)
    assert slot.status(None).state is JobState.PENDING
    assert slot.status(JobStatus(JobState.RUNNING)).state is JobState.RUNNING
    cancelled = JobStatus(JobState.CANCELLED, -15, "CANCELLED (scancel, SIGTERM)")
    lost = slot.status(cancelled)
    assert (lost.state, lost.exit_code) == (JobState.FAILED, -15)
    assert "host job 7_0 ended: CANCELLED" in lost.reason
    (tmp_path / "w3.exit").write_text("-9\n")
    killed = slot.status(JobStatus(JobState.RUNNING), killed=True)
    assert (killed.state, killed.exit_code) == (JobState.FAILED, -9)
    assert "SIGKILL" in killed.reason
    slot.request_signal(15)
    slot.request_signal(15)
    assert warm.kill_requests(os.listdir(tmp_path)) == [(3, 15)]


# -- on the two-node cluster ------------------------------------------------------------------
def _master(tmp_path, *args, extra=None):
    conf = slurm_cluster.up("two-node")
    env = {**os.environ, "SLURM_CONF": conf,
           "FIBERRL_EXTRA": json.dumps({"slurm_log_dir": str(tmp_path), **(extra or {})}),
           "PYTHONPATH": os.pathsep.join([str(MASTER.parent.parent), os.environ.get("PYTHONPATH", "")])}
    env.pop("FIBERRL_BACKEND", None)
    try:
        done = slurm_cluster.run_master([sys.executable, str(MASTER), *args], env,
                                        cwd=str(MASTER.parent), dumps_on_sigusr1=True)
    finally:
        slurm_cluster.assert_no_live_jobs(conf, grace=30)
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    return done.stdout


def _line(out, key):
    return next(line.split(" ", 1)[1] for line in out.splitlines() if line.startswith(key + " "))


def test_a_pool_on_warm_host_jobs_maps_with_forked_workers_on_both_nodes(tmp_path):
    out = _master(tmp_path, "map", extra={"slurm_starting_per_job": 1})  # one at a time
    assert _line(out, "HOSTS") == "['fbrl-n1', 'fbrl-n2']", out
    ids = eval(_line(out, "IDS"))
    hosts = {i.rsplit(".", 1)[0] for i in ids}
    assert len(hosts) == 2 and sorted(i.rsplit(".", 1)[1] for i in ids) == sorted("0123" * 2)
    assert _line(out, "FORKED") == "True", out
    assert _line(out, "DEATHS") == "0" and _line(out, "MAP_AFTER") == "True", out


def test_a_sigkilled_warm_worker_reruns_its_tasks_and_its_siblings_live(tmp_path):
    out = _master(tmp_path, "sigkill")
    assert _line(out, "RESULTS_OK") == "True", out
    assert _line(out, "SIBLINGS_ALIVE") == "True", out
    assert _line(out, "DEATHS") == "1" and _line(out, "MAP_AFTER") == "True", out


def test_kill_and_terminate_of_one_warm_worker_reach_it_alone(tmp_path):
    out = _master(tmp_path, "kill")
    assert _line(out, "KILLED").startswith("-9 killed by signal 9 (SIGKILL)"), out
    assert _line(out, "STOPPED").startswith("-15 killed by signal 15 (SIGTERM)"), out
    assert _line(out, "RESULTS_OK") == "True", out
    assert _line(out, "SIBLINGS_ALIVE") == "True", out
    assert _line(out, "MAP_AFTER") == "True", out


def test_the_cli_lists_shows_logs_of_and_cancels_one_forked_worker(tmp_path):
    out = _master(tmp_path, "cli")
    assert _line(out, "PS_LISTS") == "True", out
    assert _line(out, "LOGS_SHOW") == "True", out
    assert _line(out, "UNKNOWN_INDEX_EXIT") == "2", out
    assert _line(out, "CANCELLED") == "True", out
    assert _line(out, "RESULTS_OK") == "True", out
    assert _line(out, "ONLY_TARGET_GONE") == "True", out


@pytest.mark.slow
def test_a_cancelled_host_job_reruns_all_its_workers_tasks(tmp_path):
    out = _master(tmp_path, "scancel")
    assert _line(out, "RESULTS_OK") == "True", out
    assert _line(out, "DEATHS") == "4", out   # the host job's four workers, no other
    assert _line(out, "MAP_AFTER") == "True", out


@pytest.mark.slow
def test_losing_a_node_of_warm_host_jobs_the_map_finishes_on_the_other(tmp_path):
    kill_n1 = ("kill -9 $(cat /var/tmp/fiberrl-slurm/two-node/slurmd-fbrl-n1.pid) ; "
               "ip netns pids fbrl-n1 | xargs -r kill -9")
    try:
        out = _master(tmp_path, "node", kill_n1)
    finally:
        slurm_cluster.up("two-node")  # brings fbrl-n1's slurmd back
    assert _line(out, "LATE") == "['fbrl-n2']", out
    assert _line(out, "DEATHS") == "4", out
    assert _line(out, "MAP_AFTER") == "True", out


# -- the agent alone (no Slurm: it runs any command it is given) -------------------------------
JOB = """
import os, sys, time
out, index = os.environ["OUT"], os.environ["IDX"]
open(os.path.join(out, index + ".start"), "w").write(repr(time.monotonic()))
print("job out", index, flush=True)
print("job err", index, file=sys.stderr, flush=True)
time.sleep(0.3)
open(os.path.join(out, index + ".up"), "w").write(repr(time.monotonic()))
os.write(int(os.environ["FIBERRL_STARTED_FD"]), b"1")
time.sleep(0.3)
sys.exit(int(index))
"""


def test_the_agent_paces_its_starts_forwards_kills_and_records_exits(tmp_path):
    task_dir, out = tmp_path / "t0", tmp_path / "out"
    out.mkdir()
    specs = [JobSpec(command=[sys.executable, "-c", JOB], env={"IDX": str(i), "OUT": str(out)},
                     cwd=str(tmp_path)) for i in range(6)]
    warm.write_request(str(task_dir), specs, {}, max_starting=2)
    warm.WarmSlot(host="-", task_dir=str(task_dir), index=5).request_signal(15)  # never starts
    env = {**os.environ, "PYTHONPATH": str(MASTER.parent.parent)}
    done = subprocess.run([sys.executable, "-m", warm.AGENT_MODULE, str(task_dir)], env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    codes = [warm.WarmSlot(host="-", task_dir=str(task_dir), index=i).exit_code() for i in range(6)]
    assert codes == [0, 1, 2, 3, 4, -15]
    assert not (out / "5.start").exists()
    spans = [(float((out / f"{i}.start").read_text()), float((out / f"{i}.up").read_text()))
             for i in range(5)]
    for start, _ in spans:   # never more than 2 started and not yet up
        assert sum(1 for s, up in spans if s <= start < up) <= 2, spans
    assert "exec'ing them" in done.stderr   # not fiberrl jobs: no fork server for them
    for i in range(5):   # each job's stdout and stderr in files of their own
        assert (task_dir / f"w{i}.out").read_text() == f"job out {i}\n"
        assert (task_dir / f"w{i}.err").read_text() == f"job err {i}\n"


ALLOCATION_MASTER = """
import os, signal, sys, time
import psutil
import fiberrl

def where(delay):
    time.sleep(delay)
    return os.environ.get("SLURM_JOB_ID"), os.environ.get("SLURM_STEP_ID"), os.getpid()

def square_after(pair):
    time.sleep(pair[0])
    return pair[1] * pair[1]

def forked(pid):
    parent = psutil.Process(pid).parent()
    return parent is not None and "fiberrl.backends.local" in " ".join(parent.cmdline())

def speak(i):
    print("WORKER OUT", i, flush=True)
    print("WORKER ERR", i, file=sys.stderr, flush=True)
    return i

if __name__ == "__main__":
    with fiberrl.Pool(4, workers_per_job=2) as pool:
        seen = set()
        while len({pid for _, _, pid in seen}) < 4:
            seen |= set(pool.map(where, [0.2] * 16, 1))
        print("ALLOCATION", os.environ["SLURM_JOB_ID"], flush=True)
        print("SEEN", sorted(seen), flush=True)
        print("IDS", sorted(w.job_id for w in pool.workers()), flush=True)
        pids = sorted({pid for _, _, pid in seen})
        print("FORKED", all(forked(pid) for pid in pids), flush=True)
        result = pool.map_async(square_after, [(0.3, i) for i in range(40)], 1)
        time.sleep(1.0)
        os.kill(pids[0], signal.SIGKILL)
        print("RESULTS_OK", result.get(timeout=120) == [i * i for i in range(40)], flush=True)
        print("SIBLINGS_ALIVE", all(psutil.pid_exists(p) for p in pids[1:]), flush=True)
        print("DEATHS", pool.stats().worker_deaths, flush=True)
        pool.map(speak, range(4), 1)
        time.sleep(1.0)   # forwarded while the workers run
"""


def test_inside_an_allocation_workers_are_forked_by_host_job_steps(tmp_path):
    conf = slurm_cluster.up("single")
    master = tmp_path / "master.py"
    master.write_text(ALLOCATION_MASTER)
    out, err = tmp_path / "master.out", tmp_path / "master.err"
    env = {**os.environ, "SLURM_CONF": conf,
           "PYTHONPATH": os.pathsep.join([str(MASTER.parent.parent), os.environ.get("PYTHONPATH", "")])}
    env.pop("FIBERRL_BACKEND", None)   # detected: inside an allocation
    try:
        job = subprocess.run(["sbatch", "--parsable", "--wait", "-c", "4", "--mem=2G",
                              f"--output={out}", f"--error={err}",
                              "--wrap", f"{sys.executable} {master}"],
                             env=env, capture_output=True, text=True, timeout=300)
    finally:
        slurm_cluster.assert_no_live_jobs(conf, grace=30)
    text = out.read_text()
    assert job.returncode == 0, job.stderr + text
    allocation = _line(text, "ALLOCATION")
    seen = eval(_line(text, "SEEN"))
    assert {job_id for job_id, _, _ in seen} == {allocation}, text  # no new Slurm job
    steps = {step for _, step, _ in seen}
    assert len(steps) == 2 and not steps & {None, "batch"}, text   # two host steps
    ids = eval(_line(text, "IDS"))
    assert all(i.startswith(f"{allocation}:") for i in ids), text
    assert sorted(i.rsplit(".", 1)[1] for i in ids) == ["0", "0", "1", "1"], text
    assert _line(text, "FORKED") == "True", text
    assert _line(text, "RESULTS_OK") == "True" and _line(text, "SIBLINGS_ALIVE") == "True", text
    assert _line(text, "DEATHS") == "1", text
    errors = err.read_text()   # forked workers' stderr reaches the master's stderr
    assert all(f"WORKER OUT {i}" in text and f"WORKER ERR {i}" in errors for i in range(4)), \
        (text, errors)
    assert "WORKER ERR" not in text and "WORKER OUT" not in errors, (text, errors)


def test_backends_share_one_log_follower_thread(monkeypatch, tmp_path):
    """Each Slurm backend made used to start a log-following thread that never ended."""
    monkeypatch.setattr(fiberrl.backends.slurm.shutil, "which", lambda name: "/usr/bin/" + name)
    fiberrl.init(backend="slurm", extra={"slurm_log_dir": str(tmp_path)})
    try:
        fiberrl.backends.slurm.SlurmBackend()
        before = sum(t.name == "fiberrl-output-files" for t in threading.enumerate())
        for _ in range(3):
            fiberrl.backends.slurm.SlurmBackend()
        after = sum(t.name == "fiberrl-output-files" for t in threading.enumerate())
    finally:
        fiberrl.config.reset()
    assert before == after == 1
