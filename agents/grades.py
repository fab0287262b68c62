"""Each device's grade from one reading of its signals, for `node-agent topo`: what a
single probe can tell. Signals that need a rate or a run of probes (PCIe replays,
hardware slowdown, RDMA errors, link flaps) and XIDs are the running agent's to judge."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from agents.core.degraded import Limits, SignalVerdict
from agents.core.gpu_signals import GpuReading, GpuSignals
from agents.core.nic_signals import NicReading, NicSignals, expected_speeds
from agents.errors import BackendError
from agents.gpu.discovery import Gpu
from agents.hw.nvml import Nvml
from agents.hw.sysfs import Sysfs
from agents.roce.discovery import Nic

Probe = Callable[[str], GpuReading]


@dataclass(frozen=True)
class Graded:
    """A device's grade (`Healthy`, `Degraded`, `Unhealthy`) and why."""

    grade: str
    why: tuple[str, ...] = ()  # the messages of the signals out of limits, or the fault


def gpu_grades(nvml: Nvml, gpus: list[Gpu], limits: Limits) -> dict[str, Graded]:
    """Blocking, with NVML initialised: each GPU's grade by UUID. A GPU NVML cannot
    answer for is Unhealthy; an NVLink counts as down when the GPU has fewer active
    links than another GPU of its model on the node (one reading cannot tell a link
    that went down from one the board never had)."""
    probe: Probe | None = getattr(nvml, "probe", None)
    readings: dict[str, GpuReading] = {}
    graded: dict[str, Graded] = {}
    for gpu in gpus:
        try:
            status = nvml.status(gpu.uuid)
            if status.lost or status.error:
                fault = "NVML: GPU is lost" if status.lost else f"NVML: {status.error}"
                graded[gpu.uuid] = Graded("Unhealthy", (fault,))
            elif probe is not None:
                readings[gpu.uuid] = probe(gpu.uuid)
        except BackendError as exc:
            graded[gpu.uuid] = Graded("Unhealthy", (str(exc),))
    most: dict[str, int] = {}
    for gpu in gpus:
        links = readings.get(gpu.uuid, GpuReading()).nvlinks
        if links is not None:
            most[gpu.model] = max(most.get(gpu.model, 0), sum(links))
    for gpu in gpus:
        if gpu.uuid in readings:
            reading = readings[gpu.uuid]
            # NVLinks are judged against the node's other GPUs below, not by the evaluator.
            verdict = GpuSignals(limits, _still).observe(replace(reading, nvlinks=None))
            down = _links_down(reading, most.get(gpu.model, 0))
            graded[gpu.uuid] = _graded([*verdict.signals, *down])
    return {g.uuid: graded.get(g.uuid, Graded("Healthy")) for g in gpus}


def nic_grades(sysfs: Sysfs, nics: list[Nic], limits: Limits) -> dict[str, Graded]:
    """Blocking: each NIC's grade by PCI address; a link that is down is Unhealthy, a
    slower one than expected Degraded."""
    readings = {n.pci: sysfs.nic_reading(n.netdev, n.rdma, n.port) for n in nics}
    models = {n.pci: (sysfs.pci_model(n.pci), readings[n.pci].speed_mbps) for n in nics}
    expected = expected_speeds(models, limits.nic_speed_mbps)
    graded: dict[str, Graded] = {}
    for nic in nics:
        reading: NicReading = readings[nic.pci]
        if reading.up is False:
            graded[nic.pci] = Graded("Unhealthy", ("link down",))
            continue
        signals = NicSignals(nic.netdev, limits, _still)
        graded[nic.pci] = _graded(list(signals.observe(reading, expected[nic.pci]).signals))
    return graded


def _still() -> float:
    return 0.0  # one reading: no time passes


def _links_down(reading: GpuReading, expected: int) -> list[SignalVerdict]:
    active = sum(reading.nvlinks or ())
    if reading.nvlinks is None or active >= expected:
        return []
    down = expected - active
    message = f"NVLink {down} of {expected} links down"  # as agents/core/gpu_signals.py says
    return [
        SignalVerdict("nvlink-down", "degraded", message, (("down", down), ("links", expected)))
    ]


def _graded(out: list[SignalVerdict]) -> Graded:
    """The worst grade among the verdicts, with their messages."""
    worst = [v for v in out if v.level == "unhealthy"] or out
    if not worst:
        return Graded("Healthy")
    grade = "Unhealthy" if worst[0].level == "unhealthy" else "Degraded"
    return Graded(grade, tuple(v.message for v in worst))
