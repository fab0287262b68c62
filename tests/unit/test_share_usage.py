"""Each pod's GPU memory beside its share, as values: shares summed per claim and GPU,
processes summed per pod, pods unknown to the claims found, and one episode per time
a pod goes over its share."""

from __future__ import annotations

from agents.core.pod_cgroup import PodCgroup
from agents.dra.claim_checkpoint import PreparedClaim, PreparedDevice
from agents.hw.nvml import GpuProcess
from agents.share_usage import Episodes, Share, ShareUse, shares_of, strangers, uses_of

GIB = 2**30
GPU = "GPU-0"


def device(share_id: str, memory: str, gpu: str = GPU) -> PreparedDevice:
    consumed = {"memory": memory, "compute": "25"} if memory else {"compute": "25"}
    return PreparedDevice(
        "gpu-0",
        ("r",),
        "node",
        (),
        resource="nvidia.com/gpu",
        device_id=gpu,
        share_id=share_id,
        consumed=consumed,
    )


def test_a_claims_shares_of_one_gpu_add_up_and_whole_gpus_or_memoryless_shares_do_not_count() -> (
    None
):
    prepared = {
        "a": PreparedClaim("ns", "c-a", (device("s1", "10Gi"), device("s2", "2Gi"))),
        "b": PreparedClaim("ns2", "c-b", (device("s3", "512Mi", "GPU-1"),)),
        "whole": PreparedClaim("ns", "w", (device("", "80Gi"),)),
        "compute": PreparedClaim("ns", "k", (device("s4", ""),)),
    }
    assert shares_of(prepared) == [
        Share("a", "ns", "c-a", "nvidia.com/gpu", GPU, 12 * GIB),
        Share("b", "ns2", "c-b", "nvidia.com/gpu", "GPU-1", 512 * 2**20),
    ]


SHARE = Share("a", "ns", "c-a", "nvidia.com/gpu", GPU, 10 * GIB)


def test_each_pod_of_the_claim_sums_its_processes_and_an_unread_gpu_gives_none() -> None:
    placed = {
        GPU: (
            (GpuProcess(1, 4 * GIB), PodCgroup("u1", "c")),
            (GpuProcess(2, None), PodCgroup("u1", "c")),  # NVML gave no figure
            (GpuProcess(3, 7 * GIB), PodCgroup("u1", "d")),
            (GpuProcess(4, 50 * GIB), None),  # outside every pod
            (GpuProcess(5, 9 * GIB), PodCgroup("stranger", "e")),
        )
    }
    pods = {"a": {"u1": "p1", "u2": "p2"}}
    assert uses_of([SHARE], placed, pods) == [
        ShareUse(SHARE, "p1", "u1", 11 * GIB),
        ShareUse(SHARE, "p2", "u2", 0),
    ]
    assert uses_of([SHARE], {}, pods) == [
        ShareUse(SHARE, "p1", "u1", None),
        ShareUse(SHARE, "p2", "u2", None),
    ]
    assert strangers([SHARE], placed, pods) == {"a": {"stranger"}}
    assert strangers([SHARE], placed, {"a": {"u1": "p1", "stranger": "s"}}) == {}


def test_a_pod_over_its_share_begins_one_episode_until_it_is_back_within() -> None:
    episodes = Episodes()

    def use(used: int | None) -> ShareUse:
        return ShareUse(SHARE, "p1", "u1", used)

    assert episodes.begun([use(10 * GIB)]) == []  # at the limit is within it
    assert episodes.begun([use(11 * GIB)]) == [use(11 * GIB)]
    assert episodes.begun([use(12 * GIB)]) == []
    assert episodes.begun([use(None)]) == []  # NVML did not answer: no news
    assert episodes.begun([use(12 * GIB)]) == []
    assert episodes.begun([use(GIB)]) == []
    assert episodes.begun([use(11 * GIB)]) == [use(11 * GIB)]
    assert episodes.begun([]) == []  # the pod left the claim
    assert episodes.begun([use(11 * GIB)]) == [use(11 * GIB)]
