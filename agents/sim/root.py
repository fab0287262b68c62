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
PREFIX = "node-agent-sim-"


@contextlib.contextmanager
def sim_root(parent: Path | None, temp_parent: str | None = None) -> Iterator[Path]:
    """The root of the simulated tree, removed when the context ends.

    Without `parent`: a fresh directory under `temp_parent` (None: the temp dir). With
    it: `parent/node-agent-sim`, a fixed name so that the device paths a kubelet keeps
    for its containers are the same after the agent restarts; one left by a killed run
    is replaced, so one agent at a time may use a `parent` (a DaemonSet's rolling
    update, without surge, stops the old pod first). `parent` is created when missing
    and removed only when created here.
    """
    if parent is None:
        with tempfile.TemporaryDirectory(prefix=PREFIX, dir=temp_parent) as temp:
            yield Path(temp)
        return
    created = _make_parent(parent)
    own = parent / SUBTREE
    try:
        shutil.rmtree(own, ignore_errors=True)
        own.mkdir()
    except OSError as exc:
        raise ConfigError(str(parent), "--simulate-root", f"a writable directory ({exc})") from exc
    try:
        yield own
    finally:
        shutil.rmtree(parent if created else own, ignore_errors=True)


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
