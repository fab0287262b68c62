"""The `nvidia.com/` node labels as NVIDIA's GPU Feature Discovery v0.20 writes them
(with --no-timestamp), computed from plain facts of the node's GPUs (docs/labels.md)."""

from __future__ import annotations

from dataclasses import dataclass

from agents.core.gfd_facts import GpuFacts, NodeFacts, VgpuHost
from agents.core.gfd_mig import mig_strategy_labels, resource_labels, sanitise

P = "nvidia.com/"
FULL_GPU = "nvidia.com/gpu"
# go-nvlib's nvpci classes: what gpu.mode names.
PCI_VGA_CLASS = 0x030000
PCI_3D_CLASS = 0x030200


@dataclass(frozen=True)
class Clique:
    """The node's NVLink clique: `value` for the label, or why there is none."""

    value: str | None
    disagreement: str | None = None  # set when attached GPUs disagree


def gfd_labels(node: NodeFacts) -> dict[str, str]:
    """Every label GFD v0.20 writes for this node, sorted by key."""
    labels = vgpu_labels(node.vgpus)
    if not node.gpus:
        return labels  # GFD's device labelers are empty without devices
    labels[P + "gpu.machine"] = sanitise(node.machine) if node.machine is not None else "unknown"
    labels |= version_labels(node.driver_version, node.cuda_driver_version)
    labels[P + "mig.capable"] = _bool(any(g.mig_capable for g in node.gpus))
    mps = node.sharing.strategy == "mps"
    labels[P + "mps.capable"] = _bool(mps and not any(g.mig_enabled for g in node.gpus))
    labels |= gpu_labels(node)
    if node.mig_strategy != "none":
        labels |= mig_strategy_labels(node.gpus, node.mig_strategy, node.sharing)
    labels[P + "gpu.mode"] = gpu_mode([g.pci_class for g in node.gpus])
    clique = fabric_clique(node.gpus)
    if clique.value is not None:
        labels[P + "gpu.clique"] = clique.value
    return dict(sorted(labels.items()))


def gpu_labels(node: NodeFacts) -> dict[str, str]:
    """The whole-GPU labels per product name: MIG-enabled GPUs without sharing, the
    others with it; a name on both kinds counts all, and its whole GPUs win."""
    counts: dict[str, int] = {}
    for gpu in node.gpus:
        counts[gpu.name] = counts.get(gpu.name, 0) + 1
    labels: dict[str, str] = {}
    for enabled in (True, False):
        last = {g.name: g for g in node.gpus if g.mig_enabled == enabled}
        for name in sorted(last):
            gpu, sharing = last[name], None if enabled else node.sharing
            labels |= resource_labels(FULL_GPU, sharing, counts[name], gpu.name)
            if gpu.memory_mib:
                labels[FULL_GPU + ".memory"] = str(gpu.memory_mib)
            labels |= architecture_labels(gpu.compute_capability)
    return labels


def architecture_labels(capability: str) -> dict[str, str]:
    major, _, minor = capability.partition(".")
    if not (major.isdigit() and minor.isdigit()) or int(major) == 0:
        return {}
    return {
        FULL_GPU + ".family": arch_family(int(major), int(minor)),
        FULL_GPU + ".compute.major": str(int(major)),
        FULL_GPU + ".compute.minor": str(int(minor)),
    }


def arch_family(major: int, minor: int) -> str:
    """GFD's name for a CUDA compute capability's architecture."""
    if major == 7:
        return "volta" if minor < 5 else "turing"
    if major == 8:
        return "ampere" if minor < 9 else "ada-lovelace"
    names = {1: "tesla", 2: "fermi", 3: "kepler", 5: "maxwell", 6: "pascal", 9: "hopper"}
    names |= {10: "blackwell", 12: "blackwell", 13: "rubin"}
    return names.get(major, "undefined")


def version_labels(driver: str, cuda: str) -> dict[str, str]:
    """The driver's and CUDA's versions; GFD stops on a driver version not X.Y[.Z], this
    agent leaves these labels out then (and where NVML gave no version)."""
    parts = driver.split(".")
    cuda_major, _, cuda_minor = cuda.partition(".")
    if not 2 <= len(parts) <= 3 or not (cuda_major.isdigit() and cuda_minor.isdigit()):
        return {}
    major, minor, rev = parts[0], parts[1], parts[2] if len(parts) > 2 else ""
    cmaj, cmin = str(int(cuda_major)), str(int(cuda_minor))
    return {
        P + "cuda.driver.major": major,
        P + "cuda.driver.minor": minor,
        P + "cuda.driver.rev": rev,
        P + "cuda.runtime.major": cmaj,
        P + "cuda.runtime.minor": cmin,
        P + "cuda.driver-version.major": major,
        P + "cuda.driver-version.minor": minor,
        P + "cuda.driver-version.revision": rev,
        P + "cuda.driver-version.full": driver,
        P + "cuda.runtime-version.major": cmaj,
        P + "cuda.runtime-version.minor": cmin,
        P + "cuda.runtime-version.full": f"{cmaj}.{cmin}",
    }


def gpu_mode(classes: list[int | None]) -> str:
    """graphics (VGA class) or compute (3D class) when every GPU has that class."""
    if not classes or any(c is None for c in classes) or len(set(classes)) > 1:
        return "unknown"
    return {PCI_VGA_CLASS: "graphics", PCI_3D_CLASS: "compute"}.get(classes[0] or 0, "unknown")


def fabric_clique(gpus: tuple[GpuFacts, ...]) -> Clique:
    """`<clusterUUID>.<cliqueID>` of the attached GPUs, when they all agree."""
    attached = [(i, g.fabric) for i, g in enumerate(gpus) if g.fabric and g.fabric.attached]
    clusters = {f.cluster_uuid for _, f in attached}
    cliques = {f.clique_id for _, f in attached}
    if len(clusters) > 1 or len(cliques) > 1:
        seen = ", ".join(f"GPU {i}: {f.cluster_uuid}.{f.clique_id}" for i, f in attached)
        what = "cluster UUIDs" if len(clusters) > 1 else "clique IDs"
        return Clique(None, f"attached GPUs differ in {what} ({seen})")
    if not attached:
        return Clique(None)
    return Clique(f"{clusters.pop()}.{cliques.pop()}")


def vgpu_labels(vgpus: tuple[VgpuHost, ...] | None) -> dict[str, str]:
    if vgpus is None:
        return {}  # GFD writes no vGPU label when it cannot read the config space
    labels = {P + "vgpu.present": _bool(bool(vgpus))}
    for host in vgpus:
        labels[P + "vgpu.host-driver-version"] = host.version
        labels[P + "vgpu.host-driver-branch"] = host.branch
    return labels


def _bool(value: bool) -> str:
    return "true" if value else "false"
