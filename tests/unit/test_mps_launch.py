"""Where the MPS control daemon is started: the choice between the host and the agent's own
container, the host's program and cgroup hierarchies found through a stand-in for /proc,
and the commands built; nothing here runs them."""

from __future__ import annotations

from pathlib import Path

import pytest

from agents.hw.mps_control import MpsControlBinary
from agents.hw.mps_launch import (
    BINARY,
    CGROUP,
    SCRIPT,
    UNSHARE,
    HostLaunch,
    cgroup_hierarchies,
    nsenter,
    shm_dir,
    where,
)

V1 = ("blkio", "cpu,cpuacct", "cpuset", "devices", "memory", "pids", "systemd", "unified")


def proc(
    tmp_path: Path,
    host_ns: str | None,
    ours: str = "mnt:[4026531840]",
    ancestors: tuple[tuple[int, str | None], ...] = (),
) -> Path:
    """A stand-in for /proc: PID 1's and our own mount namespace links (PID 1's left out,
    as where the agent may not read it, when `host_ns` is None), and our ancestors', the
    parent first, each with its `stat` naming its parent, the last one's PID 1."""
    root = tmp_path / "proc"
    pids = [pid for pid, _ in ancestors] + [1]
    chain = [
        ("self", ours, pids[0]),
        *((str(p), ns, pids[i + 1]) for i, (p, ns) in enumerate(ancestors)),
    ]
    for pid, ns, parent in [("1", host_ns, 0), *chain]:
        (root / pid / "ns").mkdir(parents=True)
        (root / pid / "stat").write_text(f"{pid} (a) b) S {parent} 1 1 0\n")
        if ns is not None:
            (root / pid / "ns" / "mnt").symlink_to(ns)
    return root


def program(proc_root: Path, driver_root: str = "/", pid: int = 1) -> None:
    path = proc_root / str(pid) / "root" / driver_root.lstrip("/") / "usr" / "bin" / BINARY
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\n")


def v1_cgroups(root: Path) -> None:
    for name in V1:
        (root / name).mkdir(parents=True)
        (root / name / "cgroup.procs").write_text("")
    for link, target in (("cpu", "cpu,cpuacct"), ("cpuacct", "cpu,cpuacct")):
        (root / link).symlink_to(target)


def test_a_container_sharing_the_hosts_pid_namespace_starts_it_on_the_host(
    tmp_path: Path,
) -> None:
    assert where(proc(tmp_path, "mnt:[4026531841]"), {}).host


@pytest.mark.parametrize(
    ("host_ns", "environ", "warning"),
    [
        ("mnt:[4026531840]", {}, ""),  # the agent on the host: tests, --simulate, systemd
        (
            "mnt:[4026531840]",
            {"KUBERNETES_SERVICE_HOST": "10.96.0.1"},
            "the agent's pod does not share the host's PID namespace",
        ),
        (None, {}, "PID 1's mount namespace is not readable: No such file or directory"),
    ],
)
def test_elsewhere_it_starts_in_place_saying_why_where_a_rollout_would_stop_it(
    tmp_path: Path, host_ns: str | None, environ: dict[str, str], warning: str
) -> None:
    placed = where(proc(tmp_path, host_ns), environ)
    assert not placed.host and placed.warning == warning


def test_where_pid_1_keeps_its_namespaces_the_nearest_ancestor_outside_is_the_host(
    tmp_path: Path,
) -> None:
    # The agent (its mount namespace), an unreadable ancestor, one in the same namespace,
    # then the runtime's shim in the node's, then PID 1 which nobody may read.
    ancestors = ((40, None), (30, "mnt:[4026531840]"), (20, "mnt:[4026531832]"), (10, None))
    placed = where(proc(tmp_path, None, ancestors=ancestors), {})
    assert placed.host and placed.pid == 20
    root = proc(tmp_path / "none", None, ancestors=((30, "mnt:[4026531840]"),))
    assert not where(root, {}).host  # all of them in the agent's own


def test_a_found_host_is_entered_through_that_pid(tmp_path: Path) -> None:
    root = proc(tmp_path, None, ancestors=((20, "mnt:[1]"),))
    program(root, pid=20)
    found = MpsControlBinary.find(roots=(), proc=root)
    assert found is not None and found.host == HostLaunch(f"/usr/bin/{BINARY}", "/", root, 20)
    assert found.host.send() == [*nsenter(20), f"/usr/bin/{BINARY}"]


@pytest.mark.parametrize("driver_root", ["/", "/run/nvidia/driver"])
def test_the_hosts_program_is_found_under_its_driver_root_as_the_host_names_it(
    tmp_path: Path, driver_root: str
) -> None:
    root = proc(tmp_path, "mnt:[1]")
    program(root, driver_root)
    assert HostLaunch.find(root) == HostLaunch(f"/usr/bin/{BINARY}", driver_root, root)


def test_an_absolute_link_on_the_host_counts_though_it_cannot_be_followed_from_here(
    tmp_path: Path,
) -> None:
    root = proc(tmp_path, "mnt:[1]")
    (root / "1" / "root" / "bin").mkdir(parents=True)
    (root / "1" / "root" / "bin" / BINARY).symlink_to(f"/etc/alternatives/{BINARY}")
    assert HostLaunch.find(root) == HostLaunch(f"/bin/{BINARY}", "/", root)


def test_a_host_without_the_program_has_none_to_start(tmp_path: Path) -> None:
    assert HostLaunch.find(proc(tmp_path, "mnt:[1]")) is None


def test_cgroup_v2_is_one_hierarchy(tmp_path: Path) -> None:
    (tmp_path / "cgroup.controllers").write_text("cpu io memory pids\n")
    (tmp_path / "kubepods.slice").mkdir()
    assert cgroup_hierarchies(tmp_path) == (".",)


def test_cgroup_v1_is_each_mounted_hierarchy_once_links_left_out(tmp_path: Path) -> None:
    v1_cgroups(tmp_path)
    (tmp_path / "not-a-hierarchy").mkdir()
    assert cgroup_hierarchies(tmp_path) == V1
    assert cgroup_hierarchies(tmp_path / "absent") == ()


@pytest.mark.parametrize(
    "resource", ["nvidia.com/gpu", "nvidia.com/gpu.shared", "gpu.nvidia.com", "nvidia.com/shm"]
)
def test_the_clients_shared_memory_is_the_shm_directory_under_the_mps_root(
    tmp_path: Path, resource: str
) -> None:
    root = tmp_path / "run" / "nvidia" / "mps"
    (root / resource / "pipe").mkdir(parents=True)
    assert shm_dir(str(root / resource / "pipe")) is None  # not made yet: none bound
    (root / "shm").mkdir()
    assert shm_dir(str(root / resource / "pipe")) == str(root / "shm")


def test_on_the_host_it_enters_pid_1s_namespaces_and_moves_to_a_cgroup_of_its_own(
    tmp_path: Path,
) -> None:
    root = proc(tmp_path, "mnt:[1]")
    v1_cgroups(root / "1" / "root" / "sys" / "fs" / "cgroup")
    mps = tmp_path / "mps"
    (mps / "shm").mkdir(parents=True)
    launch = HostLaunch(f"/usr/bin/{BINARY}", "/", root)
    command = launch.start(str(mps / "nvidia.com" / "gpu" / "pipe"))
    assert nsenter(1) == ("nsenter", "--target", "1", "--mount", "--cgroup", "--")
    assert UNSHARE == ("unshare", "--mount", "--propagation", "slave", "--")
    shell = [*nsenter(1), *UNSHARE, "/bin/sh", "-c", SCRIPT, CGROUP]
    assert command == [*shell, "/sys/fs/cgroup", str(mps / "shm"), "/", launch.binary, *V1]
    assert launch.send() == [*nsenter(1), f"/usr/bin/{BINARY}"]


def test_a_driver_root_other_than_the_hosts_is_entered_with_chroot(tmp_path: Path) -> None:
    root = proc(tmp_path, "mnt:[1]")
    (root / "1" / "root" / "sys" / "fs" / "cgroup").mkdir(parents=True)
    (root / "1" / "root" / "sys" / "fs" / "cgroup" / "cgroup.controllers").write_text("")
    launch = HostLaunch(f"/usr/bin/{BINARY}", "/run/nvidia/driver", root)
    args = launch.start("/run/nvidia/mps/gpu.nvidia.com/pipe")[len(nsenter(1)) + len(UNSHARE) + 4 :]
    assert args == ["/sys/fs/cgroup", "", "/run/nvidia/driver", launch.binary, "."]
    assert launch.send() == [*nsenter(1), "chroot", "/run/nvidia/driver", launch.binary]


def test_find_prefers_the_hosts_program_from_a_container_sharing_its_pid_namespace(
    tmp_path: Path,
) -> None:
    root = proc(tmp_path, "mnt:[1]")
    program(root)
    found = MpsControlBinary.find(roots=(), proc=root)
    assert found is not None and found.host == HostLaunch(f"/usr/bin/{BINARY}", "/", root)


def test_find_falls_back_to_its_own_program_where_the_host_has_none(tmp_path: Path) -> None:
    own = tmp_path / "driver-root" / "usr" / "bin" / BINARY
    own.parent.mkdir(parents=True)
    own.write_text("#!/bin/sh\n")
    own.chmod(0o755)
    roots = (str(tmp_path / "driver-root"),)
    for host_ns in ("mnt:[1]", "mnt:[4026531840]"):  # on the host, or beside it
        found = MpsControlBinary.find(roots=roots, proc=proc(tmp_path / host_ns, host_ns))
        assert found is not None and found.host is None and found.binary == str(own)


def test_no_program_anywhere_is_none(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    assert MpsControlBinary.find(roots=(str(tmp_path),), proc=proc(tmp_path, "mnt:[1]")) is None
