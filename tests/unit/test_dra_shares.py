"""Shares of whole GPUs under DRA (`sharing.shares`), the pure and in-process side: the
config and its refusals, the devices and slice documents with their consumable
capacities on the step grid."""

from __future__ import annotations

from pathlib import Path

import pytest
from structlog.testing import capture_logs

from agents.config import Config, parse_config
from agents.config_shares import GIB, MPS_ROOT, Shares
from agents.dra.slices import build_slices, same_spec
from agents.errors import ConfigError
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
    assert [e["key"] for e in ignored] == ["sharing.shares"]
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
