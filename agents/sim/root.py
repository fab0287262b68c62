"""Where a simulated node's tree lives: a fresh temporary directory, or the agent's own
subtree of an operator's `--simulate-root` (in a pod, a hostPath at the same path)."""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

from agents.errors import ConfigError

SUBTREE = "node-agent-sim"  # the agent's own part of --simulate-root, the same every run
# The simulated host's runtime state, which outlives an agent as a host's /run does: the
# MPS control daemon's pipes and shared memory (flags.mpsRoot, /run/nvidia/mps) that
# running pods have mounted and a restarted agent finds its daemon by.
KEPT = "run"
PREFIX = "node-agent-sim-"


@contextlib.contextmanager
def sim_root(parent: Path | None, temp_parent: str | None = None) -> Iterator[Path]:
    """The root of the simulated tree, removed when the context ends.

    Without `parent`: a fresh directory under `temp_parent` (None: the temp dir). With
    it: `parent/node-agent-sim`, a fixed name so that the device paths a kubelet keeps
    for its containers are the same after the agent restarts; one left by a killed run
    is replaced, so one agent at a time may use a `parent` (a DaemonSet's rolling
    update, without surge, stops the old pod first), all but its KEPT runtime state.
    `parent` is created when missing and removed only when created here (and nothing
    is kept).
    """
    if parent is None:
        with tempfile.TemporaryDirectory(prefix=PREFIX, dir=temp_parent) as temp:
            yield Path(temp)
        return
    created = _make_parent(parent)
    own = parent / SUBTREE
    try:
        _clear(own)
        own.mkdir(exist_ok=True)
    except OSError as exc:
        raise ConfigError(str(parent), "--simulate-root", f"a writable directory ({exc})") from exc
    try:
        yield own
    finally:
        _clear(own)
        if created and not own.exists():
            shutil.rmtree(parent, ignore_errors=True)


def _clear(own: Path) -> None:
    """Remove the tree but what KEPT holds; `own` goes too where that holds no file."""
    kept = own / KEPT
    if not (kept.is_dir() and any(not p.is_dir() for p in kept.rglob("*"))):
        shutil.rmtree(own, ignore_errors=True)
        return
    for entry in own.iterdir():
        if entry.name == KEPT:
            continue
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry, ignore_errors=True)
        else:
            entry.unlink(missing_ok=True)


def _make_parent(parent: Path) -> bool:
    """Create `parent` if it is missing; True when this call created it."""
    if parent.is_dir():
        return False
    try:
        parent.mkdir(parents=True)
    except FileExistsError as exc:
        raise ConfigError(str(parent), "--simulate-root", "a directory") from exc
    except OSError as exc:
        raise ConfigError(str(parent), "--simulate-root", f"a directory ({exc})") from exc
    return True
