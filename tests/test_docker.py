"""The Docker backend against the real dockerd of ``scripts/docker-up.sh``: what only
Docker has (the shared Process/Queue/Pipe/Pool/Manager bodies are the ``any_backend``
tests of the other modules). No container may outlive its test.
"""
import subprocess
import time

import pytest

import fiberrl
import backend_bindings
import job_streams
import pool_helpers
from fiberrl.backends.docker import exit_status
from fiberrl.backends.base import JobState


@pytest.mark.parametrize("state,code,reason", [
    ({"Status": "running"}, None, ""),
    ({"Status": "exited", "ExitCode": 0}, 0, ""),
    ({"Status": "exited", "ExitCode": 3}, 3, "exit code 3"),
    ({"Status": "exited", "ExitCode": 137}, -9, "SIGKILL"),
    ({"Status": "exited", "ExitCode": 143}, -15, "SIGTERM"),
    ({"Status": "exited", "ExitCode": 137, "OOMKilled": True}, -9, "OOMKilled"),
])
def test_container_states(state, code, reason):
    status = exit_status(state)
    assert status.exit_code == code and reason in status.reason
    assert status.state is (JobState.RUNNING if code is None else
                            JobState.SUCCEEDED if code == 0 else JobState.FAILED)


_WRITER = ("import sys\nfrom fiberrl._runtime import jobenv\njobenv.write_output_to_file()\n"
           "print('to stdout')\nprint('to stderr', file=sys.stderr)\n")


def test_a_job_writes_its_stdout_and_stderr_into_the_files_it_is_given(tmp_path):
    import os
    import sys
    out_file, err_file = tmp_path / "job.out", tmp_path / "job.err"
    out_file.write_text("")
    err_file.write_text("")
    env = dict(os.environ, FIBERRL_OUTPUT_FILE=str(out_file), FIBERRL_ERROR_FILE=str(err_file))
    out = subprocess.run([sys.executable, "-c", _WRITER], env=env, capture_output=True,
                         text=True, timeout=60)
    assert (out.returncode, out.stdout, out.stderr) == (0, "", "")
    assert (out_file.read_text(), err_file.read_text()) == ("to stdout\n", "to stderr\n")
    # an error file that means another place to the job: stderr stays where it was
    out_file.write_text("")
    env["FIBERRL_ERROR_FILE"] = str(tmp_path / "elsewhere" / "job.err")
    out = subprocess.run([sys.executable, "-c", _WRITER], env=env, capture_output=True,
                         text=True, timeout=60)
    assert (out.stdout, out.stderr, out_file.read_text()) == ("", "to stderr\n", "to stdout\n")


def test_a_job_given_only_an_output_file_writes_both_streams_into_it(tmp_path):
    import os
    import sys
    given = tmp_path / "job.out"
    given.write_text("")
    env = dict(os.environ, FIBERRL_OUTPUT_FILE=str(given))
    out = subprocess.run([sys.executable, "-c", _WRITER], env=env, capture_output=True,
                         text=True, timeout=60)
    assert (out.returncode, out.stdout, out.stderr) == (0, "", "")
    assert given.read_text().splitlines() == ["to stdout", "to stderr"]
    # a path that means another place to the job: its own streams, and no file made
    env["FIBERRL_OUTPUT_FILE"] = str(tmp_path / "elsewhere" / "job.out")
    out = subprocess.run([sys.executable, "-c", _WRITER], env=env, capture_output=True,
                         text=True, timeout=60)
    assert (out.stdout, out.stderr) == ("to stdout\n", "to stderr\n")
    assert not (tmp_path / "elsewhere").exists()


@pytest.fixture
def docker(tmp_path):
    """fiberrl on the real dockerd for this test; no container outlives it."""
    with backend_bindings.bound("docker", tmp_path):
        yield


def _hold_memory(megabytes):
    block = bytearray(megabytes << 20)
    for i in range(0, len(block), 4096):
        block[i] = 1
    time.sleep(120)


def _print_and_exit(code):
    print("from inside the container", flush=True)
    raise SystemExit(code)


def test_exit_code_logs_and_removal(docker):
    proc = fiberrl.Process(target=_print_and_exit, args=(4,), name="speaker")
    proc.start()
    proc.join(60)
    assert proc.exitcode == 4 and proc.exit_reason == "exit code 4"
    assert "from inside the container" in proc.job_logs()
    assert not any(proc.job_id in line for line in backend_bindings.fiberrl_containers())


def test_memory_limit_gives_oomkilled(docker):
    proc = fiberrl.Process(target=_hold_memory, args=(300,), mem="100M")
    proc.start()
    proc.join(60)
    assert proc.exitcode == -9
    assert proc.exit_reason.startswith("OOMKilled")


def test_docker_kill_of_a_busy_worker_mid_map_loses_nothing(docker, make_pool):
    pool = make_pool(3)
    result = pool.map_async(pool_helpers.sleep_then_square, [(0.2, i) for i in range(30)], 1)
    assert pool_helpers.wait_until(lambda: pool.stats().pending == 3, 60), pool.stats()
    subprocess.run(["docker", "kill", pool.workers()[0].job_id], check=True, capture_output=True,
                   timeout=60)
    assert result.get(timeout=120) == [i * i for i in range(30)]
    assert pool.stats().worker_deaths >= 1


def test_missing_image_is_a_clear_error(docker):
    fiberrl.init(backend="docker", image="fiberrl-no-such-image:0")
    with pytest.raises(fiberrl.errors.BackendError, match="not found"):
        fiberrl.Process(target=print).start()


def test_a_python_the_image_lacks_is_a_clear_error_and_leaves_no_container(docker):
    """The job joins the run's PID namespace, whose holder cannot start either: the
    container made for the job is removed when dockerd refuses to start it (left, its
    name made the retry fail with a 409 conflict, and the container stayed behind)."""
    extra = dict(fiberrl.config.get_config().extra, docker_python="/no/such/python")
    fiberrl.init(backend="docker", extra=extra)
    with pytest.raises(fiberrl.errors.BackendError, match="docker_python '/no/such/python'"):
        fiberrl.Process(target=print).start()
    assert [c for c in backend_bindings.fiberrl_containers() if "pidns" not in c] == []


def _with_pid_namespace(mode):
    extra = dict(fiberrl.config.get_config().extra, docker_pid_namespace=mode)
    fiberrl.init(backend="docker", extra=extra)


def _pid_modes(modes):
    """A ``live_pids`` callback: the PidMode of each live job's container."""
    def record(procs):
        for proc in procs:
            out = subprocess.run(["docker", "inspect", "-f", "{{.HostConfig.PidMode}}",
                                  proc.job_id], capture_output=True, text=True, timeout=60)
            modes.append(out.stdout.strip())
    return record


def test_live_jobs_have_distinct_pids_that_they_see_themselves(docker):
    """The run's jobs share one PID namespace: concurrent.futures keys its workers by
    ``Process.pid``, and a worker reports ``os.getpid()`` as that key."""
    modes = []
    pids, seen = pool_helpers.live_pids(3, _pid_modes(modes))
    assert len(set(pids)) == 3 and pids == seen, (pids, seen)
    assert len(set(modes)) == 1 and modes[0].startswith("container:"), modes
    _with_pid_namespace("private")  # Docker's default: a namespace per container
    modes = []
    pids, seen = pool_helpers.live_pids(2, _pid_modes(modes))
    assert pids == seen and modes == ["", ""], (pids, seen, modes)


def test_losing_the_pid_namespace_holder_is_a_clear_reason(docker):
    from fiberrl.backends.docker_pid import holder_name
    from fiberrl.backends.base import run_id
    proc = fiberrl.Process(target=time.sleep, args=(120,))
    proc.start()
    assert proc.pid is not None  # it runs
    subprocess.run(["docker", "rm", "-f", holder_name(run_id())], check=True,
                   capture_output=True, timeout=60)
    proc.join(60)
    assert proc.exitcode == -9 and "PID namespace" in proc.exit_reason, proc.exit_reason
    # the next job starts a new holder
    proc = fiberrl.Process(target=_print_and_exit, args=(0,))
    proc.start()
    proc.join(60)
    assert proc.exitcode == 0


def _wait_for(event):
    event.wait(120)


def test_a_new_configuration_keeps_the_holder_that_live_jobs_share(docker):
    """``fiberrl.init`` retires the backend object, whose holder a job of the new one may
    share: the old one seeing its last job end must not remove it under that job."""
    first_done, second_done = fiberrl.Event(), fiberrl.Event()
    first = fiberrl.Process(target=_wait_for, args=(first_done,))
    first.start()
    assert first.pid is not None
    _with_pid_namespace("run")  # a new backend object, same run and holder
    second = fiberrl.Process(target=_wait_for, args=(second_done,))
    second.start()
    assert second.pid is not None and second.pid != first.pid
    first_done.set()
    first.join(60)
    assert first.exitcode == 0
    time.sleep(1)
    assert second.is_alive()
    second_done.set()
    second.join(60)
    assert second.exitcode == 0, second.exit_reason


def test_pid_namespace_setting_is_checked_at_init():
    with pytest.raises(fiberrl.errors.ConfigError, match="docker_pid_namespace"):
        fiberrl.init(backend="docker", extra={"docker_pid_namespace": "shared"})
    assert fiberrl.config.get_config().backend == "local"


@pytest.mark.parametrize("fail", [False, True])
def test_a_jobs_stdout_goes_to_this_process_stdout_and_its_stderr_to_stderr(docker, capfd, fail):
    """As a local child's streams do (the stdlib's too): a script run as ``script >
    out.log 2> err.log`` gets each job's errors, its traceback too, in err.log."""
    import os
    proc = fiberrl.Process(target=job_streams.print_to_both_streams, args=(fail,))
    proc.start()
    proc.join(60)
    assert proc.exitcode == (1 if fail else 0)
    texts = job_streams.assert_streams_apart(capfd, fail)
    logs = proc.job_logs()
    assert all(text in logs for text in texts), logs
    data = proc._popen.job.data
    assert pool_helpers.wait_until(
        lambda: not os.path.exists(data.output) and not os.path.exists(data.error), 10)


def _print_then_wait(text, seconds):
    print(text, flush=True)
    time.sleep(seconds)


def _wait_for_output(capfd, text, timeout):
    """Everything forwarded to this process's stdout until ``text`` shows, or ``timeout``."""
    seen, deadline = "", time.monotonic() + timeout
    while text not in seen and time.monotonic() < deadline:
        seen += capfd.readouterr().out
        time.sleep(0.05)
    return seen


def test_output_is_forwarded_live_through_one_thread_and_no_descriptor_per_job(docker, capfd):
    """A job's output travels through a file this process follows: no log stream (a
    descriptor and a thread) per container, as before."""
    import os
    import threading
    procs = [fiberrl.Process(target=_print_then_wait, args=(f"live line {i}", 30))
             for i in range(3)]
    for proc in procs:
        proc.start()
    try:
        seen = _wait_for_output(capfd, "live line 2", 60)
        assert all(f"live line {i}" in seen for i in range(3)), seen
        assert all(proc.is_alive() for proc in procs)   # forwarded while the jobs run
        names = [t.name for t in threading.enumerate()]
        assert not [n for n in names if n.startswith("fiberrl-docker-output")], names
        assert names.count("fiberrl-output-files") == 1, names
        files = [proc._popen.job.data.output for proc in procs]
        assert all(os.path.isfile(path) for path in files)
        assert all(f"live line {i}" in proc.job_logs() for i, proc in enumerate(procs))
    finally:
        for proc in procs:
            proc.kill()
            proc.join(60)
    assert pool_helpers.wait_until(lambda: not any(os.path.exists(p) for p in files), 10)


def test_what_a_job_wrote_before_it_was_killed_is_kept_and_forwarded(docker, capfd):
    proc = fiberrl.Process(target=_print_then_wait, args=("written before the kill", 60))
    proc.start()
    assert "written before the kill" in _wait_for_output(capfd, "written before the kill", 60)
    subprocess.run(["docker", "kill", proc.job_id], check=True, capture_output=True, timeout=60)
    proc.join(60)
    assert proc.exitcode == -9
    assert "written before the kill" in proc.job_logs()


def test_output_written_before_the_job_reached_its_file_is_forwarded_at_its_end(
        docker, capfd, tmp_path):
    """What the container printed before fiberrl's entry point took its output (here a
    wrapper around the image's python) is in the container's own log, forwarded when
    the job ends and kept in its logs, before what the job wrote into its file. The
    wrapper lives in a mounted directory: the run's PID-namespace holder, which runs
    ``docker_python`` too, gets the job's mounts (without them it could not start)."""
    wrapper = tmp_path / "python-wrapper.sh"
    wrapper.write_text('#!/bin/sh\necho "from the wrapper"\necho "wrapper error" >&2\n'
                       'exec python3 "$@"\n')
    wrapper.chmod(0o755)
    extra = dict(fiberrl.config.get_config().extra, docker_python=str(wrapper))
    fiberrl.init(backend="docker", extra=extra)
    proc = fiberrl.Process(target=_print_and_exit, args=(0,))
    proc.start()
    proc.join(60)
    assert proc.exitcode == 0
    out, err = job_streams.wait_for_streams(capfd, ["from the wrapper", "wrapper error"], 10)
    assert "from the wrapper" in out and "from inside the container" in out, out
    assert "wrapper error" in err and "wrapper error" not in out, (out, err)
    logs = proc.job_logs()
    assert logs.index("from the wrapper") < logs.index("from inside the container"), logs


def test_the_output_follower_keeps_up_with_a_fast_writer_and_long_lines(tmp_path):
    """Every followed file is looked at five times a second; a look reads on while the
    file has more (up to 64 MiB), and a line longer than a read is forwarded in pieces."""
    import os
    import sys
    script = (
        "import os, sys, time\n"
        "from fiberrl.backends.output_files import OutputFollower\n"
        "path = sys.argv[1]\n"
        "follower = OutputFollower()\n"
        "follower.follow(path)\n"
        "with open(path, 'ab') as fh:\n"
        "    fh.write(b'x' * (3 << 20))\n"           # one 3 MiB line, no newline yet
        "    fh.write((b'line\\n') * (1 << 20))\n"   # then 5 MiB of short lines
        "time.sleep(0.6)\n"                           # about three looks
        "os.write(2, b'done\\n')\n"
    )
    path = tmp_path / "job.out"
    path.write_bytes(b"")
    out = subprocess.run([sys.executable, "-c", script, str(path)], capture_output=True,
                         timeout=60)
    assert out.stderr.endswith(b"done\n"), out.stderr[-500:]
    assert out.stdout == path.read_bytes(), (len(out.stdout), os.path.getsize(path))


def test_the_output_follower_forwards_an_error_file_to_stderr(tmp_path):
    import sys
    from fiberrl.backends.output_files import OutputFollower
    with pytest.raises(ValueError, match="descriptor 1 or 2"):
        OutputFollower.follow(None, str(tmp_path / "x"), to_fd=3)
    script = (
        "import sys, time\n"
        "from fiberrl.backends.output_files import OutputFollower\n"
        "follower = OutputFollower()\n"
        "follower.follow(sys.argv[1])\n"
        "follower.follow(sys.argv[2], to_fd=2)\n"
        "for path, text in zip(sys.argv[1:], (b'out line\\n', b'err line\\n')):\n"
        "    with open(path, 'ab') as fh:\n"
        "        fh.write(text)\n"
        "time.sleep(0.6)\n"
    )
    paths = [tmp_path / "job.out", tmp_path / "job.err"]
    for path in paths:
        path.write_bytes(b"")
    out = subprocess.run([sys.executable, "-c", script, *map(str, paths)], capture_output=True,
                         timeout=60)
    assert (out.returncode, out.stdout, out.stderr) == (0, b"out line\n", b"err line\n")


def test_a_job_whose_output_file_cannot_be_made_keeps_its_output(docker, capfd, caplog):
    """The run's output directory removed under the backend: the job runs anyway, and its
    output, in Docker's own log, is forwarded and kept when it ends."""
    import shutil
    first = fiberrl.Process(target=print, args=("first job",))   # the backend is made
    first.start()
    first.join(60)
    backend = fiberrl.backends.default_backend()
    shutil.rmtree(backend._output_dir)
    proc = fiberrl.Process(target=_print_and_exit, args=(0,))
    proc.start()
    proc.join(60)
    assert proc.exitcode == 0
    assert "from inside the container" in _wait_for_output(capfd, "from inside the container", 10)
    assert "from inside the container" in proc.job_logs()
    assert "no output file" in caplog.text


def test_no_output_directory_streams_each_containers_log_instead(docker, capfd, tmp_path):
    import os
    blocked = tmp_path / "not-a-directory"
    blocked.write_text("")
    fiberrl.init(backend="docker", log_dir=str(blocked),
                 extra=fiberrl.config.get_config().extra)
    os.environ.pop("FIBERRL_DOCKER_OUTPUT_DIR", None)
    proc = fiberrl.Process(target=job_streams.print_to_both_streams, args=(False,))
    proc.start()
    proc.join(60)
    assert proc.exitcode == 0
    job_streams.assert_streams_apart(capfd, fail=False)


def test_containers_use_this_machines_cores_only_with_a_dockerd_here(tmp_path, monkeypatch):
    """What ``ProcessVectorEnv.processes_here`` asks: a remote ``DOCKER_HOST``'s
    containers compute elsewhere. (No dockerd needed: only where it is is read.)"""
    import socket
    from fiberrl.backends.docker import DockerBackend
    backend = object.__new__(DockerBackend)
    here = socket.socket(socket.AF_UNIX)
    here.bind(str(tmp_path / "docker.sock"))
    try:
        monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path / 'docker.sock'}")
        assert backend.uses_local_cores
        monkeypatch.setenv("DOCKER_HOST", "tcp://10.0.0.7:2376")
        assert not backend.uses_local_cores
    finally:
        here.close()
