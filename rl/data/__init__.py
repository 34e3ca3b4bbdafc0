"""Horizon-style data pipeline: logged rows -> Timeline transitions -> a feature
normalization spec applied inside the model, scaled out over a ``fiberrl.Pool``.

Modules, one job each::

    schema.py         field names, canonical Arrow layout, LoggedDataError
    records.py        validate rows given as dicts (JSON lines, CSV)
    columnar.py       validate rows given as Arrow columns (Parquet), vectorized
    readers.py        find inputs, cut them into chunks, read a chunk
    timeline.py       the Timeline operator on whole MDPs
    sharding.py       the two-phase sharded run over pool workers
    parallel.py       run tasks on a pool or in-process, with progress bars
    output.py         atomic output directories and _SUCCESS metadata
    transitions.py    read the output back (Arrow table or dense numpy arrays)
    sampling.py       parallel bottom-k sample of every feature
    identify.py       feature identification (Horizon's Algorithm 1)
    spec.py           the JSON normalization spec
    normalization.py  the PyTorch module applying a spec (TorchScript-able)
    writers.py        write logged rows (JSON lines, CSV, Parquet)
    generate.py       logged rows from a gymnasium env or the Gridworld
    cli.py            ``fiberrl workflow generate|timeline|normalize``

Names are imported lazily (torch only loads with :class:`FeatureNormalizer`).
"""
from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "LoggedDataError": "rl.data.schema",
    "run_timeline": "rl.data.sharding",
    "compute_timeline": "rl.data.timeline",
    "read_table": "rl.data.transitions",
    "read_transitions": "rl.data.transitions",
    "dense_features": "rl.data.transitions",
    "read_metadata": "rl.data.output",
    "sample_features": "rl.data.sampling",
    "identify_features": "rl.data.identify",
    "identify_type": "rl.data.identify",
    "IdentifyOptions": "rl.data.identify",
    "load_spec": "rl.data.spec",
    "save_spec": "rl.data.spec",
    "FeatureNormalizer": "rl.data.normalization",
    "generate_logged_data": "rl.data.generate",
    "logged_rows": "rl.data.generate",
    "write_logged_rows": "rl.data.writers",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'rl.data' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


def __dir__() -> list:
    return sorted(set(globals()) | set(_EXPORTS))
