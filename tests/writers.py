"""The two ways an operator's editor writes a file: in place, or a new file renamed over it;
and a disk that fills up under a writer."""

from __future__ import annotations

import os
import resource
import signal
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


def write_in_place(path: Path, text: str) -> None:
    with path.open("w") as f:
        f.write(text)


def write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


@contextmanager
def file_size_limit(size: int) -> Iterator[None]:
    """Writes past `size` bytes fail with EFBIG (a full disk, as far as the writer sees)."""
    old_limit = resource.getrlimit(resource.RLIMIT_FSIZE)
    old_handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (size, old_limit[1]))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, old_limit)
        signal.signal(signal.SIGXFSZ, old_handler)
