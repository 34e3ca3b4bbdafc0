"""``fiberrl run``, ``ps``, ``logs`` and ``cancel``: jobs from the command line.

``fiberrl run [--backend B] [--image I] script.py args...`` runs the master itself as
a job of backend B with the current directory's code, streams its output and exits
with its exit code (Ctrl-C stops it):

- local: a subprocess;
- slurm: a batch job (the directory must be on a file system the nodes share);
- docker: an image built from the current directory (``FROM`` the worker image,
  the code in ``/app``) runs the master, with the Docker socket mounted so that it
  can start its own containers from the same image;
- kubernetes: the image given with ``--image`` (built from the current directory
  and pushed when ``--registry`` is given; a cluster needs a registry it can pull
  from) runs the master as a pod.

``ps``, ``logs JOB`` and ``cancel JOB...|--all [--run RUN]`` act on this user's
fiberrl jobs on one backend (``--backend``, else the configured one).
"""
from __future__ import annotations

import argparse
import io
import json
import logging
import os
import sys
import tarfile
import time
from typing import Optional

from ..backends import default_backend, get_backend
from ..backends.base import RUN_ENV, Backend, Job, JobSpec, run_id
from .support import UsageError
from ..config import get_config, init
from ..errors import BackendError

logger = logging.getLogger(__name__)

_SKIP_IN_IMAGE = {".git", ".venv", "venv", "__pycache__", ".pytest_cache", ".mypy_cache",
                  "node_modules"}


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``run``, ``ps``, ``logs`` and ``cancel`` to the ``fiberrl`` command."""
    run = sub.add_parser("run", help="run a script as a job (the master of its own processes)")
    run.add_argument("--backend", help="backend for the master and its processes")
    run.add_argument("--image", help="base image (docker) or the image to run (kubernetes)")
    run.add_argument("--registry", help="kubernetes: push the built image to this registry")
    run.add_argument("--no-build", action="store_true", help="docker/kubernetes: use --image as is")
    run.add_argument("--cpu", type=float, help="CPUs for the master's job")
    run.add_argument("--mem", help="memory for the master's job, e.g. 4G")
    run.add_argument("script", help="the Python script to run")
    run.add_argument("args", nargs=argparse.REMAINDER, help="the script's arguments")
    run.set_defaults(func=_run)
    ps = sub.add_parser("ps", help="list this user's fiberrl jobs")
    ps.add_argument("--backend")
    ps.add_argument("--run", help="only the jobs of this run")
    ps.set_defaults(func=_ps)
    logs = sub.add_parser("logs", help="print the tail of a job's output")
    logs.add_argument("--backend")
    logs.add_argument("-n", "--tail", type=int, default=100)
    logs.add_argument("job")
    logs.set_defaults(func=_logs)
    cancel = sub.add_parser("cancel", help="stop jobs")
    cancel.add_argument("--backend")
    cancel.add_argument("--all", action="store_true", help="every fiberrl job of this user")
    cancel.add_argument("--run", help="with --all: only the jobs of this run")
    cancel.add_argument("--force", action="store_true", help="kill instead of terminate")
    cancel.add_argument("jobs", nargs="*")
    cancel.set_defaults(func=_cancel)


def _backend(name: Optional[str]) -> Backend:
    """The backend ``name`` (default: the configured one), checked by :func:`check_backend`."""
    check_backend(name or get_config().backend)
    if name:
        init(backend=name)
    return default_backend()


def check_backend(chosen: str) -> None:
    """Raise :class:`UsageError` when backend ``chosen`` does not exist or misses what
    it needs here (an extra, Slurm's commands)."""
    from ..backends import available_backends
    from ..backends.requirements import missing_requirement
    if chosen not in available_backends():
        raise UsageError(f"unknown backend {chosen!r}; choose one of "
                         f"{', '.join(available_backends())} (fiberrl backends lists them)")
    problem = missing_requirement(chosen)
    if problem:
        raise UsageError(problem)


def _attach(backend: Backend, job_id: str) -> Job:
    """The job ``job_id``; :class:`UsageError` when there is no such fiberrl job."""
    try:
        return backend.attach(job_id)
    except (BackendError, ValueError, KeyError) as exc:
        raise UsageError(f"{exc}; fiberrl ps --backend {backend.name} lists this user's "
                         "jobs") from None


# -- ps / logs / cancel ---------------------------------------------------------------
def _ps(args: argparse.Namespace) -> int:
    backend = _backend(args.backend)
    jobs = [j for j in backend.list_jobs() if not args.run or j.run == args.run]
    rows = [("JOB", "NAME", "RUN", "STATE", "HOST", "CREATED")]
    rows += [(j.id, j.name, j.run, j.state, j.host, j.created) for j in jobs]
    widths = [max(len(str(r[i])) for r in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(str(cell).ljust(width) for cell, width in zip(row, widths)).rstrip())
    return 0


def _logs(args: argparse.Namespace) -> int:
    backend = _backend(args.backend)
    if backend.name == "local":
        raise UsageError("local jobs write to their parent's terminal; fiberrl keeps no log "
                         "of them")
    job = _attach(backend, args.job)
    print(backend.logs(job, args.tail))
    return 0


def _cancel(args: argparse.Namespace) -> int:
    if args.all == bool(args.jobs):
        raise UsageError("name the jobs to cancel, or --all")
    backend = _backend(args.backend)
    if args.jobs:
        jobs = [_attach(backend, job_id) for job_id in args.jobs]  # all checked before any is cancelled
    else:
        jobs = [backend.attach(j.id) for j in backend.list_jobs()
                if (not args.run or j.run == args.run)]
        jobs = [job for job in jobs if not backend.status(job).state.finished]
    for job in jobs:
        backend.terminate(job, force=args.force)
        print(f"cancelled {job.id}")
    return 0


# -- run --------------------------------------------------------------------------------
def _run(args: argparse.Namespace) -> int:
    name = args.backend or get_config().backend
    script = args.script
    if not os.path.isfile(script):
        raise UsageError(f"no such script: {script}")
    check_backend(name)  # an unknown backend or a missing extra, before anything starts
    if name in ("docker", "kubernetes") and not args.no_build:
        from ..backends.requirements import missing_requirement
        problem = missing_requirement("docker")
        if problem:
            raise UsageError(f"building the image: {problem}")
    env = {"FIBERRL_BACKEND": name, RUN_ENV: run_id()}
    extra = dict(get_config().extra)
    spec = JobSpec(command=[sys.executable, script, *args.args], name=f"main-{os.path.basename(script)}",
                   cpu=args.cpu, cwd=os.getcwd(), env=env)
    if args.mem:
        from ..resources import parse_mem
        spec.mem = parse_mem(args.mem)
    if name in ("docker", "kubernetes"):
        image = args.image or "fiberrl-worker:cpu"
        if not args.no_build:
            image = build_image(image, os.getcwd(), push_to=args.registry)
        spec.image, spec.cwd = image, None
        env["FIBERRL_IMAGE"] = image
        if name == "docker":
            extra.update(docker_mount_cwd=False,
                         docker_volumes={"/var/run/docker.sock": "/var/run/docker.sock"})
        env["FIBERRL_EXTRA"] = json.dumps(extra)
    init(backend=name, extra=extra, **({"image": spec.image} if spec.image else {}))
    backend = get_backend(name, listen_host=get_config().listen_host)
    job = backend.create_job(spec)
    print(f"fiberrl: {script} runs as {name} job {job.id} (run {env[RUN_ENV]})", file=sys.stderr)
    return _follow(backend, job)


def _follow(backend: Backend, job: Job) -> int:
    """Wait for ``job``, printing its output where the backend does not; its exit code."""
    printed = 0
    try:
        while True:
            status = backend.status(job)
            if not backend.forwards_output:
                text = backend.logs(job, tail=1_000_000)
                lines = text.splitlines()
                for line in lines[printed:]:
                    print(line, flush=True)
                printed = max(printed, len(lines))
            if status.state.finished:
                break
            time.sleep(0.3)
    except KeyboardInterrupt:
        print(f"fiberrl: stopping job {job.id}", file=sys.stderr)
        backend.terminate(job)
        status = backend.wait(job, timeout=30) or backend.status(job)
    code = status.exit_code if status.exit_code is not None else 1
    if code != 0:
        print(f"fiberrl: job {job.id} ended: {status.reason or f'exit code {code}'}",
              file=sys.stderr)
    return code if code >= 0 else 128 - code


def build_image(base: str, directory: str, push_to: Optional[str] = None) -> str:
    """Build an image holding ``directory`` in ``/app`` on top of ``base``; its tag.

    The build context is made here (``.git``, virtual environments and caches left
    out), so nothing is written into the directory."""
    try:
        import docker
    except ImportError as exc:
        raise BackendError("building an image needs the docker SDK: "
                           "pip install 'fiberrl[docker]'") from exc
    client = docker.from_env(timeout=600)
    name = os.path.basename(os.path.abspath(directory)).lower() or "app"
    tag = f"fiberrl-run-{''.join(c if c.isalnum() else '-' for c in name)}:{int(time.time())}"
    if push_to:
        tag = f"{push_to.rstrip('/')}/{tag}"
    context = _build_context(base, directory)
    logger.info("building %s from %s", tag, directory)
    client.images.build(fileobj=context, custom_context=True, tag=tag, rm=True,
                        labels={"fiberrl.run-image": "1"})
    if push_to:
        for line in client.images.push(tag, stream=True, decode=True):
            if "error" in line:
                raise BackendError(f"pushing {tag}: {line['error']}")
    return tag


def _build_context(base: str, directory: str) -> io.BytesIO:
    buffer = io.BytesIO()
    dockerfile = (f"FROM {base}\nCOPY app/ /app/\nWORKDIR /app\n"
                  "ENV PYTHONPATH=/app PYTHONUNBUFFERED=1\n").encode()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        info = tarfile.TarInfo("Dockerfile")
        info.size = len(dockerfile)
        tar.addfile(info, io.BytesIO(dockerfile))
        tar.add(directory, arcname="app", filter=_keep)
    buffer.seek(0)
    return buffer


def _keep(info: tarfile.TarInfo) -> Optional[tarfile.TarInfo]:
    parts = info.name.split("/")
    if any(part in _SKIP_IN_IMAGE for part in parts) or info.name.endswith(".pyc"):
        return None
    return info
