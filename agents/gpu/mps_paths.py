"""Where an MPS control daemon's pipes, logs and shared memory live under `flags.mpsRoot`,
laid out as NVIDIA's plugin v0.20 lays them out: one daemon per resource."""

from __future__ import annotations

import posixpath

from agents.core.device import Mount
from agents.hw.mps_control import PIPE_VARIABLE

CONTAINER_ROOT = "/mps"  # where a container sees the root (NVIDIA's daemon container too)
SHM_IN_CONTAINER = "/dev/shm"


def pipe_dir(root: str, resource: str) -> str:
    """The daemon's pipe directory for `resource` under `root`."""
    return posixpath.join(root, resource, "pipe")


def log_dir(root: str, resource: str) -> str:
    return posixpath.join(root, resource, "log")


def shm_dir(root: str) -> str:
    """The shared memory of every daemon under `root`: the containers' /dev/shm."""
    return posixpath.join(root, "shm")


def client_env(resource: str) -> dict[str, str]:
    """What a client container is told: the pipe directory as it sees it."""
    return {PIPE_VARIABLE: pipe_dir(CONTAINER_ROOT, resource)}


def client_mounts(host_root: str, resource: str) -> tuple[Mount, ...]:
    """The pipe directory and the shared memory, writable, from the host's root."""
    return (
        Mount(pipe_dir(CONTAINER_ROOT, resource), pipe_dir(host_root, resource), read_only=False),
        Mount(SHM_IN_CONTAINER, shm_dir(host_root), read_only=False),
    )
