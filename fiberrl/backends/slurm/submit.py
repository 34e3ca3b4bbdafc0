"""What fiberrl hands to ``sbatch`` and ``srun``: options and batch scripts.

Pure functions (no Slurm calls), so the generated requests are easy to test.

Resource hints map onto Slurm like this:

==================  =========================================
hint / config       Slurm option
==================  =========================================
``cpu``             ``--cpus-per-task`` (rounded up)
``mem`` (bytes)     ``--mem`` in MiB (rounded up)
``gpu``             ``--gres=gpu:N``
``time_limit``      ``--time`` (seconds, or a Slurm time string)
``partition``       ``--partition``
``account``         ``--account``
``qos``             ``--qos``
``sbatch_options``  extra options, verbatim (a list or a string)
==================  =========================================

Explicit ``Process``/``Pool`` arguments win over ``@fiberrl.meta`` hints, which win
over the config (``extra`` keys ``slurm_partition``, ``slurm_account``,
``slurm_qos``, ``slurm_time_limit``, ``slurm_options``).

Jobs are submitted with ``--no-requeue``: a requeued job would restart with a
one-time token already spent; fiberrl's pool re-runs lost work itself.
"""
from __future__ import annotations

import math
import re
import shlex
from typing import Any, Dict, List, Mapping, Optional, Sequence

from ...errors import ConfigError
from ..base import JobSpec

#: every fiberrl job's ``--comment`` starts with this, then the run's id (``fiberrl ps``)
COMMENT_PREFIX = "fiberrl:"
#: resource-hint names the Slurm backend understands beyond cpu/mem/gpu
SLURM_HINTS = ("time_limit", "partition", "account", "qos", "sbatch_options")
_CONFIG_KEYS = {"time_limit": "slurm_time_limit", "partition": "slurm_partition",
                "account": "slurm_account", "qos": "slurm_qos", "sbatch_options": "slurm_options"}
_TIME = re.compile(r"^(\d+-)?\d+(:\d+){0,2}$|^\d+-\d+$|^(UNLIMITED|INFINITE)$", re.IGNORECASE)


def slurm_time(value: Any) -> str:
    """A time limit for ``--time``: seconds (rounded up to whole minutes) or a Slurm string."""
    if isinstance(value, bool):
        raise ConfigError(f"time_limit must be seconds or a Slurm time string, got {value!r}")
    if isinstance(value, (int, float)):
        if value <= 0:
            raise ConfigError(f"time_limit must be positive, got {value!r}")
        return str(max(1, math.ceil(value / 60)))
    text = str(value).strip()
    if not _TIME.match(text):
        raise ConfigError(f"cannot read time_limit {value!r}: use seconds or a Slurm time "
                          "such as '90', '1:30:00' or '2-00:00:00'")
    return text


def extra_options(value: Any) -> List[str]:
    """``sbatch_options`` as a list of arguments (a string is split like a shell)."""
    if value is None:
        return []
    if isinstance(value, str):
        return shlex.split(value)
    if isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value):
        return list(value)
    raise ConfigError(f"sbatch_options must be a string or a list of strings, got {value!r}")


def request_of(spec: JobSpec, config_extra: Mapping[str, Any]) -> Dict[str, Any]:
    """The Slurm-specific hints of ``spec``, falling back to the config's ``slurm_*`` keys."""
    request = {}
    for hint, key in _CONFIG_KEYS.items():
        value = spec.extra.get(hint, config_extra.get(key))
        if value is not None:
            request[hint] = value
    return request


def resource_options(spec: JobSpec, config_extra: Mapping[str, Any]) -> List[str]:
    """``sbatch``/``srun`` options for the resources ``spec`` asks for."""
    options = []
    if spec.cpu is not None:
        options.append(f"--cpus-per-task={max(1, math.ceil(spec.cpu))}")
    if spec.mem is not None:
        options.append(f"--mem={max(1, math.ceil(spec.mem / (1 << 20)))}M")
    if spec.gpu:
        options.append(f"--gres=gpu:{int(spec.gpu)}")
    request = request_of(spec, config_extra)
    if "time_limit" in request:
        options.append(f"--time={slurm_time(request['time_limit'])}")
    for hint in ("partition", "account", "qos"):
        if hint in request:
            options.append(f"--{hint}={request[hint]}")
    options += extra_options(request.get("sbatch_options"))
    return options


def job_name(spec: JobSpec) -> str:
    """A Slurm job name: the process name, made safe for ``squeue`` columns."""
    return re.sub(r"[^A-Za-z0-9_.:+-]", "_", spec.name)[:100] or "fiberrl-job"


def shared_env(specs: Sequence[JobSpec]) -> Dict[str, str]:
    """Variables with the same value in every spec (handed to ``sbatch``'s environment)."""
    first = specs[0].env
    return {k: v for k, v in first.items() if all(s.env.get(k) == v for s in specs[1:])}


def batch_script(specs: Sequence[JobSpec], shared: Mapping[str, str]) -> str:
    """A batch script that runs ``specs[i]`` as array task ``i`` (or the only spec).

    Variables common to every spec (the run's secret among them) are not written
    here: ``sbatch`` passes them from its own environment. Per-task variables (the
    one-time token, the process name) are selected by ``SLURM_ARRAY_TASK_ID``.
    """
    lines = ["#!/bin/sh", "# written by fiberrl: one fiberrl job per (array) task"]
    if len(specs) == 1:
        lines += _exports(specs[0], shared)
        lines.append(_exec(specs[0]))
    else:
        lines.append('case "$SLURM_ARRAY_TASK_ID" in')
        for index, spec in enumerate(specs):
            body = _exports(spec, shared) + [_exec(spec)]
            lines.append(f"  {index})")
            lines += ["    " + line for line in body]
            lines.append("    ;;")
        lines.append('  *) echo "fiberrl: unknown array task $SLURM_ARRAY_TASK_ID" >&2; exit 2;;')
        lines.append("esac")
    return "\n".join(lines) + "\n"


def _exports(spec: JobSpec, shared: Mapping[str, str]) -> List[str]:
    return [f"export {key}={shlex.quote(value)}" for key, value in sorted(spec.env.items())
            if key not in shared]


def _exec(spec: JobSpec) -> str:
    cd = f"cd {shlex.quote(spec.cwd)} && " if spec.cwd else ""
    return f"{cd}exec {shlex.join(spec.command)}"


def same_request(specs: Sequence[JobSpec], config_extra: Mapping[str, Any]) -> bool:
    """True when every spec asks for the same resources (so one job array fits all)."""
    first = resource_options(specs[0], config_extra)
    return all(resource_options(s, config_extra) == first for s in specs[1:])


def sbatch_command(specs: Sequence[JobSpec], script_path: str, output_pattern: str,
                   config_extra: Mapping[str, Any],
                   error_pattern: Optional[str] = None) -> List[str]:
    """The ``sbatch`` command line that submits ``specs`` (one job, or an array): their
    stdout goes to files named by ``output_pattern``, their stderr to files named by
    ``error_pattern`` (the same files if None)."""
    command = ["sbatch", "--parsable", "--no-requeue", f"--job-name={job_name(specs[0])}",
               f"--output={output_pattern}", "--export=ALL", "--kill-on-invalid-dep=yes",
               f"--comment={COMMENT_PREFIX}{specs[0].env.get('FIBERRL_RUN_ID', '')}"]
    if error_pattern is not None:
        command.append(f"--error={error_pattern}")
    if specs[0].cwd:
        command.append(f"--chdir={specs[0].cwd}")
    if len(specs) > 1:
        command.append(f"--array=0-{len(specs) - 1}")
    command += resource_options(specs[0], config_extra)
    command.append(script_path)
    return command


def srun_command(spec: JobSpec, allocation: str, output_path: str,
                 mem_per_cpu: Optional[int] = None, error_path: Optional[str] = None) -> List[str]:
    """The ``srun`` command line that runs ``spec`` as a job step of ``allocation``, its
    stdout to ``output_path`` and its stderr to ``error_path`` (the same file if None).

    Time limits, partitions, accounts and QOS belong to the allocation, so only the
    per-step resources are passed; ``--exact`` gives the step just what it asked for,
    so several steps share the allocation. A step that names no memory would take
    all of the allocation's: it gets ``mem_per_cpu`` MiB per CPU instead (the
    allocation's memory over its CPUs).
    """
    options = [o for o in resource_options(spec, {}) if o.split("=")[0] in
               ("--cpus-per-task", "--mem", "--gres")]
    if not any(o.startswith("--cpus-per-task") for o in options):
        options.append("--cpus-per-task=1")
    if mem_per_cpu and not any(o.startswith("--mem") for o in options):
        options.append(f"--mem-per-cpu={mem_per_cpu}M")
    return (["srun", f"--jobid={allocation}", "--ntasks=1", "--nodes=1", "--exact",
             "--kill-on-bad-exit=1", "--quiet", f"--job-name={job_name(spec)}",
             f"--output={output_path}", "--export=ALL"]
            + ([f"--error={error_path}"] if error_path is not None else []) + options
            + list(spec.command))


def allocation_mem_per_cpu(env: Mapping[str, str]) -> Optional[int]:
    """MiB per CPU of the allocation described by ``env`` (a job's ``SLURM_*``)."""
    if env.get("SLURM_MEM_PER_CPU", "").isdigit():
        return int(env["SLURM_MEM_PER_CPU"])
    per_node, cpus = env.get("SLURM_MEM_PER_NODE", ""), env.get("SLURM_CPUS_ON_NODE", "")
    if per_node.isdigit() and cpus.isdigit() and int(cpus) > 0:
        return max(1, int(per_node) // int(cpus))
    return None
