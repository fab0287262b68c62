"""Shares of whole GPUs under DRA (`sharing.shares`) through a real agent, the kubelet's
DRA calls and the API-server stand-in: the slices' consumable capacities, two claims'
shares of one GPU prepared side by side, a whole-GPU claim refused beside them, unprepare
freeing one share only, and the shares kept across an agent restart."""

from __future__ import annotations

from pathlib import Path

from tests.integration.conftest import AgentProcess
from tests.integration.dra_node import GPU, DraNode, dra_node, ref

__all__ = ["dra_node"]

SHARE_A = "5d4bb0f6-2a37-4c41-9a36-0c5b7c1d2e01"
SHARE_B = "5d4bb0f6-2a37-4c41-9a36-0c5b7c1d2e02"
SHARE_C = "5d4bb0f6-2a37-4c41-9a36-0c5b7c1d2e03"
QUARTER = {"memory": "20Gi", "compute": "25"}


def shared_config(node_file: Path, tmp_path: Path, enforce: str) -> Path:
    """A config with shares, on a node whose MPS control program is there."""
    node_file.write_text(node_file.read_text() + "mps: {available: true}\n")
    config = tmp_path / "config.yaml"
    config.write_text(f"version: v1\nsharing:\n  shares: {{enforce: {enforce}}}\n")
    return config


async def started(node: DraNode, node_file: Path, tmp_path: Path, enforce: str) -> AgentProcess:
    config = shared_config(node_file, tmp_path, enforce)
    return await node.start(node_file, "--config", str(config))


def share(node: DraNode, uid: str, share_id: str, device: str = "gpu-0") -> None:
    node.claim(uid, [("gpu", GPU, device)], shareID=share_id, consumedCapacity=QUARTER)


async def prepared(node: DraNode, uid: str) -> tuple[str, list[str]]:
    """The error of preparing claim `uid` ("" when prepared) and its CDI device IDs."""
    answer = (await node.kubelet.prepare(GPU, [ref(uid)])).claims[uid]
    return str(answer.error), [i for d in answer.devices for i in d.cdi_device_ids]


def env(node: DraNode, uid: str) -> dict[str, str]:
    spec = node.spec(GPU, uid)
    assert spec is not None, f"no CDI spec for {uid}"
    [entry] = [d for d in spec["devices"] if d["name"] == f"{uid}-env"]
    return dict(e.split("=", 1) for e in entry["containerEdits"]["env"])


async def test_each_whole_gpu_is_published_with_its_consumable_memory_and_compute(
    dra_node: DraNode, node_file: Path, tmp_path: Path
) -> None:
    await started(dra_node, node_file, tmp_path, "none")
    gpu = dra_node.devices(GPU)["gpu-0"]
    assert gpu["allowMultipleAllocations"] is True
    grid = {"min": "1Gi", "max": "79Gi", "step": "1Gi"}
    assert gpu["capacity"] == {
        "memory": {"value": "81559Mi", "requestPolicy": {"default": "79Gi", "validRange": grid}},
        "compute": {
            "value": "100",
            "requestPolicy": {
                "default": "0",
                "validRange": {"min": "0", "max": "100", "step": "1"},
            },
        },
    }


async def test_two_claims_shares_of_one_gpu_are_prepared_side_by_side_and_kept(
    dra_node: DraNode, node_file: Path, tmp_path: Path
) -> None:
    agent = await started(dra_node, node_file, tmp_path, "mps")
    share(dra_node, "a", SHARE_A)
    share(dra_node, "b", SHARE_B)
    assert await prepared(dra_node, "a") == (
        "",
        [f"k8s.{GPU}/claim=a-gpu-0-{SHARE_A}", f"k8s.{GPU}/claim=a-env"],
    )
    assert (await prepared(dra_node, "b"))[0] == ""
    assert "shares={'gpu-0-" + SHARE_B + "': {'memory': '20Gi', 'compute': '25'}}" in (agent.stderr)
    told = env(dra_node, "b")
    assert told["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=20480M"
    assert told["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "25"
    assert told["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    assert told["CUDA_MPS_PIPE_DIRECTORY"] == f"/mps/{GPU}/pipe"
    dra_node.claim("whole", [("gpu", GPU, "gpu-0")])
    error, _ = await prepared(dra_node, "whole")
    assert "gpu-0: already prepared for claim" in error

    await dra_node.kubelet.unprepare(GPU, [ref("a")])
    assert dra_node.spec(GPU, "a") is None
    assert dra_node.spec(GPU, "b") is not None
    assert "already prepared for claim ns/c-b" in (await prepared(dra_node, "whole"))[0]


async def test_shares_survive_an_agent_restart_and_a_new_share_joins_them(
    dra_node: DraNode, node_file: Path, tmp_path: Path
) -> None:
    agent = await started(dra_node, node_file, tmp_path, "none")
    share(dra_node, "b", SHARE_B)
    first = await prepared(dra_node, "b")
    assert first[0] == ""
    assert "CUDA_MPS_PIPE_DIRECTORY" not in env(dra_node, "b")  # enforce: none
    assert agent.terminate() == 0
    (dra_node.cdi / f"k8s.{GPU}-claim_b.yaml").unlink()  # a reboot empties the CDI root

    await dra_node.start(node_file, "--config", str(tmp_path / "config.yaml"))
    spec = dra_node.spec(GPU, "b")
    assert spec is not None
    assert f"b-gpu-0-{SHARE_B}" in [d["name"] for d in spec["devices"]]
    assert await prepared(dra_node, "b") == first
    share(dra_node, "c", SHARE_C)
    assert (await prepared(dra_node, "c"))[0] == ""
    dra_node.claim("whole", [("gpu", GPU, "gpu-0")])
    assert "gpu-0: already prepared for claim ns/c-" in (await prepared(dra_node, "whole"))[0]


async def test_an_api_server_without_consumable_capacity_is_said_once_and_not_rewritten(
    dra_node: DraNode, node_file: Path, tmp_path: Path
) -> None:
    dra_node.server.store.consumable_capacity = False
    agent = await started(dra_node, node_file, tmp_path, "none")
    assert "allowMultipleAllocations" not in dra_node.devices(GPU)["gpu-0"]
    await dra_node.wait(lambda: "dra_shares_unavailable" in agent.stderr)
    share(dra_node, "a", SHARE_A)  # a change of the prepared claims: a pass that compares
    assert (await prepared(dra_node, "a"))[0] == ""
    writes = sum(dra_node.server.count(v, "resourceslices") for v in ("create", "update"))
    assert writes == 2  # one slice per driver, written once
    assert agent.stderr.count("dra_shares_unavailable") == 1
