"""The MPS control daemon started for real, with the simulator's twin of the program: in
place, as on the host itself or in a container that may not leave, and the host launch's
script run against a temporary directory standing in for the host's cgroup root (never
this machine's cgroups; the namespaces it enters on the host are left out)."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import structlog

from agents.hw.mps_control import LOG_VARIABLE, PIPE_VARIABLE, MpsControlBinary
from agents.hw.mps_launch import (
    CGROUP,
    ESCAPE,
    PROC,
    SCRIPT,
    UNSHARE,
    CgroupLaunch,
    HostLaunch,
    nsenter,
)
from agents.sim.mps_control import PID_FILE, install_twin

PROBE = "get_default_active_thread_percentage"


@pytest.fixture
def twin(tmp_path: Path) -> Iterator[MpsControlBinary]:
    """The twin, run in place; whatever daemon a test started is told to quit."""
    control = MpsControlBinary(str(install_twin(tmp_path / "bin-root")))
    yield control
    pipe, log = dirs(tmp_path)
    if (Path(pipe) / PID_FILE).exists():
        control.send(pipe, log, "quit")


def dirs(tmp_path: Path) -> tuple[str, str]:
    return str(tmp_path / "mps" / "nvidia.com" / "gpu" / "pipe"), str(tmp_path / "mps" / "log")


def test_in_place_it_starts_and_answers_beside_the_agent(
    tmp_path: Path, twin: MpsControlBinary
) -> None:
    found = MpsControlBinary.find(roots=(str(tmp_path / "bin-root"),), proc=PROC)
    assert found is not None and found.binary == twin.binary
    if found.host is not None:
        pytest.skip("these tests run in a container sharing the host's PID namespace")
    pipe, log = dirs(tmp_path)
    found.start(pipe, log)
    assert found.send(pipe, log, PROBE) == "100.0"


def test_a_daemon_that_a_rollout_would_stop_is_said_so_once(
    tmp_path: Path, twin: MpsControlBinary
) -> None:
    control = MpsControlBinary(twin.binary, warning="no hostPID")
    pipe, log = dirs(tmp_path)
    with structlog.testing.capture_logs() as logs:
        control.start(pipe, log)
        control.send(pipe, log, "quit")
        control.start(pipe, log)
    said = [e for e in logs if e["event"] == "mps_daemon_in_agent_container"]
    assert [e["reason"] for e in said] == ["no hostPID"]
    assert "rollout" in said[0]["effect"] and "hostPID: true" in said[0]["fix"]


@pytest.mark.parametrize("version", ["v1", "v2"])
def test_the_host_script_moves_itself_to_its_cgroup_then_becomes_the_daemon(
    tmp_path: Path, twin: MpsControlBinary, version: str
) -> None:
    proc = tmp_path / "proc"
    cgroups = proc / "1" / "root" / "sys" / "fs" / "cgroup"
    hierarchies = ["cpuset", "memory"] if version == "v1" else ["."]
    for name in hierarchies:
        (cgroups / name / CGROUP).mkdir(parents=True)
        (cgroups / name / "cgroup.procs").write_text("1\n")
    if version == "v1":  # as the kernel makes a cpuset: empty, taking no process yet
        (cgroups / "cpuset" / "cpuset.cpus").write_text("0-15\n")
        (cgroups / "cpuset" / "cpuset.mems").write_text("0-1\n")
        for name in ("cpuset.cpus", "cpuset.mems"):
            (cgroups / "cpuset" / CGROUP / name).write_text("")
    else:
        (cgroups / "cgroup.controllers").write_text("cpu memory pids\n")
    pipe, log = dirs(tmp_path)
    command = HostLaunch(twin.binary, "/", proc).start(pipe)
    shell = command[len(nsenter(1)) + len(UNSHARE) :]
    assert shell[:4] == ["/bin/sh", "-c", SCRIPT, CGROUP]
    shell[4] = str(cgroups)  # the host's cgroup root, here a stand-in for it
    assert shell[5:7] == ["", "/"]  # no shared memory to bind (nothing mounted), no chroot
    env = {"PATH": "/usr/bin:/bin", PIPE_VARIABLE: pipe, LOG_VARIABLE: log}
    with subprocess.Popen(shell, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE) as sh:
        _, err = sh.communicate(timeout=30)
    assert sh.returncode == 0, err
    for name in hierarchies:
        assert (cgroups / name / CGROUP / "cgroup.procs").read_text() == f"{sh.pid}\n"
    if version == "v1":
        assert (cgroups / "cpuset" / CGROUP / "cpuset.cpus").read_text() == "0-15\n"
        assert (cgroups / "cpuset" / CGROUP / "cpuset.mems").read_text() == "0-1\n"
    assert twin.send(pipe, log, PROBE) == "100.0"


def test_the_simulators_twin_leaves_the_agents_cgroup_but_not_its_filesystem(
    tmp_path: Path, twin: MpsControlBinary
) -> None:
    """In a pod sharing the host's PID namespace a simulated node's daemon (the twin, a
    program of the agent's image) moves to a cgroup of its own, as the driver's does."""
    proc = tmp_path / "proc"
    cgroups = proc / "7" / "root" / "sys" / "fs" / "cgroup"
    (cgroups / CGROUP).mkdir(parents=True)
    (cgroups / "cgroup.procs").write_text("1\n")
    (cgroups / "cgroup.controllers").write_text("cpu memory pids\n")
    launch = CgroupLaunch(twin.binary, proc, 7)
    pipe, log = dirs(tmp_path)
    command = launch.start(pipe)
    assert command[:5] == ["nsenter", "--target", "7", "--cgroup", "--"]
    shell = command[5:]
    assert shell == ["/bin/sh", "-c", ESCAPE, CGROUP, str(cgroups), twin.binary, "."]
    env = {"PATH": "/usr/bin:/bin", PIPE_VARIABLE: pipe, LOG_VARIABLE: log}
    with subprocess.Popen(shell, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE) as sh:
        _, err = sh.communicate(timeout=30)
    assert sh.returncode == 0, err
    assert (cgroups / CGROUP / "cgroup.procs").read_text() == f"{sh.pid}\n"
    assert launch.send() == [twin.binary]  # told commands in place, as before
    assert twin.send(pipe, log, PROBE) == "100.0"
