"""How pairing is wired into the agent: what it says when it cannot pair, and NICs that
appear after the start getting partners."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

import structlog.testing
import yaml

from agents.backends import simulated_backends
from agents.config import parse_config
from agents.core.ledger import GPU, NIC
from agents.core.topology import PciLocation
from agents.daemon import Agent
from agents.kernel.kubelet_facts import CheckpointFile, PodResources
from agents.plugin.api import DevicePlugins
from agents.plugin.kubelet_pairing import Pairing
from agents.sim.bundled import bundled_node
from agents.standin.checkpoint import CheckpointEntry, checkpoint_data, write_checkpoint
from agents.standin.podresources import PodResourcesServer
from agents.tasks import until
from hack.benchlib.nodes import sharing_config
from tests.conditions import async_wait_until


async def test_time_slicing_turns_pairing_off_and_says_once_what_is_unpaired(
    tmp_path: Path,
) -> None:
    node = tmp_path / "node.yaml"
    shutil.copy(bundled_node("h100-8gpu-8nic"), node)
    config = parse_config(yaml.safe_dump(sharing_config(4)), "<test>")
    with structlog.testing.capture_logs() as logs:
        async with simulated_backends(node) as backends:
            agent = Agent(config, "<test>", DevicePlugins(tmp_path), backends)
            await agent.start()
            assert agent.pairing is not None and not agent.pairing.active
    off = [e for e in logs if e["event"] == "pairing_off"]
    assert len(off) == 1
    assert off[0]["log_level"] == "warning"
    assert off[0]["unpaired"] == {"nvidia.com/gpu": "shared or MIG GPUs", "rdma/roce": "NICs"}
    assert "time-slicing" in off[0]["reason"]


def _location(switch: int, device: int) -> PciLocation:
    """A function behind PCIe switch `switch` (its own downstream port) on one host bridge."""
    root, up = f"0000:{switch:02x}:01.0", f"0000:{switch + 1:02x}:00.0"
    port = f"0000:{switch + 2:02x}:{device:02x}.0"
    address = f"0000:{switch + 3 + device:02x}:00.0"
    return PciLocation(address, (root, up, port), "pci0000:00", 0)


async def test_a_nic_that_appears_later_gets_partners(tmp_path: Path) -> None:
    pairing = Pairing(CheckpointFile(tmp_path), PodResources(None))
    try:
        gpu, nic = pairing.side(GPU), pairing.side(NIC)
        gpu.located("nvidia.com/gpu", {"g0": _location(0x10, 0), "g1": _location(0x20, 0)})
        nic.located("rdma/roce", {})
        assert not pairing.start({"nvidia.com/gpu": "whole GPUs", "rdma/roce": "NICs"})
        assert nic.prefer(["n0"], [], 1) is None  # off: the resource chooses alone
        nic.located("rdma/roce", {"n0": _location(0x10, 1)})  # on g0's switch
        assert pairing.active
        nic.located("rdma/roce", {"n0": _location(0x10, 1), "n1": _location(0x20, 1)})
        gpu.allocated(["g1"])
        assert nic.prefer(["n0", "n1"], [], 1) == ["n1"]  # g1's own switch, new partner
    finally:
        await pairing.close()


async def test_update_writes_that_flip_health_back_do_not_end_the_container(
    tmp_path: Path,
) -> None:
    """A real kubelet takes long between a container's resources; another plugin's health
    may flip and flip back meanwhile: two renames, and RegisteredDevices as it was."""
    checkpoint = CheckpointFile(tmp_path)
    pairing = Pairing(checkpoint, PodResources(None))
    gpus = {f"g{i}": _location(0x10 * (i + 1), 0) for i in range(4)}
    nics = {f"n{i}": _location(0x10 * (i + 1), 1) for i in range(4)}
    registered = {"nvidia.com/gpu": list(gpus), "rdma/roce": list(nics), "x/fpga": ["f0"]}

    def write(entries: list[CheckpointEntry], fpga: list[str]) -> None:
        write_checkpoint(checkpoint.path, checkpoint_data(entries, {**registered, "x/fpga": fpga}))

    write([], ["f0"])
    gpu, nic = pairing.side(GPU), pairing.side(NIC)
    gpu.located("nvidia.com/gpu", gpus)
    nic.located("rdma/roce", nics)
    assert pairing.start({"nvidia.com/gpu": "whole GPUs", "rdma/roce": "NICs"})
    stop = asyncio.Event()
    task = asyncio.ensure_future(until(stop, pairing.run))
    try:
        got = gpu.prefer(sorted(gpus), [], 1)
        assert got is not None
        gpu.allocated(got)  # the container's first resource
        held = [CheckpointEntry("pod", "main", "nvidia.com/gpu", {0: got}, b"")]
        for fpga in ([], ["f0"]):  # flip, flip back: each rename read as it comes

            def read(before: int = checkpoint.reads) -> bool:
                return checkpoint.reads > before

            write(held, fpga)
            await async_wait_until(read, 5.0, "rename read")
        partner = {f"n{got[0][1:]}"}
        assert set(nic.prefer(sorted(nics), [], 1) or []) == partner
    finally:
        stop.set()
        await task
        await pairing.close()


async def test_pod_resources_is_asked_at_a_containers_first_resource_only(
    tmp_path: Path,
) -> None:
    """Its answer cannot change within one container's admission but for deleted pods,
    whose devices the kubelet offers again; at the next container it is asked anew."""
    lister = PodResourcesServer(tmp_path / "pr.sock", lambda: [])
    await lister.start()
    checkpoint = CheckpointFile(tmp_path)
    pairing = Pairing(checkpoint, PodResources(lister.socket_path))
    gpus = {f"g{i}": _location(0x10 * (i + 1), 0) for i in range(4)}
    nics = {f"n{i}": _location(0x10 * (i + 1), 1) for i in range(4)}
    registered = {"nvidia.com/gpu": list(gpus), "rdma/roce": list(nics)}
    write_checkpoint(checkpoint.path, checkpoint_data([], registered))
    gpu, nic = pairing.side(GPU), pairing.side(NIC)
    gpu.located("nvidia.com/gpu", gpus)
    nic.located("rdma/roce", nics)
    try:
        assert pairing.start({"nvidia.com/gpu": "whole GPUs", "rdma/roce": "NICs"})
        await pairing.refresh("nvidia.com/gpu")
        assert lister.calls == 1
        got = gpu.prefer(sorted(gpus), [], 1)
        assert got is not None
        gpu.allocated(got)
        await pairing.refresh("rdma/roce")  # the same container's second resource
        assert lister.calls == 1
        assert nic.prefer(sorted(nics), [], 1) == [f"n{got[0][1:]}"]
        held = [CheckpointEntry("a", "main", "nvidia.com/gpu", {0: got}, b"")]
        write_checkpoint(checkpoint.path, checkpoint_data(held, registered))  # end of a
        # The next container's first resource, the rename not yet taken in: asked anew.
        await pairing.refresh("rdma/roce")
        assert lister.calls == 2
    finally:
        await pairing.close()
        await lister.stop()
