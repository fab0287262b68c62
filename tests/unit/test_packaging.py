"""The wheel holds every module and data file of agents/ (one left out imports in the
checkout and fails in the image), and setuptools builds it without a warning."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BUILD_WITHIN = 120.0  # about 4 s alone; longer on a loaded 2-core machine


def test_wheel_holds_every_file_of_agents_and_builds_without_a_warning(tmp_path: Path) -> None:
    source = tmp_path / "src"  # a copy: the build writes build/ and egg-info beside it
    source.mkdir()
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(ROOT / name, source / name)
    shutil.copytree(
        ROOT / "agents", source / "agents", ignore=shutil.ignore_patterns("__pycache__")
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    build = "import sys; from setuptools import build_meta as b; print(b.build_wheel(sys.argv[1]))"
    done = subprocess.run(
        [sys.executable, "-c", build, str(tmp_path)],
        cwd=source,
        env=env,
        capture_output=True,
        text=True,
        timeout=BUILD_WITHIN,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    output = done.stdout + done.stderr
    assert "warning" not in output.lower(), output
    assert "deprecat" not in output.lower(), output
    wheel = tmp_path / done.stdout.strip().splitlines()[-1]
    with zipfile.ZipFile(wheel) as archive:
        shipped = set(archive.namelist())
    wanted = {
        path.relative_to(source).as_posix()
        for path in (source / "agents").rglob("*")
        if path.is_file()
    }
    assert wanted - shipped == set()
    assert {f"agents/sim/nodes/{n}.yaml" for n in ("h100-8gpu-8nic", "mig-mixed")} <= shipped
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in shipped)
