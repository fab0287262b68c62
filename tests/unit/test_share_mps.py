"""DRA shares' MPS daemon keeper (agents/gpu/share_mps.py) on the simulator's NVML with a
control program in memory: a claim of two GPUs' shares whose second GPU refuses its mode
leaves the first as it was, a restored GPU that refuses does not undo the others, and a
fresh share starts a daemon that is down or fails naming why; where the pipe directory
cannot be made, shares get no MPS limits."""

from __future__ import annotations

from pathlib import Path

import pytest
from structlog.testing import capture_logs

from agents.config_shares import Shares
from agents.errors import BackendError
from agents.gpu.mps import MpsDaemonDown
from agents.gpu.share_mps import ShareDaemon
from agents.gpu.shares import share_daemon
from agents.sim.bundled import bundled_node
from agents.sim.node import load_node
from agents.sim.nvml import SimNvml

EXCLUSIVE, DEFAULT = "EXCLUSIVE_PROCESS", "DEFAULT"


class Refusing(SimNvml):
    """NVML that will not set the compute mode of the GPUs in `refused`."""

    refused: frozenset[str] = frozenset()

    def set_compute_mode(self, uuid: str, mode: str) -> None:
        if uuid in self.refused:
            raise BackendError(f"NVML set compute mode of {uuid}: Insufficient Permissions")
        super().set_compute_mode(uuid, mode)


class Control:
    """A control program whose daemon runs once started (unless it will not start)."""

    def __init__(self, *, starts: bool = True) -> None:
        self.running = False
        self.starts = starts
        self.told: list[str] = []

    def start(self, pipe_dir: str, log_dir: str) -> None:
        if not self.starts:
            raise BackendError("nvidia-cuda-mps-control -d: exit status 1")
        self.running = True

    def send(self, pipe_dir: str, log_dir: str, command: str) -> str:
        if not self.running:
            raise BackendError("Cannot find MPS control daemon process")
        self.told.append(command)
        return ""


def keeper(tmp_path: Path, control: Control) -> tuple[ShareDaemon, Refusing, list[str]]:
    spec = load_node(bundled_node("h100-8gpu-8nic"))
    nvml = Refusing(spec)
    nvml.init()
    daemon = ShareDaemon(
        control, str(tmp_path / "p"), str(tmp_path / "l"), str(tmp_path / "s"), nvml
    )
    return daemon, nvml, [g.uuid for g in spec.gpus]


def test_a_claim_whose_second_gpu_refuses_leaves_the_first_as_it_was(tmp_path: Path) -> None:
    daemon, nvml, (a, b, c, *_) = keeper(tmp_path, Control())
    assert daemon.ensure() is None
    daemon.hold(frozenset({c}), frozenset({c}))
    nvml.refused = frozenset({b})
    with pytest.raises(BackendError, match=f"GPU {b}: compute mode {EXCLUSIVE} not set"):
        daemon.hold(frozenset({a, b, c}), frozenset({a, b}))
    assert [nvml.compute_mode(u) for u in (a, b, c)] == [DEFAULT, DEFAULT, EXCLUSIVE]
    assert daemon.holding == {c}


def test_a_restored_gpu_that_refuses_is_logged_and_the_others_set(tmp_path: Path) -> None:
    daemon, nvml, (a, b, *_) = keeper(tmp_path, Control())
    nvml.refused = frozenset({a})
    with capture_logs() as logs:
        daemon.hold(frozenset({a, b}), frozenset())
    assert nvml.compute_mode(b) == EXCLUSIVE
    assert [e["gpu"] for e in logs if e["event"] == "gpu_compute_mode_unset"] == [a]
    assert daemon.holding == {a, b}


def test_a_fresh_share_starts_a_daemon_that_is_down_or_fails_saying_why(tmp_path: Path) -> None:
    control = Control(starts=False)
    daemon, nvml, (a, *_) = keeper(tmp_path, control)
    assert daemon.ensure() == "nvidia-cuda-mps-control -d: exit status 1"
    with pytest.raises(BackendError, match=r"no MPS control daemon runs at .*exit status 1"):
        daemon.hold(frozenset({a}), frozenset({a}))
    assert nvml.compute_mode(a) == DEFAULT and daemon.holding == frozenset()
    daemon.hold(frozenset({a}), frozenset())  # restored: no start needed to keep its mode
    assert daemon.cause(a) == MpsDaemonDown("gpu.nvidia.com shares")
    control.starts = True
    daemon.hold(frozenset({a}), frozenset({a}))
    assert daemon.down == set() and daemon.cause(a) is None
    assert control.told == []  # no limits of its own: the clients' come from their env


def test_where_the_pipe_directory_cannot_be_made_shares_get_no_mps_limits(
    tmp_path: Path,
) -> None:
    (tmp_path / "run").write_text("a file, as a read-only root refuses a directory")
    nvml = Refusing(load_node(bundled_node("h100-8gpu-8nic")))
    control = Control()
    with capture_logs() as logs:
        assert share_daemon(Shares(by_claims=True), control, nvml, str(tmp_path)) is None
    [warning] = [e for e in logs if e["event"] == "gpu_shares_unenforced"]
    assert "cannot be made" in warning["reason"] and not control.running
