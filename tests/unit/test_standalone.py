"""The repository stands alone: no file in it reads, names or cites a workshop outside
it (a sibling `shared` folder, its lab scripts, its specification document)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# Built from pieces so that this file does not match itself.
FORBIDDEN = re.compile(
    "|".join(
        [
            r"\.\./" + "shared",  # the workshop beside the checkout
            "/work/" + "shared",  # the same, by its absolute path
            r"\b" + "SP" + r"EC\b",  # its specification, cited instead of our docs
            "k8s-lab/" + r"up\.sh",  # its lab cluster's start script
            "/var/tmp/" + "k8s-lab",  # where that cluster keeps its kubeconfig
        ]
    )
)
NOT_OURS = {".git", ".venv", ".cache", "__pycache__", ".pytest_cache", ".mypy_cache"}
NOT_OURS |= {".ruff_cache", ".hypothesis", "build", "dist"}


def repository_files(root: Path) -> list[Path]:
    """Tracked and new files (git ls-files) in a checkout; in a tree without .git (an
    unpacked archive), every file but virtual environments, caches and build output."""
    git = shutil.which("git")
    if (root / ".git").exists() and git is not None:
        listed = subprocess.run(
            [git, "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
            cwd=root,
            capture_output=True,
            check=True,
        ).stdout.decode()
        return [root / name for name in listed.split("\0") if name and (root / name).is_file()]
    found = []
    for folder, dirs, files in os.walk(root):
        dirs[:] = [d for d in dirs if d not in NOT_OURS and not d.endswith(".egg-info")]
        found += [Path(folder) / f for f in files]
    return found


def mentions(path: Path, root: Path = ROOT) -> list[str]:
    """file:line: text for each line of `path` (named from `root`) that names the workshop."""
    try:
        text = path.read_text(encoding="utf-8")
    except (UnicodeDecodeError, OSError):
        return []  # a binary file (an image, a compiled library) cites nothing
    rel = path.relative_to(root)
    return [
        f"{rel}:{n}: {line.strip()}"
        for n, line in enumerate(text.splitlines(), 1)
        if FORBIDDEN.search(line)
    ]


def test_no_file_names_the_workshop_or_its_specification() -> None:
    files = repository_files(ROOT)
    assert len(files) > 100  # the walk found the repository, not an empty folder
    found = [m for path in files for m in mentions(path)]
    assert not found, "\n".join(found)


def test_the_check_finds_each_pattern_and_names_file_and_line(tmp_path: Path) -> None:
    bad = tmp_path / "docs" / "notes.md"
    bad.parent.mkdir()
    lines = ["fine", "see ../" + "shared/x", "SP" + "EC section 3", "SPECS and aspect are fine"]
    lines += ["eval $(k8s-lab/" + "up.sh)", "/var/tmp/" + "k8s-lab/admin.kubeconfig"]
    bad.write_text("\n".join(lines) + "\n")
    found = mentions(bad, tmp_path)
    assert [m.split(": ", 1)[0] for m in found] == [f"docs/notes.md:{n}" for n in (2, 3, 5, 6)]


def test_a_tree_without_git_is_walked_without_virtual_environments(tmp_path: Path) -> None:
    (tmp_path / ".venv" / "lib").mkdir(parents=True)
    (tmp_path / ".venv" / "lib" / "site.py").write_text("x = 1\n")
    (tmp_path / "agents").mkdir()
    (tmp_path / "agents" / "cli.py").write_text("x = 1\n")
    assert repository_files(tmp_path) == [tmp_path / "agents" / "cli.py"]
