"""The node-file parser: defaults, every field of the documented format, and its errors."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from agents.errors import ConfigError
from agents.hw.nvml import MigInstance
from agents.sim.bundled import bundled_node, bundled_nodes
from agents.sim.node import load_node, parse_node
from agents.sim.specs import DEFAULT_MEMORY_MIB, DEFAULT_MODEL

GPU_A = "GPU-aaaaaaaa-0000-0000-0000-000000000000"
GPU_B = "GPU-bbbbbbbb-0000-0000-0000-000000000000"


def node_doc() -> dict[str, Any]:
    return {
        "numaNodes": 2,
        "gpus": [
            {"uuid": GPU_A, "pci": "0000:1b:00.0", "upstream": ["0000:16:01.0", "0000:17:00.0"]},
            {"uuid": GPU_B, "pci": "0000:9b:00.0", "numa": 1},
        ],
        "nics": [
            {
                "pci": "0000:1c:00.0",
                "upstream": ["0000:16:01.0", "0000:17:01.0"],
                "netdev": "ens1np0",
                "rdma": "mlx5_0",
            }
        ],
    }


def parse(doc: object) -> Any:
    return parse_node(yaml.safe_dump(doc), "node.yaml")


def test_minimal_devices_get_the_documented_defaults() -> None:
    node = parse(node_doc())
    gpu, nic = node.gpus[0], node.nics[0]
    assert node.numa_nodes == 2
    assert (gpu.model, gpu.memory_mib, gpu.minor, gpu.numa) == (
        DEFAULT_MODEL,
        DEFAULT_MEMORY_MIB,
        0,
        0,
    )
    assert (gpu.nvlinks, gpu.mig_enabled, gpu.xids, gpu.lost) == ((), False, (), False)
    assert node.gpus[1].minor == 1
    assert node.gpus[1].upstream == ()
    assert (nic.vendor, nic.link_layer, nic.link, nic.numa, nic.uverbs) == (
        "15b3",
        "Ethernet",
        "up",
        0,
        0,
    )


def test_every_field_is_read() -> None:
    doc = node_doc()
    doc["gpus"][0].update(
        model="NVIDIA H200",
        memoryMiB=143771,
        minor=7,
        nvlinks=[GPU_B],
        mig={"enabled": True, "instances": [{"uuid": "MIG-1", "profile": "1g.10gb"}]},
        xids=[48, 79],
        lost=True,
    )
    doc["nics"][0].update(numa=1, vendor="8086", linkLayer="InfiniBand", link="down", uverbs=4)
    node = parse(doc)
    gpu, nic = node.gpus[0], node.nics[0]
    assert gpu.upstream == ("0000:16:01.0", "0000:17:00.0")
    assert (gpu.model, gpu.memory_mib, gpu.minor, gpu.nvlinks) == (
        "NVIDIA H200",
        143771,
        7,
        (GPU_B,),
    )
    assert gpu.mig_enabled and gpu.mig_instances == (MigInstance("MIG-1", "1g.10gb", 0, 0),)
    assert (gpu.xids, gpu.lost) == ((48, 79), True)
    assert (nic.numa, nic.vendor, nic.link_layer, nic.link, nic.uverbs) == (
        1,
        "8086",
        "InfiniBand",
        "down",
        4,
    )


def test_numa_nodes_defaults_to_the_highest_numa_used() -> None:
    doc = node_doc()
    del doc["numaNodes"]
    assert parse(doc).numa_nodes == 2


def test_an_empty_mapping_is_an_empty_node() -> None:
    node = parse_node("{}", "node.yaml")
    assert (node.gpus, node.nics) == ((), ())


def test_an_empty_file_is_refused_as_a_writer_may_have_just_truncated_it() -> None:
    with pytest.raises(ConfigError, match="the file is empty"):
        parse_node("", "node.yaml")


def _set(path: str, value: object) -> dict[str, Any]:
    """node_doc() with one value replaced; path like `gpus.0.pci`."""
    doc = node_doc()
    *parents, last = path.split(".")
    target: Any = doc
    for part in parents:
        target = target[int(part)] if part.isdigit() else target[part]
    if isinstance(target, list):
        target[int(last)] = value
    else:
        target[last] = value
    return doc


ERRORS = [
    ("top-unknown-key", _set("gpu", []), "gpu", "one of"),
    ("gpu-unknown-key", _set("gpus.0.memory", 1), "gpus[0].memory", "one of"),
    ("gpus-not-a-list", _set("gpus", {"a": 1}), "gpus", "a list"),
    ("gpu-not-a-mapping", _set("gpus.1", "x"), "gpus[1]", "a mapping"),
    ("memory-wrong-type", _set("gpus.0.memoryMiB", "lots"), "gpus[0].memoryMiB", "integer"),
    ("memory-zero", _set("gpus.0.memoryMiB", 0), "gpus[0].memoryMiB", ">= 1"),
    ("numa-bool", _set("gpus.0.numa", True), "gpus[0].numa", "integer"),
    ("uuid-missing", _set("gpus.1", {"pci": "0000:9b:00.0"}), "gpus[1].uuid", "required"),
    ("uuid-no-prefix", _set("gpus.0.uuid", "abc"), "gpus[0].uuid", "GPU-"),
    ("uuid-duplicate", _set("gpus.1.uuid", GPU_A), "gpus[1].uuid", "unique"),
    ("pci-duplicate", _set("nics.0.pci", "0000:9b:00.0"), "nics[0].pci", "unique"),
    ("pci-malformed", _set("gpus.0.pci", "1b:00.0"), "gpus[0].pci", "dddd:bb:dd.f"),
    ("pci-upper-case", _set("gpus.0.pci", "0000:1B:00.0"), "gpus[0].pci", "lower-case"),
    ("pci-unquoted-number", _set("gpus.0.pci", 64800.0), "gpus[0].pci", "quoted"),
    ("upstream-malformed", _set("gpus.0.upstream.1", "x"), "gpus[0].upstream[1]", "dddd"),
    (
        "upstream-is-device",
        _set("gpus.0.upstream.1", "0000:1c:00.0"),
        "gpus[0].upstream[1]",
        "not a device",
    ),
    (
        "bridge-two-parents",
        _set("nics.0.upstream.0", "0000:17:00.0"),
        "nics[0].upstream[0]",
        "same place",
    ),
    ("nvlink-unknown", _set("gpus.0.nvlinks", ["GPU-x"]), "gpus[0].nvlinks[0]", "another GPU"),
    ("nvlink-self", _set("gpus.0.nvlinks", [GPU_A]), "gpus[0].nvlinks[0]", "another GPU"),
    ("link-not-up-down", _set("nics.0.link", "sideways"), "nics[0].link", "up or down"),
    ("link-layer-unknown", _set("nics.0.linkLayer", "Wifi"), "nics[0].linkLayer", "Ethernet"),
    ("vendor-unquoted-int", _set("nics.0.vendor", 8086), "nics[0].vendor", "quoted"),
    ("numa-beyond-node", _set("gpus.1.numa", 2), "gpus[1].numa", "numaNodes (2)"),
    ("xid-not-int", _set("gpus.0.xids", ["48"]), "gpus[0].xids[0]", "integer"),
    ("lost-not-bool", _set("gpus.0.lost", "maybe"), "gpus[0].lost", "true or false"),
    ("minor-duplicate", _set("gpus.1.minor", 0), "gpus[1].minor", "unique"),
    ("netdev-missing", _set("nics.0", {"pci": "0000:1c:00.0"}), "nics[0].netdev", "required"),
    ("uverbs-underivable", _set("nics.0.rdma", "roce"), "nics[0].uverbs", "a number"),
    (
        "mig-bad-profile",
        _set("gpus.0.mig", {"instances": [{"uuid": "MIG-1", "profile": "big"}]}),
        "gpus[0].mig.instances[0].profile",
        "1g.10gb",
    ),
    ("mig-unknown-key", _set("gpus.0.mig", {"on": True}), "gpus[0].mig.on", "one of"),
    ("nvml-hang-negative", _set("gpus.0.nvml", {"hang": -1}), "gpus[0].nvml.hang", "seconds"),
    ("nvml-hang-text", _set("gpus.0.nvml", {"hang": "long"}), "gpus[0].nvml.hang", "seconds"),
    ("nvml-error-odd", _set("gpus.0.nvml", {"error": "oops!"}), "gpus[0].nvml.error", "NVML"),
    ("nvml-unknown-key", _set("gpus.0.nvml", {"slow": 1}), "gpus[0].nvml.slow", "one of"),
    ("nvswitch-not-bool", _set("nvswitch", "yes"), "nvswitch", "true or false"),
]


@pytest.mark.parametrize(
    ("doc", "key", "expected"), [e[1:] for e in ERRORS], ids=[e[0] for e in ERRORS]
)
def test_malformed_node_file_names_file_key_and_expectation(
    doc: object, key: str, expected: str
) -> None:
    with pytest.raises(ConfigError) as info:
        parse(doc)
    assert (info.value.source, info.value.key) == ("node.yaml", key)
    assert expected in info.value.expected


def test_unquoted_pci_address_that_yaml_reads_as_a_number_is_refused() -> None:
    text = f"gpus:\n  - uuid: {GPU_A}\n    pci: 0000:18:00.0\n"
    with pytest.raises(ConfigError, match=r"gpus\[0\]\.pci: a quoted PCI address"):
        parse_node(text, "node.yaml")


@pytest.mark.parametrize(
    ("text", "key"),
    [("gpus: [\n", "line 2"), ("- 1\n- 2\n", "<document>")],
    ids=["invalid-yaml", "not-a-mapping"],
)
def test_a_document_that_is_not_a_node_is_refused(text: str, key: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_node(text, "node.yaml")
    assert info.value.key == key


@pytest.mark.parametrize("name", ["h100-8gpu-8nic", "h100-8gpu-4nic"], ids=str)
def test_bundled_nodes_parse(name: str) -> None:
    node = load_node(bundled_node(name))
    assert (node.numa_nodes, len(node.gpus)) == (2, 8)
    assert all(len(g.nvlinks) == 7 for g in node.gpus)
    assert name in bundled_nodes()


def test_demo_node_lists_nics_in_an_order_unrelated_to_the_gpus() -> None:
    node = load_node(bundled_node("h100-8gpu-8nic"))
    assert [n.rdma for n in node.nics] != sorted(n.rdma or "" for n in node.nics)
    assert {n.rdma for n in node.nics} == {f"mlx5_{i}" for i in range(8)}


def test_unknown_bundled_node_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="h100-8gpu-8nic"):
        bundled_node("nope")
