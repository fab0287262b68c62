"""`node-agent demo`: the agents on a bundled simulated node, driven by the kubelet stand-in.

Shows what a person would check on a real node: the capacity, a few pods' devices with
their GPU<->NIC pairs, a fault turning a device Unhealthy and a reset bringing it back,
and a clean stop.
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
from agents.config import Config
from agents.core.health import GpuLost
from agents.core.topology import Topology
from agents.core.xid import HOLD_S
from agents.daemon import Agent
from agents.gpu.family import GpuFamily
from agents.gpu.plan import GPU_RESOURCE
from agents.roce.family import RoceFamily
from agents.sim.bundled import DEMO_NODE, bundled_node
from agents.standin.admission import Container, Pod, PodAllocation
from agents.standin.kubelet import Kubelet

NIC_RESOURCE = "rdma/roce"
WAIT_S = 10.0


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
                Config.default(),
                "<defaults>",
                self.plugin_dir,
                backends,
                pod_resources_socket=self.pod_resources,
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

    async def _story(self, agent: Agent) -> None:
        started = time.monotonic()
        await self.kubelet.wait_until(
            lambda k: bool(_devices(k, GPU_RESOURCE) and _devices(k, NIC_RESOURCE)), WAIT_S
        )
        self.out(f"Registered with the kubelet in {time.monotonic() - started:.2f} s.\n")
        self._describe_node()
        names = self._names(agent)
        for pod in (
            Pod("trainer-0", [Container("train", {GPU_RESOURCE: 4, NIC_RESOURCE: 4})]),
            Pod("trainer-1", [Container("train", {NIC_RESOURCE: 2, GPU_RESOURCE: 2})]),
            Pod("notebook", [Container("lab", {GPU_RESOURCE: 1})]),
        ):
            self._show_pod(await self.kubelet.admit(pod), agent, names)
        await self._fault(agent, names)

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

    async def _edit_and_wait(
        self,
        edit: Callable[[dict[str, Any]], object],
        seen: Callable[[Kubelet], bool],
    ) -> float:
        node = yaml.safe_load(self.node_file.read_text())
        edit(node)
        tmp = self.node_file.with_suffix(".tmp")
        tmp.write_text(yaml.safe_dump(node, sort_keys=False))
        started = time.monotonic()
        tmp.rename(self.node_file)
        await self.kubelet.wait_until(seen, WAIT_S)
        return time.monotonic() - started


def _devices(kubelet: Kubelet, resource: str) -> dict[str, Any]:
    view = kubelet.resource(resource)
    return dict(view.devices) if view is not None else {}


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
