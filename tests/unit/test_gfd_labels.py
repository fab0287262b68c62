"""The `nvidia.com/` labels as GFD v0.20 writes them, from plain facts (agents/core)."""

from __future__ import annotations

import dataclasses

import pytest

from agents.core.gfd_facts import Fabric, GpuFacts, MigLabels, NodeFacts, Sharing, VgpuHost
from agents.core.gfd_labels import arch_family, fabric_clique, gfd_labels, gpu_mode
from agents.core.gfd_mig import gfd_profile
from agents.core.vgpu import vendor_capability, vgpu_host

CLUSTER = "00000000-0000-0000-0000-000000000001"
ATTACHED = Fabric(CLUSTER, 0, state=3, status=0)
H100 = GpuFacts("NVIDIA H100 80GB HBM3", 81920, "9.0", mig_capable=True, pci_class=0x030200)
A100 = GpuFacts("NVIDIA A100-SXM4-40GB", 40960, "8.0", mig_capable=True, pci_class=0x030200)
MIG_1G = MigLabels("1g.5gb", 4864, 14, 1, 1, 1, 0, 0, 0, 0)
MIG_3G = MigLabels("3g.20gb", 19968, 42, 3, 3, 3, 2, 0, 0, 0)
TS4 = Sharing("time-slicing", {"nvidia.com/gpu": 4})


def node(*gpus: GpuFacts, **kw: object) -> NodeFacts:
    base = NodeFacts(gpus, driver_version="550.163.01", cuda_driver_version="12.4")
    return dataclasses.replace(base, **kw)  # type: ignore[arg-type]


def with_fabric(gpu: GpuFacts, **kw: object) -> GpuFacts:
    return dataclasses.replace(gpu, fabric=dataclasses.replace(ATTACHED, **kw))  # type: ignore[arg-type]


def migged(gpu: GpuFacts, *migs: MigLabels) -> GpuFacts:
    return dataclasses.replace(gpu, mig_enabled=True, migs=migs)


def test_a_whole_h100_node_gets_every_gfd_label_with_gfds_values() -> None:
    labels = gfd_labels(node(*[with_fabric(H100)] * 8))
    assert labels == {
        "nvidia.com/cuda.driver-version.full": "550.163.01",
        "nvidia.com/cuda.driver-version.major": "550",
        "nvidia.com/cuda.driver-version.minor": "163",
        "nvidia.com/cuda.driver-version.revision": "01",
        "nvidia.com/cuda.driver.major": "550",
        "nvidia.com/cuda.driver.minor": "163",
        "nvidia.com/cuda.driver.rev": "01",
        "nvidia.com/cuda.runtime-version.full": "12.4",
        "nvidia.com/cuda.runtime-version.major": "12",
        "nvidia.com/cuda.runtime-version.minor": "4",
        "nvidia.com/cuda.runtime.major": "12",
        "nvidia.com/cuda.runtime.minor": "4",
        "nvidia.com/gpu.clique": f"{CLUSTER}.0",
        "nvidia.com/gpu.compute.major": "9",
        "nvidia.com/gpu.compute.minor": "0",
        "nvidia.com/gpu.count": "8",
        "nvidia.com/gpu.family": "hopper",
        "nvidia.com/gpu.machine": "unknown",
        "nvidia.com/gpu.memory": "81920",
        "nvidia.com/gpu.mode": "compute",
        "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
        "nvidia.com/gpu.replicas": "1",
        "nvidia.com/gpu.sharing-strategy": "none",
        "nvidia.com/mig.capable": "true",
        "nvidia.com/mps.capable": "false",
        "nvidia.com/vgpu.present": "false",
    }
    assert list(labels) == sorted(labels)


@pytest.mark.parametrize(
    ("gpus", "expected"),
    [
        ((H100, H100), None),
        ((with_fabric(H100), with_fabric(H100)), f"{CLUSTER}.0"),
        ((with_fabric(H100), H100), f"{CLUSTER}.0"),
        ((with_fabric(H100), with_fabric(H100, clique_id=7)), None),
        ((with_fabric(H100), with_fabric(H100, cluster_uuid=CLUSTER[:-2] + "ff")), None),
        ((with_fabric(H100, clique_id=7), with_fabric(H100, clique_id=7)), f"{CLUSTER}.7"),
        ((with_fabric(H100), with_fabric(H100, state=2, clique_id=7)), f"{CLUSTER}.0"),
        ((with_fabric(H100), with_fabric(H100, status=999, clique_id=7)), f"{CLUSTER}.0"),
        ((with_fabric(H100, cluster_uuid="00000000-0000-0000-0000-000000000000"),), None),
    ],
    ids=[
        "no-fabric",
        "all-attached",
        "one-attached",
        "cliques-disagree",
        "clusters-disagree",
        "all-in-clique-7",
        "unregistered-one-left-out",
        "failed-one-left-out",
        "all-zero-cluster-not-attached",
    ],
)
def test_the_clique_comes_from_attached_gpus_that_agree(
    gpus: tuple[GpuFacts, ...], expected: str | None
) -> None:
    assert gfd_labels(node(*gpus)).get("nvidia.com/gpu.clique") == expected


def test_disagreeing_gpus_say_which_ids_differ() -> None:
    clique = fabric_clique((with_fabric(H100), with_fabric(H100, clique_id=7)))
    assert clique.value is None
    assert clique.disagreement is not None and "clique IDs" in clique.disagreement
    assert f"GPU 1: {CLUSTER}.7" in clique.disagreement


@pytest.mark.parametrize(
    ("sharing", "product", "replicas", "strategy"),
    [
        (Sharing(), "NVIDIA-H100-80GB-HBM3", "1", "none"),
        (TS4, "NVIDIA-H100-80GB-HBM3-SHARED", "4", "time-slicing"),
        (
            dataclasses.replace(TS4, rename_by_default=True),
            "NVIDIA-H100-80GB-HBM3",
            "4",
            "time-slicing",
        ),
        (Sharing("none", {"nvidia.com/gpu": 1}), "NVIDIA-H100-80GB-HBM3", "1", "none"),
        (
            Sharing("time-slicing", {"nvidia.com/mig-1g.10gb": 2}),
            "NVIDIA-H100-80GB-HBM3",
            "1",
            "none",
        ),
    ],
    ids=["none", "time-slicing", "rename-by-default", "one-replica", "another-resource-shared"],
)
def test_time_slicing_sets_replicas_strategy_and_the_shared_suffix(
    sharing: Sharing, product: str, replicas: str, strategy: str
) -> None:
    labels = gfd_labels(node(H100, sharing=sharing))
    assert labels["nvidia.com/gpu.product"] == product
    assert labels["nvidia.com/gpu.replicas"] == replicas
    assert labels["nvidia.com/gpu.sharing-strategy"] == strategy


MIG_KEYS = {"memory": "4864", "multiprocessors": "14", "slices.gi": "1", "slices.ci": "1"}


@pytest.mark.parametrize(
    ("gpus", "strategy", "expected"),
    [
        (
            (migged(A100, MIG_1G, MIG_1G), migged(A100, MIG_1G)),
            "single",
            {
                "nvidia.com/mig.strategy": "single",
                "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB-MIG-1g.5gb",
                "nvidia.com/gpu.count": "3",
                "nvidia.com/gpu.replicas": "1",
                **{f"nvidia.com/gpu.{k}": v for k, v in MIG_KEYS.items()},
                "nvidia.com/gpu.engines.copy": "1",
                "nvidia.com/gpu.family": "ampere",
            },
        ),
        (
            (migged(A100, MIG_1G), migged(A100, MIG_3G)),
            "single",
            {
                "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB-MIG-INVALID",
                "nvidia.com/gpu.count": "0",
                "nvidia.com/gpu.replicas": "0",
                "nvidia.com/gpu.sharing-strategy": "",
                "nvidia.com/gpu.memory": "0",
            },
        ),
        (
            (migged(A100, MIG_1G), A100),
            "single",
            {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB-MIG-INVALID"},
        ),
        ((migged(A100),), "single", {"nvidia.com/gpu.count": "0"}),
        (
            (migged(A100, MIG_1G, MIG_3G), A100),
            "mixed",
            {
                "nvidia.com/mig.strategy": "mixed",
                "nvidia.com/gpu.count": "2",
                "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB",
                "nvidia.com/gpu.replicas": "1",
                "nvidia.com/mig-1g.5gb.product": "NVIDIA-A100-SXM4-40GB-MIG-1g.5gb",
                "nvidia.com/mig-1g.5gb.count": "1",
                "nvidia.com/mig-1g.5gb.memory": "4864",
                "nvidia.com/mig-3g.20gb.count": "1",
                "nvidia.com/mig-3g.20gb.engines.decoder": "2",
            },
        ),
        (
            (migged(A100, MIG_1G),),
            "none",
            {
                "nvidia.com/gpu.count": "1",
                "nvidia.com/gpu.replicas": "0",
                "nvidia.com/gpu.memory": "40960",
            },
        ),
    ],
    ids=["single", "single-two-profiles", "single-beside-whole", "single-empty", "mixed", "none"],
)
def test_mig_labels_per_strategy(
    gpus: tuple[GpuFacts, ...], strategy: str, expected: dict[str, str]
) -> None:
    labels = gfd_labels(node(*gpus, mig_strategy=strategy))
    assert {k: labels.get(k) for k in expected} == expected
    if strategy == "none":
        assert "nvidia.com/mig.strategy" not in labels


def test_without_gpus_only_the_vgpu_label_is_written() -> None:
    assert gfd_labels(NodeFacts(())) == {"nvidia.com/vgpu.present": "false"}
    assert gfd_labels(NodeFacts((), vgpus=None)) == {}


@pytest.mark.parametrize(
    ("machine", "expected"),
    [(None, "unknown"), ("  PowerEdge XE9680 (R+2)  ".strip(), "PowerEdge-XE9680-R2"), ("", "")],
    ids=["no-dmi", "sanitised", "empty-file"],
)
def test_the_machine_is_the_sanitised_dmi_product_name(machine: str | None, expected: str) -> None:
    assert gfd_labels(node(H100, machine=machine))["nvidia.com/gpu.machine"] == expected


@pytest.mark.parametrize(
    ("classes", "mode"),
    [
        ([0x030200] * 2, "compute"),
        ([0x030000], "graphics"),
        ([0x030000, 0x030200], "unknown"),
        ([None], "unknown"),
        ([], "unknown"),
        ([0x068000], "unknown"),
    ],
    ids=["3d", "vga", "mixed", "unreadable", "none", "other-class"],
)
def test_gpu_mode_needs_one_class_on_every_gpu(classes: list[int | None], mode: str) -> None:
    assert gpu_mode(classes) == mode


@pytest.mark.parametrize(
    ("driver", "cuda", "rev"),
    [("550.163.01", "12.4", "01"), ("580.65", "13.0", "")],
    ids=["three-parts", "two-parts"],
)
def test_driver_versions(driver: str, cuda: str, rev: str) -> None:
    labels = gfd_labels(node(H100, driver_version=driver, cuda_driver_version=cuda))
    assert labels["nvidia.com/cuda.driver.rev"] == rev
    assert labels["nvidia.com/cuda.runtime-version.full"] == cuda


def test_an_unparsable_driver_version_leaves_the_version_labels_out() -> None:
    labels = gfd_labels(node(H100, driver_version=""))
    assert not [k for k in labels if k.startswith("nvidia.com/cuda.")]


@pytest.mark.parametrize(
    ("capability", "family"),
    [
        ((7, 0), "volta"),
        ((7, 5), "turing"),
        ((8, 0), "ampere"),
        ((8, 9), "ada-lovelace"),
        ((9, 0), "hopper"),
        ((10, 0), "blackwell"),
        ((10, 3), "blackwell"),
        ((12, 0), "blackwell"),
        ((13, 0), "rubin"),
        ((4, 0), "undefined"),
    ],
    ids=[
        "volta",
        "turing",
        "ampere",
        "ada",
        "hopper",
        "b200",
        "b300",
        "rtx-blackwell",
        "rubin",
        "gap",
    ],
)
def test_architecture_family(capability: tuple[int, int], family: str) -> None:
    assert arch_family(*capability) == family


def test_mps_is_capable_only_under_mps_without_mig() -> None:
    mps = Sharing("mps", {"nvidia.com/gpu": 2})
    assert gfd_labels(node(H100, sharing=mps))["nvidia.com/mps.capable"] == "true"
    assert gfd_labels(node(migged(H100), sharing=mps))["nvidia.com/mps.capable"] == "false"


def test_a_mig_profile_with_media_engines_is_named_as_gfd_names_it() -> None:
    assert gfd_profile("1g.10gb+me") == "1g.10gb.me"


def _config(caps: bytes) -> bytes:
    space = bytearray(256)
    space[0x06] = 0x10  # a capability list
    space[0x34] = 0x40
    space[0x40 : 0x40 + len(caps)] = caps
    return bytes(space)


def test_a_vgpu_is_read_from_its_vendor_capability() -> None:
    record = b"\x00\x16" + b"550.54.15\x00" + b"r550_00\x00\x00\x00"
    capability = bytes([0x09, 0x00, 5 + len(record), ord("V"), ord("F")]) + record
    found = vendor_capability(_config(capability))
    assert found is not None
    assert vgpu_host(found) == VgpuHost("550.54.15", "r550_00")
    labels = gfd_labels(node(H100, vgpus=(VgpuHost("550.54.15", "r550_00"),)))
    assert labels["nvidia.com/vgpu.present"] == "true"
    assert labels["nvidia.com/vgpu.host-driver-branch"] == "r550_00"


def test_a_gpu_without_vendor_capability_is_no_vgpu_and_a_short_read_is_unknown() -> None:
    assert vendor_capability(bytes(256)) is None
    assert vgpu_host(bytes([0x09, 0, 5, ord("X"), ord("Y")])) is None
    with pytest.raises(ValueError, match="privilege"):
        vendor_capability(bytes(64))
