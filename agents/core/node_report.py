"""What the cluster is told of device health: Event notes for health changes, counted per
kind of change, and the `DevicesHealthy` Node condition computed from the current state."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

CONDITION_TYPE = "DevicesHealthy"
UNHEALTHY_REASON = "DeviceUnhealthy"
HEALTHY_REASON = "DeviceHealthy"
ALL_HEALTHY_REASON = "DevicesHealthy"
WARNING, NORMAL = "Warning", "Normal"
MESSAGE_LIMIT = 1024  # a condition message lists at most this many characters
MAX_RECORDS = 512  # kinds of change remembered; the oldest is forgotten beyond this

# What an operator knows these XIDs by (NVIDIA's XID catalogue).
XID_NAMES = {
    48: "uncorrectable ECC",
    63: "ECC page retirement",
    64: "ECC page retirement failed",
    74: "NVLink error",
    79: "fell off the bus",
    92: "high single-bit ECC rate",
    94: "contained ECC error",
    95: "uncontained ECC error",
    119: "GSP timeout",
    120: "GSP error",
}
FIXED_CAUSES = {
    "lost": "NVML: GPU is lost",
    "hung": "NVML: no answer (hung)",
    "holding": "recovering: NVML answers again",
}


@dataclass(frozen=True)
class DeviceHealth:
    """One advertised device as the cluster is told of it."""

    resource: str  # nvidia.com/gpu
    device_id: str  # the kubelet's device ID (a replica's GPU: the GPU's UUID)
    where: str  # "GPU 3", "MIG 0:1", "interface ens1np0"
    healthy: bool
    reason: str | None = None  # the family's reason: "xid=79", "lost", "link_down", ...


def cause(reason: str | None) -> str:
    """A family's reason as an operator reads it: "xid=79" -> "XID 79 (fell off the bus)"."""
    if reason is None:
        return "healthy"
    if reason in FIXED_CAUSES:
        return FIXED_CAUSES[reason]
    if reason.startswith("xid="):
        return ", ".join(_xid(x) for x in reason.removeprefix("xid=").split(","))
    if reason.startswith("nvml: "):
        return "NVML: " + reason.removeprefix("nvml: ")
    if reason.startswith(("link_", "port_")):
        kind, _, state = reason.partition("_")
        return f"{'link' if kind == 'link' else 'RDMA port'} {state.replace('_', ' ')}"
    return reason


def _xid(text: str) -> str:
    name = XID_NAMES.get(int(text)) if text.isdigit() else None
    return f"XID {text} ({name})" if name else f"XID {text}"


@dataclass(frozen=True)
class EventNote:
    """One health change to be told: changes with the same key are counted into one Event."""

    key: tuple[str, str, bool, str]  # resource, device, healthy, cause
    type: str
    reason: str
    message: str


def note_of(change: DeviceHealth) -> EventNote:
    what = f"{change.resource} device {change.device_id} ({change.where})"
    if change.healthy:
        key = (change.resource, change.device_id, True, "")
        return EventNote(key, NORMAL, HEALTHY_REASON, f"{what} is Healthy again")
    text = cause(change.reason)
    key = (change.resource, change.device_id, False, text)
    return EventNote(key, WARNING, UNHEALTHY_REASON, f"{what} is Unhealthy: {text}")


@dataclass(frozen=True)
class Condition:
    status: str  # "True" | "False"
    reason: str
    message: str


def condition_of(devices: Iterable[DeviceHealth]) -> Condition:
    """The `DevicesHealthy` condition of the node, from every advertised device."""
    everything = list(devices)
    bad = [d for d in everything if not d.healthy]
    if not bad:
        return Condition("True", ALL_HEALTHY_REASON, f"all {len(everything)} devices are Healthy")
    parts = [f"{d.resource} {d.device_id} ({d.where}): {cause(d.reason)}" for d in bad]
    head = f"{len(bad)} of {len(everything)} devices Unhealthy: "
    message = head + "; ".join(parts)
    if len(message) > MESSAGE_LIMIT:
        shown: list[str] = []
        for part in parts:
            if len(head) + len("; ".join([*shown, part])) > MESSAGE_LIMIT - 20:
                break
            shown.append(part)
        message = f"{head}{'; '.join(shown)}; and {len(bad) - len(shown)} more"
    return Condition("False", UNHEALTHY_REASON, message)


@dataclass
class EventRecord:
    """The Event object of one kind of change: what the API server should hold."""

    name: str
    note: EventNote
    count: int
    first: str  # timestamps, RFC 3339
    last: str
    sent_count: int = 0  # the count the API server has
    created: bool = False  # the object exists on the API server


class EventBook:
    """Health changes counted per kind; what is not yet on the API server is `unsent()`.

    Changes are only ever added here, so a burst costs memory per kind, not per change,
    and an API server that was away is told the latest counts when it is back.
    """

    def __init__(self, name_prefix: str, limit: int = MAX_RECORDS) -> None:
        self._prefix = name_prefix
        self._limit = limit
        self._records: dict[tuple[str, str, bool, str], EventRecord] = {}
        self._made = 0

    def add(self, note: EventNote, now: str) -> EventRecord:
        record = self._records.pop(note.key, None)
        if record is None:
            record = EventRecord(self._new_name(), note, 0, now, now)
        record.note, record.count, record.last = note, record.count + 1, now
        self._records[note.key] = record  # most recent last
        while len(self._records) > self._limit:
            del self._records[next(iter(self._records))]
        return record

    def unsent(self) -> list[EventRecord]:
        return [r for r in self._records.values() if r.count != r.sent_count]

    def renew(self, record: EventRecord) -> None:
        """The API server lost the object (it expired): make it again under a new name."""
        record.name, record.created, record.sent_count = self._new_name(), False, 0

    def _new_name(self) -> str:
        self._made += 1
        return f"{self._prefix}.{self._made:x}"
