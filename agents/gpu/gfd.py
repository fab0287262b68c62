"""The GPU family's `nvidia.com/` labels as GFD v0.20 writes them: the facts read at
discovery (DMI, PCI classes, vGPU config space, the fabric, which each signal round reads
again) and the config's sharing, handed to agents/core/gfd_labels.py."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace

import structlog

from agents.config import Config
from agents.core.gfd_facts import Fabric, GpuFacts, MigLabels, NodeFacts, Sharing, VgpuHost
from agents.core.gfd_labels import Clique, fabric_clique, gfd_labels
from agents.core.gfd_mig import gfd_profile
from agents.core.vgpu import vendor_capability, vgpu_host
from agents.errors import BackendError
from agents.gpu.discovery import DriverVersions, Gpu
from agents.hw.nvml import GpuFabrics, Nvml
from agents.hw.sysfs import Sysfs

log = structlog.get_logger(__name__)

Fabrics = Mapping[str, Fabric | None]  # GPU UUID -> its fabric; None: none (NotSupported)


def vgpus(sysfs: Sysfs) -> tuple[VgpuHost, ...] | None:
    """Blocking. The vGPUs among the node's NVIDIA PCI functions; None where a config
    space cannot be read in full (GFD then writes no vGPU label)."""
    configs = sysfs.nvidia_configs()
    if configs is None:
        return None
    hosts: list[VgpuHost] = []
    try:
        for config in configs:
            capability = vendor_capability(config)
            host = vgpu_host(capability) if capability is not None else None
            if host is not None:
                hosts.append(host)
    except ValueError as exc:
        log.info("vgpu_unknown", reason=str(exc), effect="no nvidia.com/vgpu.present label")
        return None
    return tuple(hosts)


def read_fabrics(nvml: Nvml, uuids: Iterable[str]) -> dict[str, Fabric | None]:
    """Blocking: each GPU's fabric at discovery (the signal rounds read it again); a GPU
    whose answer fails has none for now. Its health is left out: that is the probe's
    signal (nvlink-fabric), and changes no label."""
    if not isinstance(nvml, GpuFabrics):
        return {}
    out: dict[str, Fabric | None] = {}
    for uuid in uuids:
        try:
            fabric = nvml.fabric(uuid)
            out[uuid] = None if fabric is None else replace(fabric, health_mask=0)
        except BackendError as exc:
            log.debug("gpu_fabric_unreadable", gpu=uuid, error=str(exc))
            out[uuid] = None
    return out


def sharing(config: Config) -> Sharing:
    """The config's sharing as GFD reads it: renames are ignored, renameByDefault kept."""
    slicing = config.sharing.replicated
    replicas = {r.name: r.replicas for r in slicing.resources}
    strategy = "time-slicing" if any(n > 1 for n in replicas.values()) else "none"
    strategy = "mps" if config.sharing.mps_active else strategy
    return Sharing(strategy, replicas, slicing.rename_by_default)


def gpu_facts(gpu: Gpu, fabric: Fabric | None) -> GpuFacts:
    migs = tuple(
        MigLabels(
            profile=gfd_profile(m.profile),
            memory_mib=m.engines.memory_mib,
            multiprocessors=m.engines.multiprocessors,
            gi_slices=m.engines.gi_slices,
            ci_slices=m.engines.ci_slices,
            copy_engines=m.engines.copy_engines,
            decoders=m.engines.decoders,
            encoders=m.engines.encoders,
            jpeg_engines=m.engines.jpeg_engines,
            ofa_engines=m.engines.ofa_engines,
        )
        for m in gpu.mig
    )
    return GpuFacts(
        name=gpu.model,
        memory_mib=gpu.memory_mib,
        compute_capability=gpu.compute_capability,
        mig_capable=gpu.mig_capable,
        mig_enabled=gpu.mig_enabled,
        migs=migs,
        pci_class=gpu.pci_class,
        fabric=fabric,
    )


class GfdLabels:
    """The labels of the GPUs present now; logs once per change why there is no clique
    where the attached GPUs disagree."""

    def __init__(
        self,
        config: Config,
        driver: DriverVersions,
        machine: str | None,
        vgpu_hosts: tuple[VgpuHost, ...] | None,
    ) -> None:
        self._config, self._driver = config, driver
        self._machine, self._vgpus = machine, vgpu_hosts
        self._said: Clique | None = None

    def labels(self, gpus: Sequence[Gpu], fabrics: Fabrics) -> dict[str, str]:
        facts = tuple(gpu_facts(g, fabrics.get(g.uuid)) for g in gpus)
        node = NodeFacts(
            gpus=facts,
            driver_version=self._driver.version,
            cuda_driver_version=self._driver.cuda_version,
            machine=self._machine,
            vgpus=self._vgpus,
            mig_strategy=self._config.flags.mig_strategy,
            sharing=sharing(self._config),
        )
        self._say(fabric_clique(facts))
        return gfd_labels(node)

    def _say(self, clique: Clique) -> None:
        if clique == self._said:
            return
        self._said = clique
        if clique.disagreement is not None:
            log.warning(
                "gpu_clique_unlabelled",
                reason=clique.disagreement,
                effect="no nvidia.com/gpu.clique",
            )
