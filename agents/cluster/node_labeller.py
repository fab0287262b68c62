"""`--label-node`: the labels the agent owns patched onto its own Node, and only those: the
fabric's and GFD's `nvidia.com/` ones. Runs in its own task: an API server slow or down
delays the labels, nothing else."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence

import structlog

from agents.cluster.client import ApiClient, ApiError, UnreachableError
from agents.core.fabric_place import ALL_KEYS
from agents.kernel.catalogue import Inventory
from agents.tasks import first

log = structlog.get_logger(__name__)

MERGE = "application/merge-patch+json"
FIRST_RETRY_S = 0.5
MAX_RETRY_S = 30.0


GFD_PREFIX = "nvidia.com/"  # GFD's labels (agents/core/gfd_labels.py)


def owned(key: str) -> bool:
    """A label this agent writes: the fabric's, or one of GFD's."""
    return key in ALL_KEYS or key.startswith(GFD_PREFIX)


def label_patch(wanted: Mapping[str, str], earlier: Iterable[str] = ()) -> dict[str, object]:
    """A JSON merge patch setting the labels in `wanted` and removing (null) every other
    fabric label (one left by an earlier run, or by another labelKeys setting) and every
    label of `earlier` (what this agent patched before) no longer wanted: a MIG profile
    gone, a clique that no longer agrees."""
    labels: dict[str, str | None] = {key: None for key in (*ALL_KEYS, *earlier)}
    labels.update(wanted)
    return {"metadata": {"labels": labels}}


class NodeLabeller:
    """One per agent; owns its client. `run` keeps the Node's labels of ours true."""

    def __init__(
        self,
        node: str,
        client: ApiClient,
        *,
        first_retry_s: float = FIRST_RETRY_S,
        max_retry_s: float = MAX_RETRY_S,
    ) -> None:
        self.node = node
        self._client = client
        self._first_retry_s, self._max_retry_s = first_retry_s, max_retry_s
        self.patched: dict[str, str] | None = None  # as the Node has them since our last patch
        self._failing = False

    async def run(
        self, labels: Callable[[], Mapping[str, str]], inventories: Sequence[Inventory]
    ) -> None:
        """Patch now and whenever a device list (or what is said of it) changes, until
        cancelled; a failed patch is retried with backoff."""
        delay = self._first_retry_s
        while True:
            versions = [i.version for i in inventories]
            wanted = {k: v for k, v in labels().items() if owned(k)}
            retry_in: float | None = None
            if wanted != self.patched:
                if await self._patch(wanted):
                    delay = self._first_retry_s
                else:
                    retry_in, delay = delay, min(delay * 2, self._max_retry_s)
            waits = (i.wait_newer(v) for i, v in zip(inventories, versions, strict=True))
            await first(*waits, within=retry_in)

    async def _patch(self, wanted: dict[str, str]) -> bool:
        path = f"/api/v1/nodes/{self.node}"
        try:
            patch = label_patch(wanted, self.patched or ())
            await self._client.request("PATCH", path, patch, MERGE)
        except (ApiError, UnreachableError) as exc:
            if not self._failing:  # one line per outage, not per retry
                log.warning(
                    "node_labels_unpatched",
                    node=self.node,
                    error=str(exc),
                    effect="retrying with backoff; device plugins keep serving",
                )
            self._failing = True
            return False
        self._failing, self.patched = False, wanted
        log.info("node_labels_patched", node=self.node, labels=wanted)
        return True

    async def aclose(self) -> None:
        await self._client.aclose()
