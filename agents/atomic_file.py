"""Replacing a file so that a reader sees the old contents or the new, never a part, and
the new survives a crash once the call returns."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def write_atomically(path: Path, data: bytes, mode: int) -> None:
    """Write a hidden temporary file beside `path`, flush it to disk, rename it over `path`
    and flush the directory; creates the directory if missing. On failure nothing is left
    behind and the old file, if any, is unchanged."""
    path.parent.mkdir(parents=True, exist_ok=True)
    # A leading '.' and a suffix other than the real one: directory scanners that match
    # on the suffix (CDI caches read *.yaml and *.json) never pick up the temporary file.
    fd, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    tmp = Path(name)
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(data)
            out.flush()
            os.fchmod(out.fileno(), mode)
            os.fsync(out.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    _sync_directory(path.parent)


def _sync_directory(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
