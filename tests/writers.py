"""The two ways an operator's editor writes a file: in place, or a new file renamed over it."""

from __future__ import annotations

import os
from pathlib import Path


def write_in_place(path: Path, text: str) -> None:
    with path.open("w") as f:
        f.write(text)


def write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)
