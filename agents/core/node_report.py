"""What the cluster is told of device health: Event notes for health changes, counted per
kind of change, and the `DevicesHealthy` and `DevicesDegraded` Node conditions computed
from the current state."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from agents.core.health import DeviceHealth, Grade

CONDITION_TYPE = "DevicesHealthy"
DEGRADED_TYPE = "DevicesDegraded"
DEGRADED_REASON = "DeviceDegraded"
NONE_DEGRADED_REASON = "NoDeviceDegraded"
UNHEALTHY_REASON = "DeviceUnhealthy"
HEALTHY_REASON = "DeviceHealthy"
ALL_HEALTHY_REASON = "DevicesHealthy"
WARNING, NORMAL = "Warning", "Normal"
MESSAGE_LIMIT = 1024  # a condition message lists at most this many characters
MAX_RECORDS = 512  # kinds of change remembered; the oldest is forgotten beyond this


@dataclass(frozen=True)
class EventNote:
    """One health change to be told: changes with the same key are counted into one Event."""

    key: tuple[str, str, bool, str]  # resource, device, healthy, cause
    type: str
    reason: str
    message: str


def note_of(change: DeviceHealth) -> EventNote:
    what = f"{change.resource} device {change.device_id} ({change.where})"
    if change.cause is None:
        key = (change.resource, change.device_id, True, "")
        return EventNote(key, NORMAL, HEALTHY_REASON, f"{what} is Healthy again")
    text, grade = change.cause.text(), change.grade.value  # "Unhealthy", "Degraded"
    key = (change.resource, change.device_id, False, text)
    return EventNote(key, WARNING, f"Device{grade}", f"{what} is {grade}: {text}")


@dataclass(frozen=True)
class Condition:
    status: str  # "True" | "False"
    reason: str
    message: str


def condition_of(devices: Iterable[DeviceHealth]) -> Condition:
    """The `DevicesHealthy` condition of the node, from every advertised device: False
    while one is Unhealthy (a Degraded device still works)."""
    everything = list(devices)
    bad = [d for d in everything if d.grade is Grade.UNHEALTHY]
    if bad:
        return Condition("False", UNHEALTHY_REASON, _listed(bad, len(everything), "Unhealthy"))
    slow = sum(1 for d in everything if d.grade is Grade.DEGRADED)
    if slow:
        message = f"no device of {len(everything)} is Unhealthy; {slow} Degraded"
    else:
        message = f"all {len(everything)} devices are Healthy"
    return Condition("True", ALL_HEALTHY_REASON, message)


def degraded_condition_of(devices: Iterable[DeviceHealth]) -> Condition:
    """The `DevicesDegraded` condition of the node: True, listing them, while a device is
    Degraded."""
    everything = list(devices)
    slow = [d for d in everything if d.grade is Grade.DEGRADED]
    if slow:
        return Condition("True", DEGRADED_REASON, _listed(slow, len(everything), "Degraded"))
    return Condition(
        "False", NONE_DEGRADED_REASON, f"none of {len(everything)} devices is Degraded"
    )


def conditions_of(devices: Iterable[DeviceHealth]) -> dict[str, Condition]:
    """Every condition the agent owns, by type."""
    everything = list(devices)
    return {
        CONDITION_TYPE: condition_of(everything),
        DEGRADED_TYPE: degraded_condition_of(everything),
    }


def _listed(devices: list[DeviceHealth], total: int, grade: str) -> str:
    """`2 of 8 devices Degraded: <resource> <id> (<where>): <cause>; ...`, at most
    MESSAGE_LIMIT characters."""
    parts = [f"{d.resource} {d.device_id} ({d.where}): {_text(d)}" for d in devices]
    head = f"{len(devices)} of {total} devices {grade}: "
    message = head + "; ".join(parts)
    if len(message) > MESSAGE_LIMIT:
        shown: list[str] = []
        for part in parts:
            if len(head) + len("; ".join([*shown, part])) > MESSAGE_LIMIT - 20:
                break
            shown.append(part)
        message = f"{head}{'; '.join(shown)}; and {len(devices) - len(shown)} more"
    return message


def _text(device: DeviceHealth) -> str:
    return "" if device.cause is None else device.cause.text()


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
