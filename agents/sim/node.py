"""The simulated node file (docs/configuration.md): its strict parser, into the values of
agents/sim/specs.py.

Every mistake is a ConfigError naming the file, the key path and what was expected.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

from agents.core.pci import is_pci_address
from agents.errors import ConfigError
from agents.hw.lldp import Neighbour
from agents.hw.nvml import MigInstance
from agents.sim import fabric_fields, process_fields, signal_fields
from agents.sim.checks import check_node
from agents.sim.fields import Fields, MappingValue
from agents.sim.specs import DEFAULT_MEMORY_MIB, DEFAULT_MODEL, GpuSpec, NicSpec, NodeSpec

PCI_FORM = 'a quoted PCI address "dddd:bb:dd.f" (lower-case hex)'
# libyaml's safe loader where PyYAML was built with it: a node file of 16 GPUs and
# 16 NICs parses in milliseconds instead of a tenth of a second, on every start.
_SAFE_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def load_node(path: Path) -> NodeSpec:
    """Read and parse a node file."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(str(path), "<file>", f"a readable file ({exc.strerror})") from exc
    return parse_node(text, str(path))


def parse_node(text: str, source: str) -> NodeSpec:
    """Parse the text of a node file; `source` names it in errors."""
    try:
        doc: Any = yaml.load(text, Loader=_SAFE_LOADER)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}" if mark is not None else "<document>"
        raise ConfigError(source, where, f"valid YAML ({getattr(exc, 'problem', exc)})") from exc
    f = Fields(source)
    if doc is None:  # also what a reader sees while a writer has just truncated the file
        f.fail("<document>", "a node: a mapping of numaNodes, gpus, nics (the file is empty)")
    top = f.mapping(doc, "", {"numaNodes", "nvswitch", "machine", "imex", "mps", "gpus", "nics"})
    gpu_docs = f.items(top, "", "gpus")
    nic_docs = f.items(top, "", "nics")
    gpus = tuple(_gpu(f, m, f"gpus[{i}]", i) for i, m in enumerate(gpu_docs))
    nics = tuple(_nic(f, m, f"nics[{i}]") for i, m in enumerate(nic_docs))
    devices: list[GpuSpec | NicSpec] = [*gpus, *nics]
    numas = [d.numa for d in devices if d.numa is not None]
    numa_nodes = f.integer(top, "", "numaNodes", max(numas, default=0) + 1, minimum=0)
    machine = f.optional_string(top, "", "machine", r"[^\x00\n]{1,255}", "a DMI product name")
    nvswitch = f.boolean(top, "", "nvswitch", False)
    mps = f.boolean(
        f.mapping(top.get("mps") or {}, "mps", {"available"}), "mps", "available", False
    )
    node = NodeSpec(numa_nodes, gpus, nics, nvswitch, machine, _imex(f, top), mps)
    check_node(f, node)
    return node


def _imex(f: Fields, top: MappingValue) -> tuple[int, ...]:
    """The IMEX channels whose device nodes the node has (`imex: {channels: [0]}`)."""
    imex = f.mapping(top.get("imex") or {}, "imex", {"channels"})
    return tuple(sorted(set(f.ints(imex, "imex", "channels", 0))))


_GPU_KEYS = {
    *("uuid", "pci", "upstream", "numa", "model", "memoryMiB", "minor"),
    *("nvlinks", "mig", "xids", "lost", "nvml"),
    *("pcie", "utilization", "nvlinksDown", "clockEvents", "remappedRows"),
    *("retiredPagesPending", "computeCapability", "fabric", "processes"),
    *signal_fields.TELEMETRY_KEYS,
}


def _gpu(f: Fields, doc: object, path: str, position: int) -> GpuSpec:
    m = f.mapping(doc, path, _GPU_KEYS)
    uuid = f.string(m, path, "uuid", None, pattern=r"GPU-\S+", expected="a UUID GPU-…")
    mig_enabled, instances = _mig(f, m, path)
    hang_s, error = _nvml_fault(f, m, path)
    remap = signal_fields.remapped_rows(f, m, path)
    return GpuSpec(
        uuid=uuid,
        pci=_pci(f, m, path),
        upstream=_upstream(f, m, path),
        numa=f.optional_int(m, path, "numa", 0),
        model=f.string(m, path, "model", DEFAULT_MODEL),
        memory_mib=f.integer(m, path, "memoryMiB", DEFAULT_MEMORY_MIB, minimum=1),
        minor=f.integer(m, path, "minor", position, minimum=0),
        nvlinks=tuple(f.strings(m, path, "nvlinks")),
        mig_enabled=mig_enabled,
        mig_instances=instances,
        xids=tuple(f.ints(m, path, "xids", minimum=1)),
        lost=f.boolean(m, path, "lost", False),
        nvml_hang_s=hang_s,
        nvml_error=error,
        pcie=signal_fields.pcie(f, m, path),
        utilization=signal_fields.percent(f, m, path, "utilization"),
        nvlinks_down=f.integer(m, path, "nvlinksDown", 0, minimum=0),
        clock_events=signal_fields.clock_events(f, m, path),
        remap_pending=remap[0],
        remap_failed=remap[1],
        retired_pages_pending=f.boolean(m, path, "retiredPagesPending", False),
        compute_capability=f.optional_string(
            m, path, "computeCapability", r"\d+\.\d+", 'a quoted CUDA compute capability, "9.0"'
        ),
        fabric=fabric_fields.fabric(f, m, path),
        telemetry=signal_fields.telemetry(f, m, path),
        processes=process_fields.processes(f, m, path),
    )


def _nvml_fault(f: Fields, m: MappingValue, path: str) -> tuple[float, str | None]:
    """`nvml: {hang: <seconds>, error: <NVML error name>}`: how NVML misbehaves."""
    if m.get("nvml") is None:
        return 0.0, None
    fault_path = f"{path}.nvml"
    fault = f.mapping(m["nvml"], fault_path, {"hang", "error"})
    hang = fault.get("hang", 0)
    if isinstance(hang, bool) or not isinstance(hang, int | float) or hang < 0:
        f.fail(f"{fault_path}.hang", "a number of seconds >= 0")
    error = f.optional_string(
        fault, fault_path, "error", r"[A-Z][A-Za-z]*", "an NVML error name, e.g. Unknown"
    )
    return float(hang), error


def _mig(f: Fields, m: MappingValue, path: str) -> tuple[bool, tuple[MigInstance, ...]]:
    if "mig" not in m:
        return False, ()
    mig_path = f"{path}.mig"
    mig = f.mapping(m["mig"], mig_path, {"enabled", "instances"})
    out: list[MigInstance] = []
    for i, doc in enumerate(f.items(mig, mig_path, "instances")):
        p = f"{mig_path}.instances[{i}]"
        inst = f.mapping(doc, p, {"uuid", "profile"})
        uuid = f.string(inst, p, "uuid", None, pattern=r"MIG-\S+", expected="a UUID MIG-…")
        profile = f.string(
            inst,
            p,
            "profile",
            None,
            pattern=r"\d+g\.\d+gb(\+me)?",
            expected="a MIG profile like 1g.10gb",
        )
        # One compute instance in each GPU instance, numbered in the file's order.
        out.append(MigInstance(uuid, profile, gpu_instance=i, compute_instance=0))
    return f.boolean(mig, mig_path, "enabled", False), tuple(out)


_NIC_KEYS = {
    *("pci", "upstream", "numa", "netdev", "rdma", "vendor", "linkLayer", "link", "uverbs"),
    *("lldp", "speedMbps", "counters", "carrierChanges"),
}
_LLDP_KEYS = {"systemName", "chassisId", "portId", "ttl", "portDescription"}
LLDP_TTL_S = 120  # what switches commonly send: 4 x a 30 s interval


def _nic(f: Fields, doc: object, path: str) -> NicSpec:
    m = f.mapping(doc, path, _NIC_KEYS)
    rdma = f.optional_string(m, path, "rdma", r"[A-Za-z][\w.-]*", "an RDMA device name")
    return NicSpec(
        pci=_pci(f, m, path),
        netdev=f.string(
            m,
            path,
            "netdev",
            None,
            pattern=r"[\w.:-]{1,15}",
            expected="an interface name (at most 15 characters)",
        ),
        upstream=_upstream(f, m, path),
        numa=f.optional_int(m, path, "numa", 0),
        rdma=rdma,
        vendor=f.string(
            m,
            path,
            "vendor",
            "15b3",
            pattern=r"[0-9a-f]{4}",
            expected='a quoted vendor ID of 4 lower-case hex digits, e.g. "15b3"',
        ),
        link_layer=f.choice(m, path, "linkLayer", ("Ethernet", "InfiniBand"), "Ethernet"),
        link=f.choice(m, path, "link", ("up", "down"), "up"),
        uverbs=_uverbs(f, m, path, rdma),
        lldp=_lldp(f, m, path),
        speed_mbps=f.optional_int(m, path, "speedMbps", None),
        counters=signal_fields.counters(f, m, path),
        carrier_changes=f.integer(m, path, "carrierChanges", 0, minimum=0),
    )


def _lldp(f: Fields, m: MappingValue, path: str) -> Neighbour | None:
    """`lldp: {chassisId, portId, systemName, portDescription, ttl}`: what the NIC hears."""
    if m.get("lldp") is None:
        return None
    p = f"{path}.lldp"
    doc = f.mapping(m["lldp"], p, _LLDP_KEYS)
    any_text, expected = r"[^\x00]{1,255}", "a string of 1 to 255 characters"
    return Neighbour(
        chassis_id=f.string(doc, p, "chassisId", None, pattern=any_text, expected=expected),
        port_id=f.string(doc, p, "portId", None, pattern=any_text, expected=expected),
        ttl_s=f.integer(doc, p, "ttl", LLDP_TTL_S, minimum=0),
        system_name=f.optional_string(doc, p, "systemName", any_text, expected) or "",
        port_description=f.optional_string(doc, p, "portDescription", any_text, expected) or "",
    )


def _uverbs(f: Fields, m: MappingValue, path: str, rdma: str | None) -> int | None:
    explicit = f.optional_int(m, path, "uverbs", None)
    if explicit is not None or rdma is None:
        return explicit
    digits = re.search(r"(\d+)$", rdma)
    if digits is None:
        raise ConfigError(f.source, f"{path}.uverbs", "a number (rdma has no trailing index)")
    return int(digits.group(1))


def _pci(f: Fields, m: MappingValue, path: str) -> str:
    return f.string(m, path, "pci", None, pattern=None, expected=PCI_FORM, check=is_pci_address)


def _upstream(f: Fields, m: MappingValue, path: str) -> tuple[str, ...]:
    out = f.strings(m, path, "upstream")
    for i, addr in enumerate(out):
        if not is_pci_address(addr):
            raise ConfigError(f.source, f"{path}.upstream[{i}]", PCI_FORM)
    return tuple(out)
