"""Jobs' output written to files that this process follows: Slurm jobs' logs, and
Docker jobs' output when dockerd runs on this host.

A job writing into a file keeps all it wrote, even if it is killed a moment later:
each write is the kernel's at once, with no thread of the job's copying it and no
descriptor of ours held per job. One thread per process (``fiberrl-output-files``)
looks at every followed file five times a second and writes the whole lines that
grew there to this process's stdout, or its stderr for a file that holds a job's
stderr. When its job ends, the rest (a last line
without its newline too) is forwarded, and the file is dropped once it has not grown
for half a second (deleted too, if the backend asks).
"""
from __future__ import annotations

import logging
import os
import re
import threading
import time
from dataclasses import dataclass
from typing import Dict, Optional

from .base import PerProcess

logger = logging.getLogger(__name__)

POLL_INTERVAL = 0.2
#: bytes read from one file at a time; a look goes on reading while there is more,
#: up to BURST, so a job that prints fast is not held to CHUNK per look
CHUNK = 1 << 20
BURST = 64 << 20
#: seconds an ended job's file must stay unchanged before it is dropped
SETTLE = 0.5


@dataclass
class _Followed:
    offset: int = 0
    drop: Optional["re.Pattern[bytes]"] = None   # lines not forwarded
    ended_at: Optional[float] = None
    remove: bool = False
    to_fd: int = 1                                # this process's stdout, or stderr (2)


class OutputFollower:
    """Forwards what running jobs write into their output files to this process's stdout
    (and what they write into their error files to its stderr)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._files: Dict[str, _Followed] = {}
        self._thread = threading.Thread(target=self._run, name="fiberrl-output-files",
                                        daemon=True)
        self._thread.start()

    def follow(self, path: str, drop: Optional["re.Pattern[bytes]"] = None,
               to_fd: int = 1) -> None:
        """Forward the lines written to ``path`` from now on (but those ``drop`` matches)
        to this process's descriptor ``to_fd``: 1 (stdout) or 2 (stderr)."""
        if to_fd not in (1, 2):
            raise ValueError(f"output is forwarded to descriptor 1 or 2, not {to_fd!r}")
        with self._lock:
            self._files.setdefault(path, _Followed(drop=drop, to_fd=to_fd))

    def finish(self, path: str, remove: bool = False) -> None:
        """The job writing ``path`` ended: forward what is left, then stop following it
        (and delete it, if ``remove``)."""
        with self._lock:
            followed = self._files.get(path)
            if followed is not None and followed.ended_at is None:
                followed.ended_at, followed.remove = time.monotonic(), remove

    def following(self, path: str) -> bool:
        """Whether ``path`` is still followed (its end not yet forwarded)."""
        with self._lock:
            return path in self._files

    def _run(self) -> None:
        while True:
            with self._lock:
                files = list(self._files.items())
            for path, followed in files:
                forwarded = 0
                try:
                    while forwarded < BURST:
                        read = self._pump(path, followed)
                        forwarded += read
                        if read < CHUNK:
                            break
                except Exception:   # one bad file must not end every job's output
                    logger.warning("forwarding the output in %s failed", path, exc_info=True)
            time.sleep(POLL_INTERVAL)

    def _pump(self, path: str, followed: _Followed) -> int:
        """Forward what grew in ``path`` (whole lines while its job runs, unless a line
        is longer than :data:`CHUNK`); how many bytes were forwarded."""
        ended_at = followed.ended_at
        chunk = b""
        try:
            if os.stat(path).st_size > followed.offset:
                with open(path, "rb") as fh:
                    fh.seek(followed.offset)
                    chunk = fh.read(CHUNK)
        except OSError:
            pass
        if ended_at is None and len(chunk) < CHUNK:
            chunk = chunk[:chunk.rfind(b"\n") + 1]  # whole lines only while the job runs
        read = len(chunk)
        if chunk:
            followed.offset += len(chunk)
            if followed.drop is not None:
                chunk = b"".join(line for line in chunk.splitlines(keepends=True)
                                 if not followed.drop.match(line))
            try:
                os.write(followed.to_fd, chunk)
            except OSError:
                pass
        elif ended_at is not None and time.monotonic() - ended_at > SETTLE:
            with self._lock:
                self._files.pop(path, None)
            if followed.remove:
                try:
                    os.unlink(path)
                except OSError as exc:
                    logger.debug("could not remove %s: %s", path, exc)
        return read


def file_tail(path: str, lines: int) -> str:
    """The last ``lines`` lines of file ``path`` ("" if it cannot be read)."""
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            fh.seek(max(0, fh.tell() - 256 * lines))
            text = fh.read().decode("utf-8", "replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


#: this process's one follower of output files, shared by every backend (one per
#: backend object would leave a thread behind with each backend made)
follower = PerProcess(OutputFollower)
