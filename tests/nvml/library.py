"""The project's test libnvidia-ml.so.1: compiled from lib/ against NVIDIA's nvml.h (PyPI
nvidia-nvml-dev) on first use, cached by the hash of its sources, nvml.h and the compiler's
flags, and the environment that makes pynvml load it in a subprocess (once per process)."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

LIB = Path(__file__).with_name("lib")
SOURCES = sorted(LIB.glob("*.c"))
HEADERS = sorted(LIB.glob("*.h"))
REPO = LIB.parents[2]
CACHE = REPO / ".cache" / "nvml"
STATE_ENV = "NODE_AGENT_NVML_STATE"
# Internal symbols stay hidden: only the NVML entry points nvml.h declares are exported.
FLAGS = ("-shared", "-fPIC", "-O2", "-std=gnu11", "-pthread", "-fvisibility=hidden")
WARNINGS = ("-Wall", "-Wextra", "-Werror")


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
    out = CACHE / _digest(include)[:16]
    library = out / "libnvidia-ml.so.1"
    if library.is_file():
        return out
    out.mkdir(parents=True, exist_ok=True)
    tmp = out / f"libnvidia-ml.so.1.{os.getpid()}"
    done = subprocess.run(
        [compiler(), *FLAGS, *WARNINGS, f"-I{include}", "-o", str(tmp), *map(str, SOURCES)],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode:
        raise BuildError(f"building {LIB.name}/ failed:\n{done.stderr}")
    tmp.replace(library)
    return out


def _digest(include: Path) -> str:
    """What the library is made of: each source and header by name, nvml.h, the flags."""
    h = hashlib.sha256()
    for path in [*SOURCES, *HEADERS, include / "nvml.h"]:
        data = path.read_bytes()
        h.update(f"{path.name}\0{len(data)}\0".encode() + data)
    h.update("\0".join([*FLAGS, *WARNINGS]).encode())
    return h.hexdigest()


def nvml_env(state: Path, base: dict[str, str] | None = None) -> dict[str, str]:
    """Environment for a subprocess whose pynvml loads the test library on `state`."""
    env = dict(os.environ if base is None else base)
    env["LD_LIBRARY_PATH"] = str(build())
    env[STATE_ENV] = str(state)
    return env
