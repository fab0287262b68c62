"""The kubelet's pod-resources API (v1.PodResourcesLister), answered from the stand-in's
device manager: the pod under admission with its devices so far, deleted pods gone at
once, ended pods that are not deleted still listed with their devices."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import grpc
import structlog

from agents.api import podresources_pb2 as pr
from agents.api import podresources_pb2_grpc as pr_grpc

from .admission import PodAllocation

log = structlog.get_logger()

NAMESPACE = "default"


class PodResourcesServer:
    """Serves `listed()` on a unix socket of its own (0600, as the kubelet's)."""

    def __init__(self, socket_path: Path, listed: Callable[[], Iterable[PodAllocation]]) -> None:
        self.socket_path = socket_path
        self._listed = listed
        self._server: Any = None
        self.calls = 0

    async def start(self) -> None:
        self.socket_path.parent.mkdir(parents=True, exist_ok=True)
        self.socket_path.unlink(missing_ok=True)
        server = grpc.aio.server()
        pr_grpc.add_PodResourcesListerServicer_to_server(_Lister(self), server)
        server.add_insecure_port(f"unix://{self.socket_path}")
        await server.start()
        self.socket_path.chmod(0o600)
        self._server = server
        log.info("pod_resources_started", socket=str(self.socket_path))

    async def stop(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            await server.stop(None)
            self.socket_path.unlink(missing_ok=True)

    def answer(self) -> pr.ListPodResourcesResponse:
        self.calls += 1
        return listing_response(self._listed())


def listing_response(pods: Iterable[PodAllocation]) -> pr.ListPodResourcesResponse:
    """What List answers when these pods are known, each container with its devices."""
    return pr.ListPodResourcesResponse(pod_resources=[_pod(p) for p in pods])


def _pod(pod: PodAllocation) -> pr.PodResources:
    return pr.PodResources(
        name=pod.pod,
        namespace=NAMESPACE,
        containers=[
            pr.ContainerResources(
                name=container.name,
                devices=[
                    pr.ContainerDevices(resource_name=resource, device_ids=sorted(ids))
                    for resource, ids in container.devices.items()
                ],
            )
            for container in pod.containers.values()
        ],
    )


class _Lister(pr_grpc.PodResourcesListerServicer):  # type: ignore[misc]
    def __init__(self, server: PodResourcesServer) -> None:
        self._server = server

    async def List(self, request: Any, context: Any) -> Any:  # noqa: N802 (the RPC name)
        return self._server.answer()
