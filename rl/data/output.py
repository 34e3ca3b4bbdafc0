"""Output that never looks complete before it is.

A Timeline output directory is written under a hidden temporary name next to its
final place (``.NAME.tmp-<random suffix>``), with the workers' scratch files inside it. When
every shard is written, the scratch files are removed, the metadata file
``_SUCCESS`` (JSON) is written last, and the directory is renamed into place in one
step. On any failure the temporary directory is removed, so a directory named
``NAME`` always holds a complete result, and readers also insist on ``_SUCCESS``.
"""
from __future__ import annotations

import json
import logging
import os
import shutil
import uuid
from pathlib import Path
from typing import Any, Dict, List, Optional, Union

logger = logging.getLogger(__name__)

SUCCESS = "_SUCCESS"
SCRATCH = "_scratch"
OUTPUT_FORMAT = "fiberrl-timeline"


def part_name(shard: int) -> str:
    """File name of output shard ``shard``."""
    return f"part-{shard:05d}.parquet"


class AtomicDirectory:
    """A directory built under a temporary name and renamed to ``path`` by :meth:`commit`.

    ``path`` must not exist unless ``overwrite``; even then only an earlier complete
    output (one with ``_SUCCESS``) or an empty directory is replaced.
    """

    def __init__(self, path: Union[str, Path], overwrite: bool = False) -> None:
        self.path = Path(path)
        if self.path.exists():
            if not overwrite:
                raise FileExistsError(f"{self.path} exists (pass overwrite to replace it)")
            if not self.path.is_dir() or (any(self.path.iterdir())
                                          and not (self.path / SUCCESS).is_file()):
                raise FileExistsError(f"{self.path} exists and is not an earlier output; "
                                      "refusing to replace it")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.tmp = self.path.parent / f".{self.path.name}.tmp-{uuid.uuid4().hex[:12]}"
        self.tmp.mkdir()
        self.scratch = self.tmp / SCRATCH
        self.scratch.mkdir()
        self.committed = False

    def commit(self, metadata: Dict[str, Any]) -> None:
        """Drop the scratch files, write ``_SUCCESS`` and move the directory into place."""
        shutil.rmtree(self.scratch, ignore_errors=True)
        write_json_atomic(self.tmp / SUCCESS, metadata)
        old: Optional[Path] = None
        if self.path.exists():
            old = self.path.parent / f".{self.path.name}.old-{uuid.uuid4().hex[:12]}"
            os.rename(self.path, old)
        os.rename(self.tmp, self.path)
        self.committed = True
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)

    def discard(self) -> None:
        """Remove the temporary directory (nothing is left behind)."""
        if not self.committed:
            shutil.rmtree(self.tmp, ignore_errors=True)

    def __enter__(self) -> "AtomicDirectory":
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.discard()


def write_json_atomic(path: Union[str, Path], data: Any) -> None:
    """Write ``data`` as JSON to ``path`` through a temporary file and a rename."""
    path = Path(path)
    tmp = path.parent / f".{path.name}.tmp-{uuid.uuid4().hex[:12]}"
    try:
        with open(tmp, "w", encoding="utf-8") as handle:
            json.dump(data, handle, indent=2, sort_keys=False)
            handle.write("\n")
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


def read_metadata(directory: Union[str, Path]) -> Dict[str, Any]:
    """The metadata of a complete Timeline output directory.

    Raises FileNotFoundError for a missing directory and ValueError for one without
    ``_SUCCESS`` (incomplete or not a Timeline output).
    """
    directory = Path(directory)
    if not directory.is_dir():
        raise FileNotFoundError(f"{directory}: no such directory")
    marker = directory / SUCCESS
    if not marker.is_file():
        raise ValueError(f"{directory}: no {SUCCESS} file: not a complete Timeline output")
    with open(marker, encoding="utf-8") as handle:
        metadata = json.load(handle)
    if metadata.get("format") != OUTPUT_FORMAT:
        raise ValueError(f"{marker}: not a Timeline output (format {metadata.get('format')!r})")
    return metadata


def part_files(directory: Union[str, Path]) -> List[Path]:
    """The shard files of a complete Timeline output directory, in order."""
    metadata = read_metadata(directory)
    return [Path(directory) / name for name in metadata["shards"]]
