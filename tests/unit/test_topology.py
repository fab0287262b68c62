"""PCIe topology: sysfs path parsing, distance categories, nearest NICs and GPUs."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agents.core.topology import Distance, PciLocation, Topology, distance


def loc(path: str, numa: int | None) -> PciLocation:
    return PciLocation.from_sysfs_path(path, numa)


# A node built to hold every category:
#   pci0000:16 (NUMA 0)
#     root port 16:01.0 -> switch 17:00.0 -> down 18:00.0 -> gpu0 19:00.0, nic0 19:00.1
#                                         -> down 18:01.0 -> gpu1 1a:00.0
#                                         -> down 18:02.0 -> switch 1b:00.0 -> down 1c:00.0 -> gpu2
#     root port 16:02.0 -> gpu3 20:00.0
#   pci0000:40 (NUMA 0)   root port 40:01.0 -> gpu4 41:00.0
#   pci0001:80 (NUMA 1)   root port 0001:80:01.0 -> gpu5 0001:81:00.0
#   pci0000:c0 (NUMA unknown) root port c0:01.0 -> gpu6 c1:00.0
SW = "/sys/devices/pci0000:16/0000:16:01.0/0000:17:00.0"
NODE = {
    "gpu0": loc(f"{SW}/0000:18:00.0/0000:19:00.0", 0),
    "nic0": loc(f"{SW}/0000:18:00.0/0000:19:00.1", 0),
    "gpu1": loc(f"{SW}/0000:18:01.0/0000:1a:00.0", 0),
    "gpu2": loc(f"{SW}/0000:18:02.0/0000:1b:00.0/0000:1c:00.0/0000:1d:00.0", 0),
    "gpu3": loc("/sys/devices/pci0000:16/0000:16:02.0/0000:20:00.0", 0),
    "gpu4": loc("/sys/devices/pci0000:40/0000:40:01.0/0000:41:00.0", 0),
    "gpu5": loc("/sys/devices/pci0001:80/0001:80:01.0/0001:81:00.0", 1),
    "gpu6": loc("/sys/devices/pci0000:c0/0000:c0:01.0/0000:c1:00.0", None),
}


@pytest.mark.parametrize(
    ("a", "b", "expected"),
    [
        ("gpu0", "nic0", Distance.PIX),
        ("gpu0", "gpu1", Distance.PIX),
        ("nic0", "gpu1", Distance.PIX),
        ("gpu0", "gpu2", Distance.PXB),
        ("gpu1", "gpu2", Distance.PXB),
        ("gpu0", "gpu3", Distance.PHB),
        ("gpu2", "gpu3", Distance.PHB),
        ("gpu0", "gpu4", Distance.NODE),
        ("gpu3", "gpu4", Distance.NODE),
        ("gpu0", "gpu5", Distance.SYS),
        ("gpu4", "gpu5", Distance.SYS),
        ("gpu4", "gpu6", Distance.SYS),
        ("gpu5", "gpu6", Distance.SYS),
    ],
    ids=[
        "siblings-under-one-downstream-port-are-PIX",
        "two-downstream-ports-of-one-switch-are-PIX",
        "nic-and-gpu-on-one-switch-are-PIX",
        "cascaded-switches-are-PXB",
        "cascade-from-a-neighbour-port-is-PXB",
        "two-root-ports-of-one-host-bridge-are-PHB",
        "cascade-to-another-root-port-is-PHB",
        "two-host-bridges-of-one-numa-node-are-NODE",
        "root-port-to-other-host-bridge-is-NODE",
        "two-numa-nodes-are-SYS",
        "other-numa-node-from-second-host-bridge-is-SYS",
        "unknown-numa-on-another-host-bridge-is-SYS",
        "unknown-numa-against-numa-1-is-SYS",
    ],
)
def test_distance_gives_the_topo_category(a: str, b: str, expected: Distance) -> None:
    assert distance(NODE[a], NODE[b]) is expected
    assert distance(NODE[b], NODE[a]) is expected


def test_distance_orders_nearest_first_and_prints_topo_names() -> None:
    assert min(Distance) is Distance.PIX
    assert [str(d) for d in sorted(Distance)] == ["PIX", "PXB", "PHB", "NODE", "SYS"]


@pytest.mark.parametrize(
    ("path", "address", "bridges", "host_bridge"),
    [
        (
            "/sys/devices/pci0000:16/0000:16:01.0/0000:17:00.0/0000:18:00.0/0000:1b:00.0",
            "0000:1b:00.0",
            ("0000:16:01.0", "0000:17:00.0", "0000:18:00.0"),
            "pci0000:16",
        ),
        (
            "/sys/devices/pci0002:a0/0002:a0:03.1/0002:a1:00.0",
            "0002:a1:00.0",
            ("0002:a0:03.1",),
            "pci0002:a0",
        ),
        ("/sys/devices/pci0000:00/0000:00:02.0", "0000:00:02.0", (), "pci0000:00"),
        (
            "/SYS/DEVICES/PCI0000:3A/0000:3A:00.0/0000:3B:00.1/",
            "0000:3b:00.1",
            ("0000:3a:00.0",),
            "pci0000:3a",
        ),
        (
            "/sys/devices/pci0000:00/0000:00:0e.0/pci10000:e0/10000:e0:06.0/10000:e1:00.0",
            "10000:e1:00.0",
            ("10000:e0:06.0",),
            "pci10000:e0",
        ),
    ],
    ids=[
        "switch-below-root-port",
        "domain-other-than-zero",
        "device-directly-on-host-bridge",
        "upper-case-and-trailing-slash-normalised",
        "nested-host-bridge-counts-the-innermost",
    ],
)
def test_from_sysfs_path_splits_device_bridges_and_host_bridge(
    path: str, address: str, bridges: tuple[str, ...], host_bridge: str
) -> None:
    parsed = PciLocation.from_sysfs_path(path, 1)
    assert parsed == PciLocation(address, bridges, host_bridge, 1)


@pytest.mark.parametrize(
    "path",
    [
        "/sys/devices/platform/serial8250",
        "/sys/devices/pci0000:16",
        "/sys/devices/pci0000:16/0000:16:01.0/0000:17:00.0/net/eth0",
        "",
    ],
    ids=["not-pci", "host-bridge-only", "non-pci-component-below", "empty"],
)
def test_from_sysfs_path_refuses_what_is_not_a_pci_device(path: str) -> None:
    with pytest.raises(ValueError, match="PCI"):
        PciLocation.from_sysfs_path(path, None)


def switch_node() -> Topology:
    """8 GPUs and 4 NICs: two GPUs and one NIC on each of four switches, two
    switches per NUMA node, each switch under its own root port."""
    gpus: dict[str, PciLocation] = {}
    nics: dict[str, PciLocation] = {}
    for s, (domain_bus, numa) in enumerate([("16", 0), ("16", 0), ("a0", 1), ("a0", 1)]):
        hb = f"pci0000:{domain_bus}"
        rp = f"0000:{domain_bus}:0{s + 1}.0"
        up = f"0000:{0x20 * (s + 1):02x}:00.0"
        down = [f"0000:{0x20 * (s + 1) + 1:02x}:0{p}.0" for p in range(3)]
        for p in range(2):
            gpus[f"gpu{2 * s + p}"] = PciLocation(f"0001:{s}{p}:00.0", (rp, up, down[p]), hb, numa)
        nics[f"nic{s}"] = PciLocation(f"0001:{s}2:00.0", (rp, up, down[2]), hb, numa)
    return Topology(gpus, nics)


def test_each_gpu_pairs_with_the_nic_on_its_switch_and_two_gpus_share_it() -> None:
    topo = switch_node()
    assert topo.pairs() == {f"gpu{g}": frozenset({f"nic{g // 2}"}) for g in range(8)}
    for s in range(4):
        assert topo.nearest_gpus(f"nic{s}") == {f"gpu{2 * s}", f"gpu{2 * s + 1}"}
    assert topo.pair_distance("gpu0", "nic0") is Distance.PIX
    assert topo.pair_distance("gpu0", "nic1") is Distance.PHB
    assert topo.pair_distance("gpu0", "nic2") is Distance.SYS


def test_nearest_nics_holds_every_nic_at_the_smallest_distance() -> None:
    hb = "pci0000:16"
    topo = Topology(
        {"gpu": PciLocation("0000:17:00.0", ("0000:16:01.0",), hb, 0)},
        {
            "a": PciLocation("0000:18:00.0", ("0000:16:02.0",), hb, 0),
            "b": PciLocation("0000:19:00.0", ("0000:16:03.0",), hb, 0),
            "far": PciLocation("0000:41:00.0", ("0000:40:01.0",), "pci0000:40", 0),
        },
    )
    assert topo.nearest_nics("gpu") == {"a", "b"}
    assert topo.nearest_gpus("far") == {"gpu"}


def test_a_node_without_nics_pairs_gpus_with_nothing() -> None:
    topo = Topology({"gpu0": NODE["gpu0"]}, {})
    assert topo.nearest_nics("gpu0") == frozenset()
    assert topo.pairs() == {"gpu0": frozenset()}


def test_an_id_cannot_be_both_gpu_and_nic() -> None:
    with pytest.raises(ValueError, match="both"):
        Topology({"x": NODE["gpu0"]}, {"x": NODE["nic0"]})


def test_matrix_covers_every_ordered_pair_of_distinct_devices() -> None:
    gpus = {k: v for k, v in NODE.items() if k.startswith("gpu")}
    topo = Topology(gpus, {"nic0": NODE["nic0"]})
    matrix = topo.matrix()
    assert set(matrix) == set(itertools.permutations(NODE, 2))
    for (a, b), d in matrix.items():
        assert d is distance(NODE[a], NODE[b]) is matrix[(b, a)]


# Random locations drawn from a small tree, so that shared bridges are common.
locations = st.builds(
    lambda hb, rp, path, numa, fn: PciLocation(
        f"0000:f{hb}:{fn:02x}.0",
        tuple(f"{hb}/{rp}/{'/'.join(path[: i + 1])}" for i in range(-1, len(path))),
        f"pci0000:{hb}0",
        numa,
    ),
    st.integers(0, 2),
    st.integers(0, 1),
    st.lists(st.sampled_from("ab"), max_size=4).map(tuple),
    st.sampled_from([0, 1, None]),
    st.integers(0, 255),
)


@settings(max_examples=300, deadline=None)
@given(locations, locations)
def test_distance_is_symmetric_and_only_near_within_one_host_bridge(
    a: PciLocation, b: PciLocation
) -> None:
    d = distance(a, b)
    assert d is distance(b, a)
    assert (d <= Distance.PHB) == (a.host_bridge == b.host_bridge)
    assert (d <= Distance.PXB) == (a.bridges[:1] == b.bridges[:1] != ())
