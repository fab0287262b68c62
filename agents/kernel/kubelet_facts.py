"""What the kubelet tells a plugin besides the calls: its checkpoint file (renames and
contents) in the device-plugin directory, and the pod-resources API on its own socket."""

from __future__ import annotations

import asyncio
from pathlib import Path

import grpc
import structlog

from agents.api import podresources_pb2 as pr
from agents.api import podresources_pb2_grpc as pr_grpc
from agents.core.kubelet_checkpoint import Checkpoint, CheckpointFormatError, parse_checkpoint
from agents.hw.inotify import Change, DirectoryWatch, FsEvent

log = structlog.get_logger(__name__)

CHECKPOINT = "kubelet_internal_checkpoint"
POD_RESOURCES_SOCKET = Path("/var/lib/kubelet/pod-resources/kubelet.sock")
POD_RESOURCES_TIMEOUT_S = 1.0

Listing = dict[tuple[str, str], dict[str, list[str]]]  # (namespace/pod, container) -> resource


class CheckpointFile:
    """The checkpoint's renames, counted by an inotify watch of its directory, and its
    contents read when asked. Small and local: read on the event loop, like the watch."""

    def __init__(self, plugin_dir: Path) -> None:
        self.path = plugin_dir / CHECKPOINT
        self._watch: DirectoryWatch | None = None
        self.reads = 0

    def changes(self) -> tuple[Checkpoint | None, int] | None:
        """(contents, renames since the last call), or None when nothing was renamed. The
        first call reads the file as it is, with 0 renames: the state at start."""
        if self._watch is None:
            self._watch = DirectoryWatch(self.path.parent, Change.CREATED | Change.DIR_GONE)
            return self.read(), 0
        return self._counted(self._watch.drain())

    async def next_change(self) -> tuple[Checkpoint | None, int] | None:
        """Wait for the next renames and read the file at once: read rename by rename, the
        contents tell each write apart (several renames read together may not be)."""
        if self._watch is None:
            return self.changes()
        return self._counted(await self._watch.next_batch())

    def _counted(self, events: list[FsEvent]) -> tuple[Checkpoint | None, int] | None:
        writes = sum(1 for e in events if e.name == CHECKPOINT and e.change & Change.CREATED)
        return (self.read(), writes) if writes else None

    def read(self) -> Checkpoint | None:
        """None when the file is in another format; an empty checkpoint when it is absent."""
        self.reads += 1
        try:
            text = self.path.read_text()
        except FileNotFoundError:
            return Checkpoint({}, {})
        except OSError as exc:
            log.warning("checkpoint_unreadable", path=str(self.path), error=str(exc))
            return None
        try:
            return parse_checkpoint(text)
        except CheckpointFormatError as exc:
            log.warning("checkpoint_format_unknown", path=str(self.path), error=str(exc))
            return None

    def close(self) -> None:
        if self._watch is not None:
            self._watch.close()
            self._watch = None


class PodResources:
    """A client of the kubelet's v1.PodResourcesLister; None from `list` when it does not
    answer (no socket, an old kubelet, a timeout), which is logged once."""

    def __init__(
        self,
        socket: Path | None,
        *,
        timeout: float = POD_RESOURCES_TIMEOUT_S,
        effect: str = "pod ends are learned late, from the checkpoint and offered devices",
    ) -> None:
        self.socket = socket
        self._timeout = timeout
        self._effect = effect  # what its user does without it, said in the one warning
        self._channel: grpc.aio.Channel | None = None
        self._stub: pr_grpc.PodResourcesListerStub | None = None
        self._warned = False

    async def list(self) -> Listing | None:
        answer = await self.answer()
        return None if answer is None else listing_of(answer)

    async def answer(self) -> pr.ListPodResourcesResponse | None:
        """List's whole answer; None when it does not answer."""
        if self.socket is None:
            self._warn("no pod-resources socket configured")
            return None
        if self._stub is None:
            self._channel = grpc.aio.insecure_channel(f"unix://{self.socket}")
            self._stub = pr_grpc.PodResourcesListerStub(self._channel)
        try:
            answer: pr.ListPodResourcesResponse = await self._stub.List(
                pr.ListPodResourcesRequest(), timeout=self._timeout
            )
        except grpc.aio.AioRpcError as exc:
            self._warn(f"{exc.code().name}: {exc.details()}")
            return None
        except asyncio.CancelledError:
            raise
        self._warned = False
        return answer

    async def claims(self) -> set[tuple[str, str]] | None:
        """(namespace, name) of every DRA claim a container the kubelet knows holds;
        None when it does not answer."""
        answer = await self.answer()
        if answer is None:
            return None
        return {
            (claim.claim_namespace, claim.claim_name)
            for pod in answer.pod_resources
            for container in pod.containers
            for claim in container.dynamic_resources
        }

    def _warn(self, why: str) -> None:
        if not self._warned:
            self._warned = True
            log.warning(
                "pod_resources_unavailable",
                socket=str(self.socket),
                error=why,
                detail=self._effect,
            )

    async def close(self) -> None:
        channel, self._channel, self._stub = self._channel, None, None
        if channel is not None:
            await channel.close()


def listing_of(answer: pr.ListPodResourcesResponse) -> Listing:
    listing: Listing = {}
    for pod in answer.pod_resources:
        for container in pod.containers:
            by_resource: dict[str, list[str]] = {}
            for devices in container.devices:
                by_resource.setdefault(devices.resource_name, []).extend(devices.device_ids)
            listing[(f"{pod.namespace}/{pod.name}", container.name)] = by_resource
    return listing
