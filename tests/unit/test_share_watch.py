"""One round of the share watch at a time, over a stand-in NVML, a /proc in a temporary
directory and a counted claim read: each claim read once, again only for a pod new to
its GPU; NVML's PIDs missing from /proc said once; a failing claim read asked again
only after its wait."""

from __future__ import annotations

from pathlib import Path

import pytest
from structlog.testing import capture_logs

from agents.dra.claim_checkpoint import PreparedClaim, PreparedDevice
from agents.dra.claims import Claim, ClaimUnreadableError, PodRef
from agents.dra.driver import ClaimRef
from agents.hw.nvml import GpuProcess
from agents.hw.procfs import Procfs
from agents.share_watch import CLAIM_RETRY_S, ShareWatch

GPU = "GPU-0"
UID_A = "3f2a1b4c-5d6e-4f70-8a9b-0c1d2e3f4a5b"
UID_B = "9e8d7c6b-5a49-4837-a261-504f3e2d1c0b"
PREPARED = {
    "a": PreparedClaim(
        "ns",
        "c-a",
        (
            PreparedDevice(
                "gpu-0",
                ("r",),
                "n",
                (),
                resource="nvidia.com/gpu",
                device_id=GPU,
                share_id="s",
                consumed={"memory": "1Gi"},
            ),
        ),
    )
}


class Nvml:
    def __init__(self) -> None:
        self.listed: tuple[GpuProcess, ...] = ()

    def processes(self, uuid: str) -> tuple[GpuProcess, ...]:
        return self.listed


class Claims:
    def __init__(self) -> None:
        self.reads = 0
        self.pods = [PodRef(UID_A, "pa")]
        self.fail = False

    async def read(self, ref: ClaimRef) -> Claim:
        self.reads += 1
        if self.fail:
            raise ClaimUnreadableError("API server away")
        return Claim(ref.namespace, ref.name, ref.uid, (), (), tuple(self.pods))


def in_pod(proc: Path, pid: int, uid: str) -> None:
    (proc / str(pid)).mkdir(parents=True)
    (proc / str(pid) / "cgroup").write_text(f"0::/kubepods/burstable/pod{uid}/\n")


class Clock:
    now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def parts(tmp_path: Path) -> tuple[ShareWatch, Nvml, Claims, Clock]:
    nvml, claims, clock = Nvml(), Claims(), Clock()
    watch = ShareWatch(
        lambda: PREPARED, nvml, Procfs(tmp_path), claims.read,
        events=None, period_s=5.0, clock=clock,
    )  # fmt: skip
    in_pod(tmp_path, 10, UID_A)
    in_pod(tmp_path, 20, UID_B)
    return watch, nvml, claims, clock


async def test_a_claim_is_read_once_and_again_only_for_a_pod_new_on_its_gpu(
    parts: tuple[ShareWatch, Nvml, Claims, Clock],
) -> None:
    watch, nvml, claims, _ = parts
    nvml.listed = (GpuProcess(10, 2**29),)
    await watch.round()
    await watch.round()
    assert claims.reads == 1
    assert [(u.pod, u.used_bytes) for u in watch.uses] == [("pa", 2**29)]
    nvml.listed = (GpuProcess(10, 2**29), GpuProcess(20, 2**30))  # pb, unknown yet
    await watch.round()
    await watch.round()
    assert claims.reads == 2  # read again once, and pb is still not reserved
    claims.pods.append(PodRef(UID_B, "pb"))
    nvml.listed = (GpuProcess(10, 1), GpuProcess(20, 2**30), GpuProcess(30, 5))
    await watch.round()
    assert claims.reads == 2  # no new stranger: pid 30 is in no pod of this /proc
    nvml.listed = (GpuProcess(10, 1),)  # pb's process ends: it is a stranger no more
    await watch.round()
    nvml.listed = (GpuProcess(10, 1), GpuProcess(20, 2**30))  # and is back: asked anew
    await watch.round()
    assert claims.reads == 3
    assert [(u.pod, u.used_bytes) for u in watch.uses] == [("pa", 1), ("pb", 2**30)]


async def test_a_claim_that_cannot_be_read_is_asked_again_after_its_wait(
    parts: tuple[ShareWatch, Nvml, Claims, Clock],
) -> None:
    watch, _, claims, clock = parts
    claims.fail = True
    with capture_logs() as logs:
        await watch.round()
        await watch.round()
    assert claims.reads == 1
    assert [e["event"] for e in logs] == ["gpu_share_claim_unread"]
    assert not watch.uses
    claims.fail = False
    clock.now += CLAIM_RETRY_S
    await watch.round()
    assert claims.reads == 2
    assert [u.pod for u in watch.uses] == ["pa"]


async def test_nvml_pids_missing_from_proc_are_said_once(
    parts: tuple[ShareWatch, Nvml, Claims, Clock],
) -> None:
    watch, nvml, _, _ = parts
    nvml.listed = (GpuProcess(4000, 1), GpuProcess(4001, 1))
    with capture_logs() as logs:
        await watch.round()
        await watch.round()
    assert [e["event"] for e in logs] == ["gpu_processes_not_in_proc"]
    assert "hostPID: true" in logs[0]["effect"]
