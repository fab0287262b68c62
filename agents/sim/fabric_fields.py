"""The node file's `gpus[].fabric`: the NVLink fabric a GPU registered with, as NVML's
nvmlDeviceGetGpuFabricInfo(V) answers it (docs/configuration.md)."""

from __future__ import annotations

import uuid as uuidlib

from agents.core.fabric_health import INCORRECT_CONFIGURATIONS, YES_NO, health_mask
from agents.core.gfd_facts import Fabric
from agents.sim.fields import Fields, MappingValue

# NVML_GPU_FABRIC_STATE_*, by the names the node file gives them.
STATES = {"notStarted": 1, "inProgress": 2, "completed": 3}
# The registration's outcome (an nvmlReturn_t), by NVML's error names.
STATUSES = {"Success": 0, "NotReady": 27, "Timeout": 10, "Unknown": 999}
_KEYS = {"clusterUuid", "cliqueId", "state", "status", "health"}
HEALTH_NAMES = (*YES_NO, *INCORRECT_CONFIGURATIONS)


def fabric(f: Fields, m: MappingValue, path: str) -> Fabric | None:
    """`fabric: {clusterUuid, cliqueId, state: completed, status: Success, health: []}`;
    absent: the GPU has no fabric (NVML answers NotSupported)."""
    if m.get("fabric") is None:
        return None
    p = f"{path}.fabric"
    doc = f.mapping(m["fabric"], p, _KEYS)
    cluster = f.string(
        doc, p, "clusterUuid", None, expected="a UUID, 8-4-4-4-12 hex digits", check=_is_uuid
    )
    return Fabric(
        cluster_uuid=str(uuidlib.UUID(cluster)),
        clique_id=f.integer(doc, p, "cliqueId", 0, minimum=0),
        state=STATES[f.choice(doc, p, "state", tuple(STATES), "completed")],
        status=STATUSES[f.choice(doc, p, "status", tuple(STATUSES), "Success")],
        health_mask=health_mask(_health(f, doc, p)),
    )


def _health(f: Fields, doc: MappingValue, path: str) -> tuple[str, ...]:
    """`health: [routeUnhealthy, ...]`: the conditions at fault, at most one of them an
    incorrect configuration (NVML's mask holds one); left out or empty: all healthy."""
    names = f.strings(doc, path, "health")
    for i, name in enumerate(names):
        if name not in HEALTH_NAMES:
            f.fail(f"{path}.health[{i}]", " or ".join(HEALTH_NAMES))
    if len({n for n in names if n in INCORRECT_CONFIGURATIONS}) > 1:
        f.fail(f"{path}.health", "at most one incorrect configuration")
    return tuple(dict.fromkeys(names))


def _is_uuid(text: str) -> bool:
    try:
        return str(uuidlib.UUID(text)) == text.lower()
    except ValueError:
        return False
