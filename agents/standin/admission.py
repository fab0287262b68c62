"""Pod admission as the kubelet's device manager does it: pick, ask, Allocate, checkpoint."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import grpc
import structlog

from .checkpoint import (
    NO_TOPOLOGY,
    CheckpointEntry,
    checkpoint_data,
    write_checkpoint,
)
from .endpoint import PluginEndpoint, PluginError
from .resources import ResourceView

log = structlog.get_logger()


@dataclass(frozen=True)
class Container:
    name: str
    limits: Mapping[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class Pod:
    name: str
    containers: Sequence[Container] = ()
    init_containers: Sequence[Container] = ()


@dataclass
class AllocatedContainer:
    """What one container got: device IDs and the plugin's raw answer, per resource."""

    name: str
    devices: dict[str, list[str]] = field(default_factory=dict)
    responses: dict[str, Any] = field(default_factory=dict)  # ContainerAllocateResponse
    order: list[str] = field(default_factory=list)  # resources in the order Allocate ran


@dataclass
class PodAllocation:
    pod: str
    containers: dict[str, AllocatedContainer] = field(default_factory=dict)

    def devices(self, container: str, resource: str) -> list[str]:
        return self.containers[container].devices.get(resource, [])


class AdmissionError(Exception):
    """The pod failed admission (the kubelet's UnexpectedAdmissionError); nothing stays held."""

    def __init__(
        self,
        where: tuple[str, str, str],
        message: str,
        code: grpc.StatusCode | None = None,
    ) -> None:
        self.pod, self.container, self.resource = where
        self.code = code
        self.details = message
        status = f" [{code.name}]" if code is not None else ""
        super().__init__(
            f"pod {self.pod} container {self.container} resource {self.resource}: {message}{status}"
        )


class Plugins(Protocol):
    """What admission needs of the kubelet: the device lists and the endpoints."""

    def resource(self, name: str) -> ResourceView | None: ...

    def endpoint(self, name: str) -> PluginEndpoint | None: ...

    def resources(self) -> Mapping[str, ResourceView]: ...


class DeviceManager:
    """Allocations of admitted pods; admits one pod at a time."""

    def __init__(self, checkpoint: Path, rng: random.Random, *, use_preferred: bool) -> None:
        self._checkpoint = checkpoint
        self._rng = rng
        self._use_preferred = use_preferred
        self._pods: dict[str, PodAllocation] = {}
        # Gone from the device manager, still in the checkpoint file until the next
        # admission of a container begins (the kubelet drops inactive pods only then).
        self._inactive: dict[str, PodAllocation] = {}
        # Ended but not deleted: devices free, still listed by pod-resources.
        self._ended: dict[str, PodAllocation] = {}
        self._picked: dict[str, set[str]] = {}  # chosen, Allocate not answered yet
        self._lock = asyncio.Lock()
        self.checkpoint_writes = 0

    def allocated(self) -> dict[str, set[str]]:
        in_use: dict[str, set[str]] = {}
        for pod in self._pods.values():
            for container in pod.containers.values():
                for resource, ids in container.devices.items():
                    in_use.setdefault(resource, set()).update(ids)
        for resource, chosen in self._picked.items():
            in_use.setdefault(resource, set()).update(chosen)
        return {resource: ids for resource, ids in in_use.items() if ids}

    def pod(self, name: str) -> PodAllocation | None:
        return self._pods.get(name)

    def release(self, pod: str, *, deleted: bool = True) -> bool:
        """The pod ended (and, if `deleted`, is gone from the API too): its devices are
        free. The kubelet writes no checkpoint for it."""
        gone = self._pods.pop(pod, None)
        if gone is not None:
            self._inactive[pod] = gone
            if not deleted:
                self._ended[pod] = gone
        if deleted:
            gone = self._ended.pop(pod, None) or gone
        return gone is not None

    def listed(self) -> list[PodAllocation]:
        """What pod-resources lists: every pod admitted or being admitted, and those
        ended but not deleted."""
        return [*self._pods.values(), *self._ended.values()]

    async def admit(self, pod: Pod, plugins: Plugins) -> PodAllocation:
        async with self._lock:
            if pod.name in self._pods:
                raise ValueError(f"pod {pod.name!r} is already admitted")
            allocation = PodAllocation(pod.name)
            self._inactive.clear()
            self._pods[pod.name] = allocation
            try:
                await self._admit_containers(pod, allocation, plugins)
            except BaseException as err:
                self._pods.pop(pod.name, None)
                log.warning("pod_admission_failed", pod=pod.name, error=str(err))
                raise
            finally:
                self._picked.clear()
            return allocation

    async def _admit_containers(
        self, pod: Pod, allocation: PodAllocation, plugins: Plugins
    ) -> None:
        reusable: dict[str, set[str]] = {}
        for container in pod.init_containers:
            done = await self._admit_container(pod.name, container, reusable, allocation, plugins)
            # Init containers run one after the other: a later container may take their devices.
            for resource, ids in done.devices.items():
                reusable.setdefault(resource, set()).update(ids)
        for container in pod.containers:
            done = await self._admit_container(pod.name, container, reusable, allocation, plugins)
            for resource, ids in done.devices.items():
                reusable.get(resource, set()).difference_update(ids)

    async def _admit_container(
        self,
        pod: str,
        container: Container,
        reusable: Mapping[str, set[str]],
        allocation: PodAllocation,
        plugins: Plugins,
    ) -> AllocatedContainer:
        done = AllocatedContainer(container.name)
        allocation.containers[container.name] = done
        resources = list(container.limits)
        # The kubelet ranges over a Go map: a fresh random order for every container.
        self._rng.shuffle(resources)
        for resource in resources:
            where = (pod, container.name, resource)
            required = container.limits[resource]
            if not self._is_device_resource(where, required, plugins):
                continue
            ids = await self._pick(where, required, reusable.get(resource, set()), plugins)
            if not ids:
                continue
            done.responses[resource] = await self._allocate(where, ids, plugins)
            done.devices[resource] = ids
            done.order.append(resource)
            self._picked.pop(resource, None)
            log.info(
                "container_allocated",
                pod=pod,
                container=container.name,
                devices=ids,
                resource=resource,
            )
        if done.devices:
            self.write_checkpoint(plugins.resources())
        return done

    def _is_device_resource(
        self, where: tuple[str, str, str], required: int, plugins: Plugins
    ) -> bool:
        resource = where[2]
        if plugins.resource(resource) is not None or resource in self.allocated():
            return True
        if "/" in resource and required > 0:
            # What the kubelet's resource-fit admission says of an extended resource it lacks.
            raise AdmissionError(
                where,
                f"Node didn't have enough resource: {resource}, "
                f"requested: {required}, used: 0, capacity: 0",
            )
        return False  # cpu, memory and the like are not the device manager's

    @staticmethod
    def _healthy(where: tuple[str, str, str], plugins: Plugins) -> set[str]:
        view = plugins.resource(where[2])
        if view is None:
            raise AdmissionError(where, f"cannot allocate unregistered device {where[2]}")
        healthy = view.healthy()
        if not healthy:
            raise AdmissionError(
                where, f"no healthy devices present; cannot allocate unhealthy devices {where[2]}"
            )
        return healthy

    async def _pick(
        self, where: tuple[str, str, str], required: int, reusable: set[str], plugins: Plugins
    ) -> list[str]:
        """Choose the devices as devicesToAllocate does: reused, preferred, then any free."""
        resource = where[2]
        healthy = self._healthy(where, plugins)
        picked: list[str] = []
        in_flight = self._picked.setdefault(resource, set())

        def take(candidates: Iterable[str]) -> bool:
            for device_id in self._shuffled(set(candidates).difference(picked)):
                if len(picked) >= required:
                    break
                picked.append(device_id)
                in_flight.add(device_id)
            return len(picked) >= required

        if take(reusable):
            return picked
        available = healthy - self.allocated().get(resource, set())
        needed = required - len(picked)
        if len(available) < needed:
            raise AdmissionError(
                where,
                f"requested number of devices unavailable for {resource}. "
                f"Requested: {needed}, Available: {len(available)}",
            )
        endpoint = plugins.endpoint(resource)
        if self._use_preferred and endpoint and endpoint.options.get_preferred_allocation_available:
            preferred = await self._preferred(
                where, endpoint, available | set(picked), picked, required
            )
            if take(available.intersection(preferred)):
                return picked
        take(available)
        return picked

    async def _preferred(
        self,
        where: tuple[str, str, str],
        endpoint: PluginEndpoint,
        available: set[str],
        must_include: list[str],
        size: int,
    ) -> list[str]:
        try:
            return await endpoint.preferred(
                self._shuffled(available), self._shuffled(must_include), size
            )
        except PluginError as err:
            raise AdmissionError(where, f"GetPreferredAllocation: {err.details}", err.code) from err

    async def _allocate(self, where: tuple[str, str, str], ids: list[str], plugins: Plugins) -> Any:
        endpoint = plugins.endpoint(where[2])
        if endpoint is None:
            raise AdmissionError(where, f"unknown Device Plugin {where[2]}")
        try:
            # The kubelet passes a Go set's UnsortedList: the order means nothing.
            return await endpoint.allocate(self._shuffled(ids))
        except PluginError as err:
            raise AdmissionError(where, f"Allocate: {err.details}", err.code) from err

    def write_checkpoint(self, views: Mapping[str, ResourceView]) -> None:
        """Replace the checkpoint file with the current allocations (one rename)."""
        entries = [
            CheckpointEntry(
                pod.pod,
                container.name,
                resource,
                _by_numa(ids, views.get(resource)),
                container.responses[resource].SerializeToString(),
            )
            for pod in [*self._pods.values(), *self._inactive.values()]
            for container in pod.containers.values()
            for resource, ids in container.devices.items()
        ]
        registered = {name: view.healthy() for name, view in views.items()}
        write_checkpoint(self._checkpoint, checkpoint_data(entries, registered))
        self.checkpoint_writes += 1

    def _shuffled(self, items: Iterable[str]) -> list[str]:
        result = sorted(items)  # sorted first, so that a seed alone fixes the order
        self._rng.shuffle(result)
        return result


def _by_numa(ids: Iterable[str], view: ResourceView | None) -> dict[int, list[str]]:
    by_numa: dict[int, list[str]] = {}
    for device_id in ids:
        state = view.devices.get(device_id) if view is not None else None
        for numa in state.numa if state is not None and state.numa else (NO_TOPOLOGY,):
            by_numa.setdefault(numa, []).append(device_id)
    return by_numa
