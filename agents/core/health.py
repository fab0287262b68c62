"""A device's health as one typed value: its grade and, unless Healthy, the cause with its
figures. Families make it; the kubelet stream, DRA, the log, metrics and the cluster
reports each ask it for what they show, and none of them reads a string back."""

from __future__ import annotations

import enum
import re
from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from agents.core.degraded import SignalVerdict

OURS = "node-agents.io"
DEGRADED_TAINT = f"{OURS}/degraded"
_NOT_LABEL = re.compile(r"[^A-Za-z0-9._-]+")
LABEL_MAX = 63  # the longest label value (a taint's) Kubernetes takes
Figure = int | float | str  # a measurement behind a cause: 8 (lanes), 100000 (Mb/s)

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


class Grade(enum.Enum):
    """How usable a device is; the value is how the cluster spells it."""

    HEALTHY = "Healthy"
    DEGRADED = "Degraded"  # works, but a job on it runs slower or soon stops
    UNHEALTHY = "Unhealthy"


@dataclass(frozen=True)
class Taint:
    """The taint a device that is not Healthy carries in DRA with --dra-device-taints."""

    key: str
    value: str = ""


class Cause(ABC):
    """Why a device is not Healthy. Each kind is a frozen dataclass: two equal causes are
    the same fault, told once."""

    @property
    def grade(self) -> Grade:
        return Grade.UNHEALTHY

    @property
    def news(self) -> bool:
        """False for a cause that only keeps a device at its grade for a while (recovering):
        nothing new to tell."""
        return True

    @property
    @abstractmethod
    def label(self) -> str:
        """The cause as the log and metrics name it: "xid=79", "lost", "link_down"."""

    @abstractmethod
    def text(self) -> str:
        """The cause as an operator reads it: "XID 79 (fell off the bus)", "link down"."""

    def figures(self) -> Mapping[str, Figure]:
        """The measurements behind the cause, by name (none for most faults)."""
        return {}

    @abstractmethod
    def taint(self, driver: str) -> Taint:
        """The device's DRA taint when published by `driver` (its key's domain)."""


@dataclass(frozen=True)
class Xids(Cause):
    """Critical XIDs delivered and not yet cleared (a reset, the recovery period)."""

    codes: tuple[int, ...]  # ascending, at least one

    @property
    def label(self) -> str:
        return "xid=" + ",".join(str(x) for x in self.codes)

    def text(self) -> str:
        return ", ".join(_xid_text(x) for x in self.codes)

    def taint(self, driver: str) -> Taint:
        return Taint(f"{driver}/xid", str(self.codes[0]))


def _xid_text(code: int) -> str:
    name = XID_NAMES.get(code)
    return f"XID {code} ({name})" if name else f"XID {code}"


@dataclass(frozen=True)
class GpuLost(Cause):
    """NVML answers that the GPU is lost (fallen off the bus, or being reset)."""

    @property
    def label(self) -> str:
        return "lost"

    def text(self) -> str:
        return "NVML: GPU is lost"

    def taint(self, driver: str) -> Taint:
        return Taint(f"{driver}/gpu-lost")


@dataclass(frozen=True)
class NvmlHung(Cause):
    """A call to NVML for this GPU did not return in time."""

    @property
    def label(self) -> str:
        return "hung"

    def text(self) -> str:
        return "NVML: no answer (hung)"

    def taint(self, driver: str) -> Taint:
        return _unhealthy(driver, self.label)


@dataclass(frozen=True)
class NvmlError(Cause):
    """NVML answered this GPU's query with an error."""

    error: str  # NVML's text: "Unknown Error"

    @property
    def label(self) -> str:
        return f"nvml: {self.error}"

    def text(self) -> str:
        return f"NVML: {self.error}"

    def taint(self, driver: str) -> Taint:
        return _unhealthy(driver, f"nvml-{self.error}")


@dataclass(frozen=True)
class Holding(Cause):
    """NVML answers normally again after a failure: the GPU stays Unhealthy for the hold
    time, which is no news."""

    @property
    def news(self) -> bool:
        return False

    @property
    def label(self) -> str:
        return "holding"

    def text(self) -> str:
        return "recovering: NVML answers again"

    def taint(self, driver: str) -> Taint:
        return _unhealthy(driver, self.label)


def _unhealthy(driver: str, why: str) -> Taint:
    """`<driver>/unhealthy` with `why` as a label value (other characters as '-')."""
    value = _NOT_LABEL.sub("-", why).strip("-._")[:LABEL_MAX].strip("-._")
    return Taint(f"{driver}/unhealthy", value or "unknown")


@dataclass(frozen=True)
class LinkNotUp(Cause):
    """A NIC's netdev is not up."""

    state: str  # "down", "absent"

    @property
    def label(self) -> str:
        return f"link_{self.state}"

    def text(self) -> str:
        return f"link {self.state.replace('_', ' ')}"

    def taint(self, driver: str) -> Taint:
        return Taint(f"{driver}/link-down")


@dataclass(frozen=True)
class PortNotActive(Cause):
    """A NIC's link is up, but its RDMA port is not ACTIVE."""

    state: str  # the port's state, lower case: "down", "init", "absent"

    @property
    def label(self) -> str:
        return f"port_{self.state}"

    def text(self) -> str:
        return f"RDMA port {self.state.replace('_', ' ')}"

    def taint(self, driver: str) -> Taint:
        return Taint(f"{driver}/link-down")


@dataclass(frozen=True)
class Signal(Cause):
    """A measured signal out of its limits: `pcie-width` at 8 of 16 lanes. Degraded unless
    said otherwise; tainted `node-agents.io/degraded=<signal>` whatever the driver."""

    name: str  # the signal: "pcie-width", "link-speed"
    message: str  # "PCIe link x8 of x16"
    measured: tuple[tuple[str, Figure], ...] = ()  # ("current", 8), ("max", 16)
    level: Grade = Grade.DEGRADED

    @property
    def grade(self) -> Grade:
        return self.level

    @property
    def label(self) -> str:
        return self.name

    def text(self) -> str:
        return self.message

    def figures(self) -> Mapping[str, Figure]:
        return dict(self.measured)

    def taint(self, driver: str) -> Taint:
        if self.level is Grade.UNHEALTHY:  # row-remap-failed, a recovery action: a fault
            return _unhealthy(driver, self.name)
        return Taint(DEGRADED_TAINT, self.name)


@dataclass(frozen=True)
class Signals(Cause):
    """Several signals out of limits at once. The device takes the worst grade; the taint
    names the first signal of that grade (a device carries one taint of ours)."""

    signals: tuple[Signal, ...]  # at least two, in the evaluator's order

    @property
    def grade(self) -> Grade:
        return Grade.UNHEALTHY if self._worst()[0].level is Grade.UNHEALTHY else Grade.DEGRADED

    @property
    def label(self) -> str:
        return ",".join(s.name for s in self.signals)

    def text(self) -> str:
        return "; ".join(s.message for s in self._worst())

    def figures(self) -> Mapping[str, Figure]:
        return {f"{s.name}.{k}": v for s in self.signals for k, v in s.measured}

    def taint(self, driver: str) -> Taint:
        return self._worst()[0].taint(driver)

    def _worst(self) -> list[Signal]:
        """The signals of the device's grade, Unhealthy ones before any Degraded one."""
        bad = [s for s in self.signals if s.level is Grade.UNHEALTHY]
        return bad or list(self.signals)


def signals_of(cause: Cause | None) -> tuple[Signal, ...]:
    """The measured signals behind a cause: none for a fault that is no signal."""
    if isinstance(cause, Signal):
        return (cause,)
    if isinstance(cause, Signals):
        return cause.signals
    return ()


def signal_cause(verdicts: Iterable[SignalVerdict]) -> Signal | Signals | None:
    """The cause for the signals an evaluator found out of limits (a DeviceVerdict's
    signals): None for none, a Signal for one, Signals for several."""
    signals = tuple(
        Signal(
            v.signal,
            v.message,
            tuple(v.figures),
            Grade.UNHEALTHY if v.level == "unhealthy" else Grade.DEGRADED,
        )
        for v in verdicts
    )
    if not signals:
        return None
    return signals[0] if len(signals) == 1 else Signals(signals)


@dataclass(frozen=True)
class DeviceHealth:
    """One advertised device's health, as every consumer is told of it."""

    resource: str  # nvidia.com/gpu
    device_id: str  # the kubelet's device ID (a replica's GPU: the GPU's UUID)
    where: str  # "GPU 3", "MIG 0:1", "interface ens1np0"
    cause: Cause | None = None  # None: Healthy

    @property
    def grade(self) -> Grade:
        return Grade.HEALTHY if self.cause is None else self.cause.grade
