"""Which pod and container a process runs in, read from its /proc/<pid>/cgroup: the
kubelet puts each pod in a cgroup named after its UID, and each container in one named
after its ID, under either cgroup driver (cgroupfs, systemd) and either cgroup version."""

from __future__ import annotations

import re
from dataclasses import dataclass

# A pod's cgroup: `pod<uid>` (cgroupfs) or `kubepods[-<qos>]-pod<uid with '_'>.slice`
# (systemd), after the QoS class's own (`burstable`, `besteffort`; none: Guaranteed).
_POD = re.compile(
    r"^(?:kubepods(?:-[a-z]+)*-)?pod"
    r"([0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12})"
    r"(?:\.slice)?$"
)
# A container's cgroup below its pod's: the ID alone (cgroupfs), or the runtime's scope
# (`cri-containerd-<id>.scope`, `crio-<id>.scope`, `docker-<id>.scope`).
_CONTAINER = re.compile(r"^(?:[a-z][a-z-]*-)?([0-9a-f]{64})(?:\.scope)?$")


@dataclass(frozen=True)
class PodCgroup:
    pod_uid: str  # the pod's metadata.uid, with dashes
    container_id: str  # the runtime's container ID (64 hex digits); "" where not named


def pod_of(cgroup_text: str) -> PodCgroup | None:
    """The pod (and container) of the first line of a /proc/<pid>/cgroup text whose path
    names one (v1 lists one line per hierarchy, v2 one `0::` line); None for a process
    outside every pod (the host's, a system service's)."""
    for line in cgroup_text.splitlines():
        _, _, path = line.partition(":")
        _, _, path = path.partition(":")
        found = _in_path(path)
        if found is not None:
            return found
    return None


def _in_path(path: str) -> PodCgroup | None:
    parts = [p for p in path.split("/") if p]
    for i in range(len(parts) - 1, -1, -1):
        # containerd's systemd form where it may not make the scope itself (a node in a
        # container, as kind's): `<pod slice>:<prefix>:<container ID>` in one part.
        slice_, _, scoped = parts[i].partition(":")
        pod = _POD.match(slice_)
        if pod is None:
            continue
        child = scoped.rpartition(":")[2] if scoped else (parts[i + 1 :] or [""])[0]
        below = _CONTAINER.match(child)
        return PodCgroup(pod.group(1).replace("_", "-"), below.group(1) if below else "")
    return None
