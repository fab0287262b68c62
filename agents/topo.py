"""`node-agent topo`: the node's GPUs and NICs with their grades, their distance matrix
and GPU<->NIC pairs."""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, TextIO

from agents.backends import simulated_backends
from agents.command_line import DEFAULT_LLDP_WAIT_S
from agents.config import Config, load_config
from agents.core.degraded import Limits
from agents.core.topology import Topology
from agents.dra.api import DEFAULT_KUBELET_PLUGINS_DIR
from agents.gpu.discovery import Gpu, discover, gpu_distance, nvlink_counts
from agents.grades import Graded, gpu_grades, nic_grades
from agents.hw.lldp import Neighbour, NeighbourSource
from agents.hw.mps_control import MpsControl, MpsControlBinary
from agents.hw.nvml import Nvml
from agents.hw.sysfs import Sysfs
from agents.roce.discovery import Nic
from agents.roce.discovery import discover as discover_nics
from agents.tasks import off_loop
from agents.topo_leaves import hear_leaves, on_host, refusal
from agents.topo_shares import render_shares, shares_report

LEGEND = (
    "PIX = at most one PCIe switch between them; PXB = several switches, no host bridge;\n"
    "PHB = through a PCIe host bridge; NODE = between host bridges of one NUMA node;\n"
    "SYS = across NUMA nodes. NV# = # NVLinks (through NVSwitches on HGX/NVL systems).\n"
    "A GPU's pairs are the NICs at its smallest distance.\n"
    "Grade: from one reading of each device's signals (docs/degraded.md); PCIe replays,\n"
    "hardware slowdown, RDMA errors, link flaps and XIDs need the running agent."
)


async def show_topology(
    simulate: Path | None,
    config_file: Path | None,
    *,
    as_json: bool,
    lldp_wait_s: float = DEFAULT_LLDP_WAIT_S,
    err: TextIO | None = None,
    plugins_dir: Path = Path(DEFAULT_KUBELET_PLUGINS_DIR),
) -> int:
    """Print the report; listens up to lldp_wait_s for the NICs' LLDP neighbours, with its
    progress on `err` (stderr), so that --json's stdout holds the JSON alone. The GPU DRA
    driver's prepared claims are read from its checkpoint under `plugins_dir`."""
    config = load_config(config_file) if config_file else Config.default()
    limits = config.health.degraded.limits
    why_not = refusal(lldp_wait_s)
    async with _node(simulate, listen=why_not is None) as (nvml, sysfs, lldp, mps):
        nics = discover_nics(sysfs, config.roce.selectors)
        # Listening starts before the GPUs are read: their frames are heard meanwhile.
        wired = [n.netdev for n in nics if on_host(n.netdev)]
        if lldp is not None:
            lldp.watch(n.netdev for n in nics)
        gpus, graded = _gpus(nvml, sysfs, limits)
        graded |= nic_grades(sysfs, nics, limits)
        leaves = await hear_leaves(
            lldp,
            nics,
            wired,
            wait_s=lldp_wait_s,
            why_not=why_not,
            err=err or sys.stderr,
            simulated=simulate is not None,
        )
    report = build_report(gpus, nics, leaves.neighbours, graded, leaves.source)
    shares = config.sharing.shares

    def read_shares() -> dict[str, Any] | None:
        found = mps is not None or (shares is not None and _mps_found(simulate))
        return shares_report(shares, found, gpus, plugins_dir)

    report["shares"] = await off_loop(read_shares, "topo-shares")
    sys.stdout.write(json.dumps(report, indent=2) + "\n" if as_json else render(report))
    return 0


def _mps_found(simulate: Path | None) -> bool:
    """Blocking. Whether the driver's MPS control program is on this (real) node."""
    return simulate is None and MpsControlBinary.find() is not None


@contextlib.asynccontextmanager
async def _node(
    simulate: Path | None, *, listen: bool
) -> AsyncIterator[tuple[Nvml, Sysfs, NeighbourSource | None, MpsControl | None]]:
    """The node's NVML, sysfs, LLDP neighbours (simulated: the node file's, and frames
    on its netdevs that exist here; real: an LLDP listener where `listen`) and, simulated,
    its MPS control program; all closed as the context ends, error or not. No link states
    are read here."""
    if simulate is not None:
        async with simulated_backends(simulate) as backends:
            try:
                yield backends.nvml, backends.sysfs, backends.lldp, backends.mps
            finally:
                if backends.lldp is not None:
                    backends.lldp.close()
        return
    from agents.hw.lldp_listener import LldpListener
    from agents.hw.nvml_backend import NvmlBackend  # pynvml: only on a real node

    lldp = LldpListener() if listen else None
    try:
        yield NvmlBackend(), Sysfs(), lldp, None
    finally:
        if lldp is not None:
            lldp.close()


def _gpus(nvml: Nvml, sysfs: Sysfs, limits: Limits) -> tuple[list[Gpu], dict[str, Graded]]:
    nvml.init()
    try:
        gpus = discover(nvml, sysfs)
        return gpus, gpu_grades(nvml, gpus, limits)
    finally:
        nvml.shutdown()


def _names(gpus: list[Gpu], nics: list[Nic]) -> tuple[dict[str, str], dict[str, str]]:
    return {g.uuid: f"GPU{g.index}" for g in gpus}, {n.pci: n.rdma for n in nics}


def build_report(
    gpus: list[Gpu],
    nics: list[Nic],
    neighbours: dict[str, Neighbour] | None = None,
    graded: dict[str, Graded] | None = None,
    leaf_source: str | None = None,
) -> dict[str, Any]:
    """The report `--json` prints; `graded`: each device's grade by UUID or PCI address
    (left out: Healthy); `leaf_source`: where the NICs' leaf switches came from."""
    grades = graded or {}
    gpu_names, nic_names = _names(gpus, nics)
    topology = Topology(
        {g.uuid: g.location for g in gpus if g.location is not None},
        {n.pci: n.location for n in nics if n.location is not None},
    )
    matrix = _matrix(gpus, topology)
    # Every GPU (by NVLink or NUMA node where its PCIe place is unknown); NICs with a
    # place in the PCIe tree.
    ids = [g.uuid for g in gpus] + [n.pci for n in nics if n.pci in topology.nics]
    names = gpu_names | nic_names
    return {
        "gpus": [
            {
                "name": gpu_names[g.uuid],
                "uuid": g.uuid,
                "pci": g.pci,
                "numa": g.numa,
                "model": g.model,
                "memoryMiB": g.memory_mib,
                **_grade(grades.get(g.uuid)),
            }
            for g in gpus
        ],
        "nics": [
            _nic(n, (neighbours or {}).get(n.netdev)) | _grade(grades.get(n.pci)) for n in nics
        ],
        "leafSource": leaf_source,
        "matrix": {
            names[a]: {names[b]: "X" if a == b else matrix.get((a, b), "-") for b in ids}
            for a in ids
        },
        "pairs": {
            gpu_names[g.uuid]: _pair(topology, g.uuid, nic_names)
            for g in gpus
            if g.uuid in topology.gpus
        },
    }


def _nic(nic: Nic, neighbour: Neighbour | None) -> dict[str, Any]:
    """A NIC, with the leaf switch and port it is cabled to (null while unknown)."""
    return {
        "name": nic.rdma,
        "pci": nic.pci,
        "netdev": nic.netdev,
        "numa": nic.numa,
        "uverbs": nic.uverbs,
        "leafSwitch": neighbour.leaf if neighbour else None,
        "leafPort": neighbour.port_id if neighbour else None,
    }


def _grade(graded: Graded | None) -> dict[str, Any]:
    """`grade` and `signals`: what is out of limits (or the fault), empty when Healthy."""
    g = graded or Graded("Healthy")
    return {"grade": g.grade, "signals": list(g.why)}


def _matrix(gpus: list[Gpu], topology: Topology) -> dict[tuple[str, str], str]:
    """Each pair's entry as `nvidia-smi topo -m` writes it: NV# for GPUs joined by
    NVLinks, else the PCIe distance."""
    out = {pair: str(d) for pair, d in topology.matrix().items()}
    links = nvlink_counts(gpus)
    for a in gpus:
        for b in gpus:
            if a.uuid != b.uuid:
                n = links.get(frozenset((a.uuid, b.uuid)), 0)
                out[(a.uuid, b.uuid)] = f"NV{n}" if n else str(gpu_distance(a, b))
    return out


def _pair(topology: Topology, gpu: str, nic_names: dict[str, str]) -> dict[str, Any]:
    near = sorted(topology.nearest_nics(gpu))
    return {
        "nics": sorted(nic_names[n] for n in near),
        "distance": str(topology.pair_distance(gpu, near[0])) if near else None,
    }


def render(report: dict[str, Any]) -> str:
    lines = ["Devices"]
    for g in report["gpus"]:
        lines.append(
            f"  {g['name']:<8} {g['grade']:<9} {g['uuid']}  pci {g['pci']}  NUMA {g['numa']}"
            f"  {g['model']}{_signals(g)}"
        )
    for n in report["nics"]:
        leaf = f"{n['leafSwitch']} {n['leafPort']}" if n["leafSwitch"] else "-"
        lines.append(
            f"  {n['name']:<8} {n['grade']:<9} pci {n['pci']}  {n['netdev']}  NUMA {n['numa']}"
            f"  {n['uverbs']}  leaf {leaf}{_signals(n)}"
        )
    if report.get("leafSource"):
        lines.append(f"  leaf from {report['leafSource']}")
    names = list(report["matrix"])
    width = max([len(n) for n in names] + [4]) + 1
    lines += ["", "Distance matrix", " " * width + "".join(f"{n:>{width}}" for n in names)]
    for a in names:
        row = report["matrix"][a]
        lines.append(f"{a:<{width}}" + "".join(f"{row[b]:>{width}}" for b in names))
    lines += ["", "GPU <-> NIC pairs"]
    for gpu, pair in report["pairs"].items():
        nics = ", ".join(pair["nics"]) or "none"
        lines.append(f"  {gpu:<8} -> {nics} ({pair['distance'] or '-'})")
    if report.get("shares"):
        memory = {g["name"]: g["memoryMiB"] for g in report["gpus"]}
        lines += render_shares(report["shares"], memory)
    lines += ["", LEGEND]
    return "\n".join(lines) + "\n"


def _signals(device: dict[str, Any]) -> str:
    return f"  ({'; '.join(device['signals'])})" if device["signals"] else ""
