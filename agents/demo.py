"""`node-agent demo`: the agents on a bundled simulated node, driven by the kubelet stand-in.

Shows what a person would check on a real node: the capacity and the GPU labels that
selectors written for NVIDIA's GPU Feature Discovery read, a few pods' devices with
their GPU<->NIC pairs, a fault turning a device Unhealthy and a reset bringing it back, a
GPU whose PCIe link trains at half width turning Degraded (chosen last, still counted by
the kubelet) and Healthy again once restored, and a clean stop; then two DRA claims'
shares of one GPU, with their MPS limits (agents/demo_shares.py).
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from agents.backends import simulated_backends
from agents.config import parse_config
from agents.core.health import GpuLost, Grade
from agents.core.topology import Topology
from agents.core.xid import HOLD_S
from agents.daemon import Agent
from agents.demo_shares import show_shares
from agents.gpu.family import GpuFamily
from agents.gpu.plan import GPU_RESOURCE
from agents.kernel.catalogue import Inventory
from agents.plugin.api import DevicePlugins
from agents.roce.family import RoceFamily
from agents.sim.bundled import DEMO_NODE, bundled_node
from agents.standin.admission import Container, Pod, PodAllocation
from agents.standin.kubelet import Kubelet
from agents.timing import Timing

NIC_RESOURCE = "rdma/roce"
WAIT_S = 10.0
# A Degraded GPU is Healthy again after every signal has been within limits this long
# (60 s by default), its signals read every SIGNAL_PROBE_S (5 s by default): short here.
DEGRADED_HOLD_S = 3
SIGNAL_PROBE_S = 1.0
DEMO_CONFIG = f"version: v1\nhealth:\n  degraded:\n    holdS: {DEGRADED_HOLD_S}\n"


class Demo:
    def __init__(self, work: Path, out: Callable[[str], None] = print) -> None:
        self.node_file = work / "node.yaml"
        shutil.copy(bundled_node(DEMO_NODE), self.node_file)
        self.plugin_dir = work / "device-plugins"
        self.plugin_dir.mkdir()
        self.out = out
        # The kubelet's pod-resources API too, as on a real node.
        self.pod_resources = work / "pod-resources.sock"
        self.kubelet = Kubelet(self.plugin_dir, seed=7, pod_resources_socket=self.pod_resources)

    async def run(self) -> None:
        stop = asyncio.Event()
        await self.kubelet.start()
        async with simulated_backends(self.node_file) as backends:
            agent = Agent(
                parse_config(DEMO_CONFIG, "<demo>"),
                "<demo>",
                DevicePlugins(self.plugin_dir, self.pod_resources),
                backends,
                timing=Timing(signal_probe_s=SIGNAL_PROBE_S),
            )
            await agent.start()
            task = asyncio.ensure_future(agent.run(stop))
            try:
                await self._story(agent)
            finally:
                stop.set()
                await task
        await self.kubelet.stop()
        gone = not any(self.plugin_dir.glob("node-agent-*.sock"))
        self.out(f"\nAgent stopped; its sockets removed: {'yes' if gone else 'NO'}.")
        await show_shares(self.node_file, self.plugin_dir.parent, self.out)

    async def _story(self, agent: Agent) -> None:
        started = time.monotonic()
        await self.kubelet.wait_until(
            lambda k: bool(_devices(k, GPU_RESOURCE) and _devices(k, NIC_RESOURCE)), WAIT_S
        )
        self.out(f"Registered with the kubelet in {time.monotonic() - started:.2f} s.\n")
        self._describe_node()
        self._gfd_labels(agent)
        names = self._names(agent)
        for pod in (
            Pod("trainer-0", [Container("train", {GPU_RESOURCE: 4, NIC_RESOURCE: 4})]),
            Pod("trainer-1", [Container("train", {NIC_RESOURCE: 2, GPU_RESOURCE: 2})]),
            Pod("notebook", [Container("lab", {GPU_RESOURCE: 1})]),
        ):
            self._show_pod(await self.kubelet.admit(pod), agent, names)
        await self._fault(agent, names)
        await self._degraded(agent, names)

    def _describe_node(self) -> None:
        for title, counts in (
            ("Capacity", self.kubelet.capacity()),
            ("Allocatable", self.kubelet.allocatable()),
        ):
            self.out(f"{title}:")
            width = max(len(r) for r in counts) + 1
            for resource, n in sorted(counts.items()):
                self.out(f"  {resource + ':':<{width}}  {n}")
        self.out("")

    def _gfd_labels(self, agent: Agent) -> None:
        """The labels GPU Feature Discovery would write, as the node carries them."""
        labels = {k: v for k, v in sorted(agent.labels().items()) if k.startswith("nvidia.com/")}
        self.out("Labels (as NVIDIA's GPU Feature Discovery writes them):")
        for key, value in labels.items():
            self.out(f"  {key}={value}")
        self.out("")

    def _names(self, agent: Agent) -> dict[str, str]:
        gpu, roce = agent.family(GpuFamily), agent.family(RoceFamily)
        assert gpu is not None and roce is not None
        names = {g.uuid: f"GPU{g.index}" for g in gpu.gpus}
        names |= {n.pci: f"{n.rdma}/{n.netdev}" for n in roce.nics}
        return names

    def _show_pod(self, allocation: PodAllocation, agent: Agent, names: dict[str, str]) -> None:
        gpu_family, roce = agent.family(GpuFamily), agent.family(RoceFamily)
        assert gpu_family is not None and roce is not None
        topology = Topology(gpu_family.locations(), roce.locations())
        for container, got in allocation.containers.items():
            gpus = got.devices.get(GPU_RESOURCE, [])
            nics = got.devices.get(NIC_RESOURCE, [])
            self.out(
                f"Pod {allocation.pod}/{container}  (kubelet asked: {' then '.join(got.order)})"
            )
            for gpu in sorted(gpus, key=lambda g: names[g]):
                near = [n for n in nics if n in topology.nearest_nics(gpu)]
                pair = (
                    ", ".join(f"{names[n]} ({topology.pair_distance(gpu, n)})" for n in near)
                    or "no NIC in this pod"
                )
                self.out(f"  {names[gpu]:<6} <-> {pair}")
            for nic in nics:
                if not any(nic in topology.nearest_nics(g) for g in gpus):
                    self.out(f"  {names[nic]} (no GPU of this pod on its switch)")
            for resource, response in sorted(got.responses.items()):
                for key, value in sorted(response.envs.items()):
                    self.out(f"  env {key}={value}")
                if resource == NIC_RESOURCE:
                    self.out(f"  devices {' '.join(d.container_path for d in response.devices)}")
            self.out("")

    async def _fault(self, agent: Agent, names: dict[str, str]) -> None:
        gpu = agent.family(GpuFamily)
        assert gpu is not None
        victim = gpu.gpus[5]
        self.out(f"Injecting XID 79 (fell off the bus) on {names[victim.uuid]} ...")
        seen = await self._edit_and_wait(
            lambda node: node["gpus"][5].__setitem__("xids", [79]),
            lambda k: _health(k, victim.uuid) == "Unhealthy",
        )
        self.out(f"  kubelet saw {names[victim.uuid]} Unhealthy after {seen * 1000:.0f} ms")
        self._describe_node()
        # NVML never says that an XID is over: only a reset (the GPU leaves the bus and
        # answers again), an opt-in recovery period, or a restart brings the GPU back.
        self.out(f"Resetting {names[victim.uuid]} (it leaves the bus, then answers again) ...")
        await self._edit_and_wait(
            lambda node: node["gpus"][5].update(xids=[], lost=True),
            lambda _k: isinstance(gpu.unhealthy_cause(victim.uuid), GpuLost),
        )
        seen = await self._edit_and_wait(
            lambda node: node["gpus"][5].__setitem__("lost", False),
            lambda k: _health(k, victim.uuid) == "Healthy",
        )
        self.out(
            f"  kubelet saw {names[victim.uuid]} Healthy again after {seen * 1000:.0f} ms"
            f" (NVML answering normally for {HOLD_S:g} s first)"
        )

    async def _degraded(self, agent: Agent, names: dict[str, str]) -> None:
        gpu = agent.family(GpuFamily)
        assert gpu is not None
        for name in ("trainer-1", "notebook"):
            await self.kubelet.end(name)
        held = self.kubelet.allocated().get(GPU_RESOURCE, set())
        free = [g for g in gpu.gpus if g.uuid not in held]
        index = next(i for i, g in enumerate(gpu.gpus) if g is free[0])
        victim = free[0].uuid
        self.out(
            f"\nEnded trainer-1 and notebook: {len(free)} GPUs free. "
            f"{names[victim]}'s PCIe link retrains at x8 of x16 ..."
        )
        # The kubelet hears of no change: the GPUs' device list (with grades) does.
        inventory = gpu.resources()[0].inventory
        seen = await self._edit_and_wait(
            lambda node: node["gpus"][index].__setitem__("pcie", {"width": 8, "maxWidth": 16}),
            lambda _k: _grade(gpu, victim) is Grade.DEGRADED,
            changes=inventory,
        )
        cause = gpu.unhealthy_cause(victim)
        why = cause.text() if cause is not None else ""
        self.out(f"  {names[victim]} Degraded after {seen * 1000:.0f} ms: {why}")
        self.out(f"  the kubelet still counts it: {_health(self.kubelet, victim)}")
        pod = Pod("inference", [Container("serve", {GPU_RESOURCE: len(free) - 1})])
        got = (await self.kubelet.admit(pod)).containers["serve"].devices[GPU_RESOURCE]
        chosen = ", ".join(sorted(names[g] for g in got))
        self.out(f"  pod inference asks {len(got)} GPUs, preferred and given: {chosen}")
        await self.kubelet.end("inference")
        self.out(f"Restoring {names[victim]}'s link to x16 ...")
        seen = await self._edit_and_wait(
            lambda node: node["gpus"][index].pop("pcie", None),
            lambda _k: _grade(gpu, victim) is Grade.HEALTHY,
            changes=inventory,
        )
        self.out(
            f"  {names[victim]} Healthy again after {seen * 1000:.0f} ms"
            f" (held for holdS = {DEGRADED_HOLD_S} s from the last probe out of limits)"
        )

    async def _edit_and_wait(
        self,
        edit: Callable[[dict[str, Any]], object],
        seen: Callable[[Kubelet], bool],
        *,
        changes: Inventory | None = None,
    ) -> float:
        """Seconds from the edit until `seen`, checked as the kubelet hears of a change,
        or where it hears of none, as `changes` does."""
        node = yaml.safe_load(self.node_file.read_text())
        edit(node)
        tmp = self.node_file.with_suffix(".tmp")
        tmp.write_text(yaml.safe_dump(node, sort_keys=False))
        started = time.monotonic()
        tmp.rename(self.node_file)
        if changes is None:
            await self.kubelet.wait_until(seen, WAIT_S)
            return time.monotonic() - started
        async with asyncio.timeout(WAIT_S):
            while True:
                version = changes.version
                if seen(self.kubelet):
                    return time.monotonic() - started
                await changes.wait_newer(version)


def _devices(kubelet: Kubelet, resource: str) -> dict[str, Any]:
    view = kubelet.resource(resource)
    return dict(view.devices) if view is not None else {}


def _grade(gpu: GpuFamily, uuid: str) -> Grade:
    cause = gpu.unhealthy_cause(uuid)
    return Grade.HEALTHY if cause is None else cause.grade


def _health(kubelet: Kubelet, device: str) -> str | None:
    state = _devices(kubelet, GPU_RESOURCE).get(device)
    return state.health if state is not None else None


async def run_demo() -> int:
    with tempfile.TemporaryDirectory(prefix="node-agent-demo-") as work:
        print(
            f"node-agent demo: a simulated 8-GPU, 8-NIC node ({DEMO_NODE}) and a kubelet stand-in\n"
        )
        await Demo(Path(work)).run()
    return 0
