"""The Docker backend: each fiberrl process is a container (the official ``docker`` SDK).

- ``create_job``: ``containers.run`` of the worker image (``image`` setting; default
  ``fiberrl-worker:cpu``, see ``images/``) running ``python3 -m fiberrl.spawn``
  under Docker's init, or beside the init of its run's PID-namespace holder (so the
  job is not PID 1 and signals act as on a host);
  ``cpu`` -> ``nano_cpus``, ``mem`` -> ``mem_limit`` (swap off), ``gpu`` -> a GPU
  device request. The run's secret is in the container's environment (readable
  by whoever can talk to dockerd, who is root-equivalent anyway), never in its
  command. Containers carry labels ``fiberrl.run``, ``fiberrl.user`` and
  ``fiberrl.name``, so ``fiberrl ps`` finds them.
- The container reaches its parent's hub at the host's routable address (the
  listen address of a master using this backend); containers on a user-defined
  network or ``--network=host`` work too (``docker_network`` setting).
- Processes started inside a container are containers too: the local dockerd's
  socket is mounted into each container (``docker_mount_socket``, default true),
  which lets jobs start containers: as much power as the Docker group has.
- The code: the working directory is mounted read-only at the same path and is the
  container's working directory (``docker_mount_cwd``, default true), so modules
  next to the script import as they do locally; ``fiberrl run`` instead builds an
  image holding the code. ``docker_volumes`` adds mounts (``{"/host": "/in"}`` or
  the SDK's dict form).
- ``status``: the container's state; exit codes above 128 become ``-signal``;
  ``OOMKilled`` becomes an "out of memory" reason. A finished container's log tail
  is kept and the container removed.
- PID namespace: by default every job of a run joins one namespace held by a small
  container (``docker_pid.py``, setting ``docker_pid_namespace``), so pids are unique
  within the run and ``Process.pid`` is the job's ``os.getpid()``.
- Output (``docker_forward_output``, default true): with dockerd on this host, a job
  writes its stdout and its stderr into two files of the run's output directory,
  mounted at the same path in every job (so a job's own Docker jobs use it too), and
  this process's one :mod:`.output_files` thread forwards them live, to this
  process's stdout and stderr, as a local child's streams are: no descriptor or
  thread per container, and whatever a job wrote before it was killed is kept.
  What a job wrote before it reached its files (an interpreter that could not start)
  is in the container's own log, forwarded stream by stream when the job ends. With
  a remote dockerd (``DOCKER_HOST`` not a local socket) each container's stdout and
  stderr are streamed instead. ``logs``: all of it, the container's log first.
"""
from __future__ import annotations

import contextlib
import logging
import os
import re
import shutil
import signal
import socket
import threading
import uuid
from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional, Tuple

from .._runtime.jobenv import ERROR_FILE_ENV, OUTPUT_FILE_ENV
from ..config import DEFAULT_IMAGE, get_config
from ..errors import BackendError
from . import addresses, output_files
from .base import Backend, Job, JobInfo, JobSpec, JobState, JobStatus, run_id, user_name
from . import docker_pid
from .docker_pid import HOLDER_ROLE, check_mode, start_or_remove
from .local import describe_exit

logger = logging.getLogger(__name__)

LABEL_RUN, LABEL_USER, LABEL_NAME = "fiberrl.run", "fiberrl.user", "fiberrl.name"
_TAIL_KEPT = 200
#: the run's output directory, inherited by jobs (a job's own Docker jobs write there too)
OUTPUT_DIR_ENV = "FIBERRL_DOCKER_OUTPUT_DIR"


def _docker_module():
    try:
        import docker
    except ImportError as exc:
        raise BackendError("the docker backend needs the docker SDK: "
                           "pip install 'fiberrl[docker]'") from exc
    return docker


@dataclass
class _ContainerData:
    """The backend's private state for one container."""

    container: Any
    final: Optional[JobStatus] = None
    tail: str = ""
    pid_holder: Optional[str] = None  # the holder container whose namespace it joined
    output: Optional[str] = None      # the file its stdout goes to, if any
    error: Optional[str] = None       # the file its stderr goes to, if any


def exit_status(state: Mapping[str, Any]) -> JobStatus:
    """fiberrl's view of a container's ``State`` (``docker inspect``)."""
    status = state.get("Status")
    if status in ("created", "restarting"):
        return JobStatus(JobState.PENDING)
    if status in ("running", "paused", "removing"):
        return JobStatus(JobState.RUNNING)
    code = int(state.get("ExitCode") or 0)
    if state.get("OOMKilled"):
        return JobStatus(JobState.FAILED, -int(signal.SIGKILL),
                         "OOMKilled: the container used more than its memory limit")
    if code > 128 and code - 128 in {s.value for s in signal.Signals}:
        code = -(code - 128)  # docker's init reports death by signal N as 128 + N
    if state.get("Error"):
        return JobStatus(JobState.FAILED, code or 1, f"docker: {state['Error']}")
    if code == 0:
        return JobStatus(JobState.SUCCEEDED, 0)
    return JobStatus(JobState.FAILED, code, describe_exit(code))


def container_name(spec: JobSpec) -> str:
    """A unique, valid container name for the process ``spec.name``."""
    slug = re.sub(r"[^a-zA-Z0-9_.-]", "-", spec.name).strip("-.")[:40] or "job"
    return f"fiberrl-{slug}-{uuid.uuid4().hex[:8]}"


def _output_dir(log_dir: Optional[str]) -> Optional[str]:
    """The run's output directory here: the one a parent job made (mounted in this
    container at the same path), else a new one, removed when this process exits; None
    if none can be made (each container's log is then streamed)."""
    inherited = os.environ.get(OUTPUT_DIR_ENV)
    if inherited and os.path.isdir(inherited):
        return inherited
    base = log_dir or os.path.join(os.path.expanduser("~"), ".fiberrl", "docker")
    path = os.path.join(base, f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}")
    try:
        os.makedirs(path, mode=0o700)
    except OSError as exc:
        logger.warning("cannot make the Docker jobs' output directory %s (%s); streaming "
                       "each container's log instead", path, exc)
        return None
    from multiprocessing import util as _mp_util
    _mp_util.Finalize(None, shutil.rmtree, args=(path, True), exitpriority=-20)
    return path


def _with_file_tails(text: str, paths: List[Optional[str]], lines: int) -> str:
    """A container's own log ``text`` followed by the last ``lines`` lines of each of its
    output files ``paths`` (stdout's, then stderr's; None where it has none)."""
    tails = [output_files.file_tail(path, lines) for path in paths if path is not None]
    return "\n".join(filter(None, [text.rstrip("\n"), *tails]))


class _OutputForwarder:
    """Streams each container's stdout and stderr to this process's, a thread per stream
    (for a remote dockerd, whose jobs cannot share a file with this process)."""

    def follow(self, container: Any) -> None:
        """Forward ``container``'s two streams until it is removed."""
        for to_fd, stream in ((1, "stdout"), (2, "stderr")):
            thread = threading.Thread(target=self._pump, args=(container, to_fd), daemon=True,
                                      name=f"fiberrl-docker-{stream}-{container.name}")
            thread.start()

    @staticmethod
    def _pump(container: Any, to_fd: int) -> None:
        try:
            for chunk in container.logs(stream=True, follow=True, stdout=to_fd == 1,
                                        stderr=to_fd == 2):
                os.write(to_fd, chunk)
        except Exception:  # the container was removed: its output is over
            logger.debug("output of %s ended", container.name, exc_info=True)


class DockerBackend(Backend):
    """One container per process, through the Docker SDK (``DOCKER_HOST`` or the local socket)."""

    name = "docker"
    shares_host = False

    def __init__(self, listen_host: Optional[str] = None) -> None:
        docker = _docker_module()
        try:
            self._client = docker.from_env(timeout=60)
            self._client.ping()
        except Exception as exc:
            raise BackendError(f"cannot reach dockerd ({exc}); scripts/docker-up.sh starts one "
                               "here") from exc
        self._docker = docker
        cfg = get_config()
        self._extra: Mapping[str, Any] = cfg.extra
        self._pid_mode = check_mode(self._extra)
        run = run_id()
        self._pid_namespace = docker_pid.shared(
            docker, run, {LABEL_RUN: run, LABEL_USER: user_name(), LABEL_NAME: HOLDER_ROLE})
        self._retired = False
        self._image = cfg.image or self._extra.get("docker_image") or DEFAULT_IMAGE
        self._listen_host = listen_host
        self._images_seen: set = set()
        self.forwards_output = bool(self._extra.get("docker_forward_output", True))
        local = self._socket_path() is not None
        self._output_dir = _output_dir(cfg.log_dir) if self.forwards_output and local else None
        self._follower = output_files.follower.get() if self._output_dir else None
        self._forwarder = (_OutputForwarder() if self.forwards_output and self._follower is None
                           else None)

    # -- submitting ---------------------------------------------------------------
    def create_job(self, spec: JobSpec) -> Job:
        image = spec.image or self._image
        self._ensure_image(image)
        options = self._run_options(spec)
        output, error = self._output_files(options)
        try:
            container = self._run_container(image, spec, options)
        except BaseException:
            _remove_files(output, error)
            raise
        holder = options.get("pid_mode", "").partition("container:")[2] or None
        job = Job(id=container.name, backend=self.name, spec=spec, host=container.short_id,
                  data=_ContainerData(container, pid_holder=holder, output=output,
                                      error=error))
        if holder:
            self._pid_namespace.joined(container.name)
        if output is not None:
            self._follower.follow(output)
            self._follower.follow(error, to_fd=2)
        if self._forwarder is not None:
            self._forwarder.follow(container)
        logger.debug("started container %s (%s) for %s", container.name, image, spec.name)
        return job

    def _output_files(self, options: Dict[str, Any]) -> Tuple[Optional[str], Optional[str]]:
        """Make the files the job's stdout and stderr go to, and tell the job ((None, None)
        if not following files). Made here, so that a job that cannot see them (a path
        that means another place to it) keeps writing its own log rather than files
        nobody reads."""
        if self._output_dir is None:
            return None, None
        made: List[str] = []
        try:
            for suffix in (".out", ".err"):
                path = os.path.join(self._output_dir, options["name"] + suffix)
                os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
                made.append(path)
        except OSError as exc:   # (a full disk, a removed directory) its own log instead
            logger.warning("no output file for %s (%s): its output is forwarded when it "
                           "ends", options["name"], exc)
            _remove_files(*made)
            return None, None
        output, error = made
        options["environment"].update({OUTPUT_FILE_ENV: output, ERROR_FILE_ENV: error,
                                       OUTPUT_DIR_ENV: self._output_dir})
        options.setdefault("volumes", {})[self._output_dir] = {"bind": self._output_dir,
                                                               "mode": "rw"}
        return output, error

    def _run_container(self, image: str, spec: JobSpec, options: Dict[str, Any]) -> Any:
        """The job's container, started in the run's PID namespace if so configured (a
        holder that ended between the check and the start is replaced once)."""
        for attempt in (1, 2):
            if self._pid_mode == "run":
                options["pid_mode"] = self._pid_namespace.pid_mode(
                    image, self._extra.get("docker_python", "python3"), options.get("volumes"))
            try:
                return start_or_remove(self._client, self._docker, image, options)
            except self._docker.errors.APIError as exc:
                holder = options.get("pid_mode", "").partition("container:")[2]
                lost = self._pid_mode == "run" and self._pid_namespace.lost_reason(holder)
                if lost and attempt == 1:
                    logger.warning("the run's pid-namespace holder refused %s (%s); "
                                   "starting a new one", spec.name, exc.explanation or exc)
                    self._pid_namespace.forget()
                    continue
                if lost:   # a new holder ended at once too: it cannot run in this image
                    python = self._extra.get("docker_python", "python3")
                    raise BackendError(
                        f"dockerd refused {spec.name!r}: the run's pid-namespace holder "
                        f"ended as soon as it started ({exc.explanation or exc}); does "
                        f"docker_python {python!r} run in image {image!r}?") from exc
                raise BackendError(
                    f"dockerd refused {spec.name!r}: {exc.explanation or exc}") from exc
        raise AssertionError("unreachable")

    def _ensure_image(self, image: str) -> None:
        """Pull ``image`` if this dockerd lacks it; a clear error if that fails."""
        if image in self._images_seen:
            return
        try:
            self._client.images.get(image)
        except self._docker.errors.ImageNotFound:
            logger.info("pulling docker image %s", image)
            try:
                self._client.images.pull(image)
            except self._docker.errors.APIError as exc:
                raise BackendError(
                    f"docker image {image!r} not found here and it cannot be pulled "
                    f"({exc.explanation or exc}); build it (bash scripts/docker-up.sh builds "
                    f"{DEFAULT_IMAGE}) or set the image setting") from None
        self._images_seen.add(image)

    def _run_options(self, spec: JobSpec) -> Dict[str, Any]:
        python = self._extra.get("docker_python", "python3")
        command = [python] + list(spec.command[1:])
        env = {**spec.env, "PYTHONUNBUFFERED": "1"}
        options: Dict[str, Any] = dict(
            command=command, detach=True, init=self._pid_mode != "run", environment=env,
            name=container_name(spec), stdin_open=False,
            labels={LABEL_RUN: spec.env.get("FIBERRL_RUN_ID") or run_id(),
                    LABEL_USER: user_name(), LABEL_NAME: spec.name[:200]},
            extra_hosts={"host.docker.internal": "host-gateway"},
        )
        if self._pid_mode == "host":
            options["pid_mode"] = "host"
        network = self._extra.get("docker_network")
        if network:
            options["network"] = network
        if spec.cpu is not None:
            options["nano_cpus"] = int(spec.cpu * 1e9)
        if spec.mem is not None:
            options["mem_limit"] = int(spec.mem)
            options["memswap_limit"] = int(spec.mem)  # no swap: over the limit is over
        if spec.gpu:
            options["device_requests"] = [self._docker.types.DeviceRequest(
                count=int(spec.gpu), capabilities=[["gpu"]])]
        volumes = self._volumes(spec)
        if volumes:
            options["volumes"] = volumes
        if spec.cwd and self._extra.get("docker_mount_cwd", True):
            options["working_dir"] = spec.cwd
        return options

    def _volumes(self, spec: JobSpec) -> Dict[str, Dict[str, str]]:
        volumes: Dict[str, Dict[str, str]] = {}
        if spec.cwd and self._extra.get("docker_mount_cwd", True):
            volumes[spec.cwd] = {"bind": spec.cwd, "mode": "ro"}
        socket_path = self._socket_path()
        if socket_path and self._extra.get("docker_mount_socket", True):
            volumes[socket_path] = {"bind": "/var/run/docker.sock", "mode": "rw"}
        for host, target in dict(self._extra.get("docker_volumes") or {}).items():
            volumes[host] = target if isinstance(target, dict) else {"bind": target, "mode": "rw"}
        return volumes

    @property
    def uses_local_cores(self) -> bool:
        """True with a dockerd on this machine (its containers run on these cores)."""
        return self._socket_path() is not None

    @staticmethod
    def _socket_path() -> Optional[str]:
        """The local dockerd's socket (None for a remote ``DOCKER_HOST``)."""
        host = os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock")
        path = host[len("unix://"):] if host.startswith("unix://") else None
        return path if path and os.path.exists(path) else None

    # -- watching -------------------------------------------------------------------
    def status(self, job: Job) -> JobStatus:
        data: _ContainerData = job.data
        if data.final is not None:
            return data.final
        try:
            data.container.reload()
        except self._docker.errors.NotFound:
            data.final = JobStatus(JobState.FAILED, None, "the container was removed")
            return data.final
        except self._docker.errors.APIError as exc:
            logger.warning("docker inspect of %s failed: %s", job.id, exc)
            return JobStatus(JobState.UNKNOWN)
        status = exit_status(data.container.attrs.get("State", {}))
        if status.state.finished:
            if (status.exit_code == -int(signal.SIGKILL)
                    and not status.reason.startswith("OOMKilled")):
                lost = self._pid_namespace.lost_reason(data.pid_holder)
                if lost:
                    status = JobStatus(status.state, status.exit_code, lost)
            data.final = status
            self._keep_tail_and_remove(data)
            if data.pid_holder:
                self._pid_namespace.left(job.id)
                if self._retired:
                    self._pid_namespace.remove_if_idle()
        return status

    def _keep_tail_and_remove(self, data: _ContainerData) -> None:
        own_logs = [self._own_log(data, stdout=to_fd == 1, stderr=to_fd == 2)
                    for to_fd in (1, 2)]
        data.tail = b"".join(own_logs).decode("utf-8", "replace")
        for to_fd, own_log in zip((1, 2), own_logs):
            if own_log and self._follower is not None:
                # not forwarded yet: written before the job reached its files, or it had none
                try:
                    os.write(to_fd, own_log)
                except OSError:
                    pass
        if data.output is not None:
            data.tail = _with_file_tails(data.tail, [data.output, data.error], _TAIL_KEPT)
            self._follower.finish(data.output, remove=True)
            self._follower.finish(data.error, remove=True)
        try:
            data.container.remove(force=True)
        except self._docker.errors.APIError as exc:
            logger.debug("removing container %s: %s", data.container.name, exc)

    def _own_log(self, data: _ContainerData, stdout: bool, stderr: bool) -> bytes:
        """The last lines of the container's own log, of the streams asked for."""
        try:
            return data.container.logs(tail=_TAIL_KEPT, stdout=stdout, stderr=stderr)
        except self._docker.errors.APIError as exc:
            logger.debug("log of container %s: %s", data.container.name, exc)
            return b""

    def terminate(self, job: Job, force: bool = False) -> None:
        data: _ContainerData = job.data
        if data.final is not None:
            return
        sig = signal.SIGKILL if force else signal.SIGTERM
        try:
            data.container.kill(signal=sig.name)
        except self._docker.errors.APIError as exc:
            logger.debug("kill of %s: %s", job.id, exc)

    def logs(self, job: Job, tail: int = 50) -> str:
        data: _ContainerData = job.data
        if data.final is not None:
            text = data.tail
        else:
            try:
                text = data.container.logs(tail=tail).decode("utf-8", "replace")
            except self._docker.errors.APIError:
                text = data.tail
            if data.output is not None:
                text = _with_file_tails(text, [data.output, data.error], tail)
        return "\n".join(text.splitlines()[-tail:])

    def listen_host(self) -> str:
        """The host's routable address (containers on the bridge reach it); in a job,
        the container's own address on the route back to its parent."""
        from .._wire.sockets import default_listen_host
        return addresses.listen_host(self._listen_host, default_listen_host)

    # -- the command line -----------------------------------------------------------
    def list_jobs(self) -> List[JobInfo]:
        containers = self._client.containers.list(
            all=True, filters={"label": f"{LABEL_USER}={user_name()}"})
        return [JobInfo(id=c.name, backend=self.name, name=c.labels.get(LABEL_NAME, ""),
                        run=c.labels.get(LABEL_RUN, ""), state=c.status,
                        host=c.short_id, created=c.attrs.get("Created", "")[:19])
                for c in containers]

    def attach(self, job_id: str) -> Job:
        try:
            container = self._client.containers.get(job_id)
        except self._docker.errors.NotFound as exc:
            raise BackendError(f"no container {job_id!r}") from exc
        spec = JobSpec(command=[], name=container.labels.get(LABEL_NAME, job_id))
        return Job(id=container.name, backend=self.name, spec=spec, host=container.short_id,
                   data=_ContainerData(container))

    def retire(self) -> None:
        """Remove the run's pid-namespace holder now if no job of this process lives in
        it (else when this backend sees its last one end, or at exit)."""
        self._retired = True
        self._pid_namespace.remove_if_idle()

    def close(self) -> None:
        try:
            self._client.close()
        except Exception:
            pass


def _remove_files(*paths: Optional[str]) -> None:
    """Delete the files made for a job that did not start (None: none made)."""
    for path in paths:
        if path is not None:
            with contextlib.suppress(OSError):
                os.unlink(path)
