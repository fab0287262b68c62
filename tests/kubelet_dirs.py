"""The kubelet's DRA directories for an agent a test starts: its own unless the test names
them, so that a machine's real ones (a lab's claims, its plugin watcher) never reach a test."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

KUBELET_DIR_FLAGS = ("--kubelet-plugins-dir", "--kubelet-registry-dir", "--cdi-root")


def private_kubelet_dirs(args: Sequence[str], root: Path) -> list[str]:
    """The flags `node-agent run ...` (args) lacks of KUBELET_DIR_FLAGS, under `root`."""
    if not args or args[0] != "run":
        return []
    extra = []
    for flag in KUBELET_DIR_FLAGS:
        if flag not in args:
            extra += [flag, str(root / "kubelet" / flag.removeprefix("--"))]
    return extra
