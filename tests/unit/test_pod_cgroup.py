"""A process's pod and container from its /proc/<pid>/cgroup, under both cgroup drivers
and both cgroup versions, and no pod for the host's own processes."""

from __future__ import annotations

import pytest

from agents.core.pod_cgroup import PodCgroup, pod_of

UID = "3f2a1b4c-5d6e-4f70-8a9b-0c1d2e3f4a5b"
SYSTEMD_UID = UID.replace("-", "_")
ID = "0123456789abcdef" * 4

CASES = [
    ("cgroupfs-v1-burstable", f"12:memory:/kubepods/burstable/pod{UID}/{ID}\n", (UID, ID)),
    ("cgroupfs-v1-guaranteed", f"4:cpu,cpuacct:/kubepods/pod{UID}/{ID}\n", (UID, ID)),
    ("cgroupfs-v2", f"0::/kubepods/besteffort/pod{UID}/{ID}\n", (UID, ID)),
    (
        "systemd-v2-containerd",
        "0::/kubepods.slice/kubepods-burstable.slice/"
        f"kubepods-burstable-pod{SYSTEMD_UID}.slice/cri-containerd-{ID}.scope\n",
        (UID, ID),
    ),
    (
        "systemd-v2-guaranteed-crio",
        f"0::/kubepods.slice/kubepods-pod{SYSTEMD_UID}.slice/crio-{ID}.scope\n",
        (UID, ID),
    ),
    (
        "systemd-v1-docker-among-hierarchies",
        "13:rdma:/\n12:pids:/kubepods.slice/kubepods-besteffort.slice/"
        f"kubepods-besteffort-pod{SYSTEMD_UID}.slice/docker-{ID}.scope\n",
        (UID, ID),
    ),
    (
        "nested-kind-node",
        "0::/system.slice/containerd.service/"
        f"kubepods-besteffort-pod{SYSTEMD_UID}.slice:cri-containerd:{ID}\n",
        (UID, ID),
    ),
    ("pod-cgroup-itself", f"0::/kubepods/burstable/pod{UID}\n", (UID, "")),
    ("host-service", "0::/system.slice/sshd.service\n", None),
    ("root", "0::/\n", None),
    ("not-a-uid", "0::/kubepods/burstable/podnotauid/x\n", None),
    ("empty", "", None),
]


@pytest.mark.parametrize(("text", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_a_cgroup_text_names_the_pod_and_container_the_kubelet_made(
    text: str, expected: tuple[str, str] | None
) -> None:
    assert pod_of(text) == (None if expected is None else PodCgroup(*expected))
