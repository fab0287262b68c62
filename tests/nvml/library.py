"""The project's test libnvidia-ml.so.1: compiled from libnvml.c against NVIDIA's nvml.h
(PyPI nvidia-nvml-dev) on first use, cached by the hash of both, and the environment that
makes pynvml load it in a subprocess (pynvml loads its library once per process)."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

SOURCE = Path(__file__).with_name("libnvml.c")
REPO = SOURCE.parents[2]
CACHE = REPO / ".cache" / "nvml"
STATE_ENV = "NODE_AGENT_NVML_STATE"


class BuildError(RuntimeError):
    pass


def header_dir() -> Path:
    """The include directory of the installed nvidia-nvml-dev package."""
    for base in map(Path, sys.path):
        for header in sorted((base / "nvidia").glob("*/include/nvml.h")):
            return header.parent
    raise BuildError("nvml.h not found: install the dev extra (pip install -e '.[dev]')")


def compiler() -> str:
    found = shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc")
    if found is None:
        raise BuildError("no C compiler (cc or gcc): apt-get install gcc")
    return found


def build() -> Path:
    """The directory holding libnvidia-ml.so.1, built now unless already cached."""
    include = header_dir()
    digest = hashlib.sha256(SOURCE.read_bytes() + (include / "nvml.h").read_bytes()).hexdigest()
    out = CACHE / digest[:16]
    library = out / "libnvidia-ml.so.1"
    if library.is_file():
        return out
    out.mkdir(parents=True, exist_ok=True)
    tmp = out / f"libnvidia-ml.so.1.{os.getpid()}"
    done = subprocess.run(
        [
            *(compiler(), "-shared", "-fPIC", "-O2", "-std=gnu11", "-pthread"),
            *("-Wall", "-Wextra", "-Werror", f"-I{include}", "-o", str(tmp), str(SOURCE)),
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode:
        raise BuildError(f"building {SOURCE.name} failed:\n{done.stderr}")
    tmp.replace(library)
    return out


def nvml_env(state: Path, base: dict[str, str] | None = None) -> dict[str, str]:
    """Environment for a subprocess whose pynvml loads the test library on `state`."""
    env = dict(os.environ if base is None else base)
    env["LD_LIBRARY_PATH"] = str(build())
    env[STATE_ENV] = str(state)
    return env
