"""Which pod and container hold each of the agent's devices, as the kubelet's pod-resources
API says (docs/observability.md): asked every few seconds and at each scrape, never
holding a scrape up longer than its wait; no answer means no holders, not old ones."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping
from dataclasses import dataclass

from agents.api import podresources_pb2 as pr
from agents.exposition import Family
from agents.kernel.catalogue import Resource
from agents.kernel.kubelet_facts import PodResources

SCRAPE_WAIT_S = 0.25  # a scrape waits this long for a fresh answer, then takes the last one


@dataclass(frozen=True)
class Holder:
    """One device held by one container: the labels of node_agent_device_allocated."""

    resource: str
    device: str  # the ID the kubelet handed out (a replica's `<uuid>::<n>`)
    physical_device: str  # the device it is served from (a replica's GPU UUID)
    namespace: str
    pod: str
    container: str


# (DRA driver, device name) -> (family resource, device ID): whom a claimed device is.
DraNames = Mapping[tuple[str, str], tuple[str, str]]


class DeviceHolders:
    """The latest answer of pod-resources, as the Holders of our resources' devices."""

    def __init__(
        self,
        pod_resources: PodResources,
        resources: Callable[[], Iterable[Resource]],
        poll_s: float,
        dra_names: Callable[[], DraNames] = dict,
    ) -> None:
        self._pod_resources = pod_resources
        self._resources = resources
        self._dra_names = dra_names
        self._poll_s = poll_s
        self._asking: asyncio.Task[None] | None = None
        self.holders: tuple[Holder, ...] = ()

    async def refresh(self, wait_s: float = SCRAPE_WAIT_S) -> None:
        """Ask pod-resources (one question at a time: a call while one is out waits for
        that one) and wait up to wait_s for the answer; a late answer lands later."""
        if self._asking is None or self._asking.done():
            self._asking = asyncio.ensure_future(self._ask())
        await asyncio.wait({self._asking}, timeout=wait_s)  # a timer, not a task

    async def run(self) -> None:
        """Ask every poll period until cancelled."""
        try:
            while True:
                await self.refresh(self._poll_s)
                await asyncio.sleep(self._poll_s)
        finally:
            await self.close()

    async def close(self) -> None:
        asking, self._asking = self._asking, None
        if asking is not None:
            asking.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await asking
        await self._pod_resources.close()

    async def _ask(self) -> None:
        answer = await self._pod_resources.answer()
        if answer is None:
            self.holders = ()
            return
        claimed = any(c.dynamic_resources for p in answer.pod_resources for c in p.containers)
        names = self._dra_names() if claimed else {}  # the families' facts, only if needed
        self.holders = holders_of(answer, self._resources(), names)


def holders_of(
    answer: pr.ListPodResourcesResponse,
    resources: Iterable[Resource],
    dra_names: DraNames | None = None,
) -> tuple[Holder, ...]:
    """The devices of `resources` that the answer's containers hold: device-plugin IDs
    the resource lists, and DRA devices (driver and device name of a claim) that
    `dra_names` knows. Another plugin's or driver's devices, or ones gone, are left out."""
    ours = {r.name: r for r in resources}
    out: list[Holder] = []
    for pod in answer.pod_resources:
        for container in pod.containers:
            held = [*_plugin_held(container, ours), *_claimed(container, dra_names or {})]
            for name, device in held:
                resource = ours.get(name)
                if resource is not None:
                    physical = resource.physical_id(device)
                    where = (pod.namespace, pod.name, container.name)
                    out.append(Holder(resource.name, device, physical, *where))
    return tuple(dict.fromkeys(out))


def _plugin_held(
    container: pr.ContainerResources, ours: Mapping[str, Resource]
) -> Iterator[tuple[str, str]]:
    """(resource, device ID) of what the device plugins handed the container."""
    for devices in container.devices:
        resource = ours.get(devices.resource_name)
        listed: Collection[str] = resource.inventory.ids() if resource is not None else ()
        for device in devices.device_ids:
            if device in listed:
                yield devices.resource_name, device


def _claimed(container: pr.ContainerResources, names: DraNames) -> Iterator[tuple[str, str]]:
    """(resource, device ID) of the devices of the DRA claims the container uses, as the
    kubelet reports them (kubelets 1.34+; `dynamic_resources`)."""
    for claim in container.dynamic_resources:
        for device in claim.claim_resources:
            found = names.get((device.driver_name, device.device_name))
            if found is not None:
                yield found


class HoldersCollector:
    """node_agent_device_allocated from the holders' latest answer, at scrape time."""

    def __init__(self, holders: DeviceHolders) -> None:
        self._holders = holders

    def collect(self) -> Iterator[Family]:
        allocated = Family(
            "node_agent_device_allocated",
            "Each device a container holds, as the kubelet's pod-resources API says (value 1)",
            ["resource", "device", "physical_device", "namespace", "pod", "container"],
        )
        for h in self._holders.holders:
            labels = [h.resource, h.device, h.physical_device, h.namespace, h.pod, h.container]
            allocated.add(labels, 1)
        yield allocated
