"""Shares of whole GPUs under DRA (`sharing.shares`), the pure and in-process side: the
config and its refusals, the devices and slice documents with their consumable
capacities on the step grid, a claim's shares read, checkpointed and named, and what a
container of one or two GPUs' shares gets."""

from __future__ import annotations

from pathlib import Path

import pytest
from structlog.testing import capture_logs

from agents.config import Config, parse_config
from agents.config_shares import GIB, MPS_ROOT, Shares
from agents.core.device import DeviceNode, Mount
from agents.dra.cdi import spec_document
from agents.dra.claim_checkpoint import ClaimCheckpoint, PreparedClaim, PreparedDevice
from agents.dra.claims import AllocationResult, claim_of, consumed
from agents.dra.slices import build_slices, same_spec
from agents.errors import BackendError, ConfigError
from agents.gpu.dra import share_policies, whole_gpu
from agents.gpu.family import GpuFamily
from agents.gpu.kind import GpuKind, discover_gpus
from agents.kernel.facts import FamilyFacts
from agents.sim.bundled import bundled_node
from agents.sim.simnode import SimulatedNode

MIB = 2**20
SHARED = "version: v1\nsharing:\n  shares: {}\n"


def test_shares_default_to_1gi_steps_enforced_by_mps_under_the_default_root() -> None:
    assert parse_config(SHARED, "c.yaml").sharing.shares == Shares(GIB, "mps", MPS_ROOT)
    assert parse_config("version: v1\n", "c.yaml").sharing.shares is None


def test_shares_take_their_step_enforcement_and_flags_mps_root() -> None:
    text = "flags: {mpsRoot: /run/mps}\nsharing:\n  shares: {memoryStep: 512Mi, enforce: none}\n"
    config = parse_config(text, "c.yaml")
    assert config.sharing.shares == Shares(512 * MIB, "none", "/run/mps")
    assert "flags.mpsRoot" not in config.ignored_keys


@pytest.mark.parametrize(
    ("shares", "key"),
    [
        ("{memoryStep: 0}", "sharing.shares.memoryStep"),
        ("{memoryStep: lots}", "sharing.shares.memoryStep"),
        ("{memoryStep: 1.5}", "sharing.shares.memoryStep"),
        ("{enforce: hardware}", "sharing.shares.enforce"),
        ("{limit: 3}", "sharing.shares.limit"),
    ],
    ids=["zero-step", "not-a-quantity", "fraction-of-a-byte", "unknown-enforce", "unknown-key"],
)
def test_bad_shares_are_a_config_error_naming_the_key(shares: str, key: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config(f"sharing:\n  shares: {shares}\n", "c.yaml")
    assert str(caught.value).startswith(f"c.yaml: {key}")


def test_under_dra_shares_are_served_and_in_device_plugin_mode_ignored_with_one_warning(
    tmp_path: Path,
) -> None:
    node = SimulatedNode(bundled_node("h100-8gpu-8nic"), tmp_path)
    node.load()
    config = parse_config(SHARED, "c.yaml")
    named = GpuKind().named_devices(config)
    assert named.sharing.served_shares == Shares(by_claims=True)
    assert config.sharing.served_shares is None
    with capture_logs() as logs:
        plugin = discover_gpus(node.nvml, node.sysfs, config, "c.yaml", node.dev_root)
    ignored = [e for e in logs if e["event"] == "device_plugin_ignores_key"]
    assert [e["key"] for e in ignored] == ["sharing.shares"] and plugin.share_mps is None
    family = GpuFamily(node.nvml, plugin, config)
    assert not any(d.shared for d in family.facts().devices)


@pytest.mark.parametrize(
    ("memory_mib", "step", "grid"),
    [(81559, GIB, "79Gi"), (81920, GIB, "80Gi"), (81559, 512 * MIB, "81408Mi")],
    ids=["h100-in-gi", "on-the-grid", "half-gi-steps"],
)
def test_the_memory_default_and_max_are_its_memory_rounded_down_to_the_grid(
    memory_mib: int, step: int, grid: str
) -> None:
    policy = share_policies(memory_mib * MIB, Shares(step))["memory"]
    assert (policy.default, policy.maximum) == (grid, grid)


def test_a_gpu_smaller_than_one_step_is_not_shared() -> None:
    assert share_policies(512 * MIB, Shares(GIB)) == {}


def gpu_facts(tmp_path: Path, shares: Shares | None) -> FamilyFacts:
    node = SimulatedNode(bundled_node("h100-8gpu-8nic"), tmp_path)
    node.load()
    config = GpuKind().named_devices(Config.default())
    found = discover_gpus(node.nvml, node.sysfs, config, "c.yaml", node.dev_root)
    gpu = found.gpus[0]
    return FamilyFacts(
        "gpu.nvidia.com", (whole_gpu(gpu, "nvidia.com/gpu", found.driver, None, shares),)
    )


def test_a_shared_gpu_slice_allows_multiple_allocations_with_two_consumable_capacities(
    tmp_path: Path,
) -> None:
    (document,) = build_slices(
        "n", "u", gpu_facts(tmp_path, Shares()), {}, taints=False, generation=1
    )
    [device] = document["spec"]["devices"]
    assert device["allowMultipleAllocations"] is True
    assert device["capacity"] == {
        "memory": {
            "value": "81559Mi",
            "requestPolicy": {
                "default": "79Gi",
                "validRange": {"min": "1Gi", "max": "79Gi", "step": "1Gi"},
            },
        },
        "compute": {
            "value": "100",
            "requestPolicy": {
                "default": "0",
                "validRange": {"min": "0", "max": "100", "step": "1"},
            },
        },
    }
    stored = {"spec": {**document["spec"], "devices": [dict(device)]}}
    stored["spec"]["devices"][0]["capacity"] = {
        "memory": {
            "value": "81559Mi",
            "requestPolicy": {
                "default": "84825604096",
                "validRange": {"min": "1073741824", "max": "79Gi", "step": "1Gi"},
            },
        },
        "compute": device["capacity"]["compute"],
    }
    assert same_spec(stored, document)


def test_without_shares_a_gpu_slice_has_its_memory_only(tmp_path: Path) -> None:
    (document,) = build_slices("n", "u", gpu_facts(tmp_path, None), {}, taints=False, generation=1)
    [device] = document["spec"]["devices"]
    assert "allowMultipleAllocations" not in device
    assert device["capacity"] == {"memory": {"value": "81559Mi"}}


def test_a_claims_share_and_what_it_consumed_are_read() -> None:
    result = {
        "request": "gpu",
        "driver": "gpu.nvidia.com",
        "pool": "p",
        "device": "gpu-0",
        "shareID": "s-1",
        "consumedCapacity": {"memory": "20Gi", "compute": "25"},
    }
    obj = {"metadata": {"uid": "u1"}, "status": {"allocation": {"devices": {"results": [result]}}}}
    [read] = claim_of(obj, "ns", "c", "u1").results
    assert read == AllocationResult(
        "gpu", "gpu.nvidia.com", "p", "gpu-0", False, "s-1", {"memory": "20Gi", "compute": "25"}
    )


def test_shares_of_one_device_in_a_claim_consume_their_sum() -> None:
    results = [
        AllocationResult("a", "d", "p", "gpu-0", False, "s-1", {"memory": "20Gi", "compute": "25"}),
        AllocationResult("b", "d", "p", "gpu-0", False, "s-2", {"memory": "10Gi", "compute": "0"}),
        AllocationResult("c", "d", "p", "gpu-1"),
    ]
    assert consumed(results) == {"gpu-0": {"memory": str(30 * GIB), "compute": "25"}}


def test_a_share_is_checkpointed_with_its_mounts_and_named_per_share(tmp_path: Path) -> None:
    device = PreparedDevice(
        "gpu-0",
        ("gpu",),
        "p",
        ("k8s.gpu.nvidia.com/claim=u-gpu-0-s-1",),
        (DeviceNode("/dev/nvidia0", "/dev/nvidia0"),),
        share_id="s-1",
        consumed={"memory": "20Gi"},
    )
    mount = Mount("/mps/gpu.nvidia.com/pipe", "/run/nvidia/mps/gpu.nvidia.com/pipe", False)
    claim = PreparedClaim("ns", "c", (device,), {"A": "1"}, (mount,))
    checkpoint = ClaimCheckpoint(tmp_path / "checkpoint.json")
    checkpoint.save({"u": claim})
    assert checkpoint.load() == {"u": claim}
    document = spec_document("gpu.nvidia.com", "u", [], {"A": "1"}, (mount,))
    [env] = document["devices"]
    assert env["containerEdits"]["mounts"] == [
        {
            "hostPath": mount.host_path,
            "containerPath": mount.container_path,
            "options": ["rbind", "rw"],
        }
    ]
    assert device.cdi_name == "gpu-0-s-1"


class AbsentDaemon:
    """An MPS control program whose daemon does not answer."""

    def start(self, pipe_dir: str, log_dir: str) -> None:
        raise BackendError("not started here")

    def send(self, pipe_dir: str, log_dir: str, command: str) -> str:
        raise BackendError("no daemon")


def shared_family(tmp_path: Path, text: str, control: AbsentDaemon | None) -> GpuFamily:
    node = SimulatedNode(bundled_node("h100-8gpu-8nic"), tmp_path)
    node.load()
    config = GpuKind().named_devices(parse_config(text, "c.yaml"))
    found = discover_gpus(
        node.nvml, node.sysfs, config, "c.yaml", node.dev_root, mps_control=control
    )
    return GpuFamily(node.nvml, found, config)


def test_a_container_of_two_gpus_shares_gets_them_in_bus_order_with_mps_limits(
    tmp_path: Path,
) -> None:
    with capture_logs() as logs:
        family = shared_family(tmp_path, SHARED, AbsentDaemon())
    assert [e["event"] for e in logs].count("gpu_shares_unenforced") == 1
    first, second = sorted(family.gpus, key=lambda g: g.pci)[:2]
    keys = [("nvidia.com/gpu", second.uuid), ("nvidia.com/gpu", first.uuid)]
    used = {
        keys[0]: {"memory": "10Gi", "compute": "50"},
        keys[1]: {"memory": "20Gi", "compute": "25"},
    }
    edits = family.edits(keys, used)
    env = edits.named_env()
    assert env["NVIDIA_VISIBLE_DEVICES"] == f"{first.uuid},{second.uuid}"
    assert env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=20480M,1=10240M"
    assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "25"
    assert env["CUDA_MPS_PIPE_DIRECTORY"] == "/mps/gpu.nvidia.com/pipe"
    assert [m.container_path for m in edits.mounts] == ["/mps/gpu.nvidia.com/pipe", "/dev/shm"]


def test_a_share_without_compute_gets_no_sm_cap_and_without_mps_no_limits(
    tmp_path: Path,
) -> None:
    family = shared_family(tmp_path, SHARED, AbsentDaemon())
    key = ("nvidia.com/gpu", family.gpus[0].uuid)
    env = family.edits([key], {key: {"memory": "79Gi", "compute": "0"}}).named_env()
    assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=80896M"
    assert "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE" not in env
    (tmp_path / "other").mkdir()
    with capture_logs() as logs:
        unenforced = shared_family(tmp_path / "other", SHARED, None)
    assert [e["reason"] for e in logs if e["event"] == "gpu_shares_unenforced"] == [
        "no nvidia-cuda-mps-control found"
    ]
    env = unenforced.edits([key], {key: {"memory": "79Gi"}}).named_env()
    assert not [k for k in env if k.startswith("CUDA_MPS_")]
    assert env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"


def test_whole_gpus_get_what_they_got_before(tmp_path: Path) -> None:
    family = shared_family(tmp_path, SHARED, AbsentDaemon())
    keys = [("nvidia.com/gpu", g.uuid) for g in reversed(family.gpus[:2])]
    env = family.edits(keys).named_env()
    assert env["NVIDIA_VISIBLE_DEVICES"] == ",".join(k[1] for k in keys)
    assert "CUDA_DEVICE_ORDER" not in env
