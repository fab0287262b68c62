"""How the GPU family is made: NVML initialised and asked, off the event loop, for values
only (GPUs, resource plans, MIG capability devices, IMEX channels); then built on the
loop."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path

import structlog

from agents.backends import Backends
from agents.config import Config, Imex, Sharing
from agents.core.ledger import GPU
from agents.errors import BackendError
from agents.family import Context
from agents.gpu.discovery import DriverVersions, Gpu, discover
from agents.gpu.family import GpuFamily
from agents.gpu.found import GpusFound
from agents.gpu.gfd import read_fabrics, vgpus
from agents.gpu.imex import imex_channels
from agents.gpu.mps import MpsDaemons
from agents.gpu.plan import plan_resources
from agents.gpu.shares import share_daemon
from agents.hw.mps_control import MpsControl
from agents.hw.nvidia_caps import mig_cap_devices
from agents.hw.nvml import Nvml
from agents.hw.nvml_calls import waited
from agents.hw.sysfs import Sysfs

log = structlog.get_logger(__name__)

START_WAIT_S = 60.0  # NVML's init and discovery at start: a hang ends in a clear error
SHUTDOWN_WAIT_S = 1.5  # how long giving NVML back waits for it


def discover_gpus(
    nvml: Nvml,
    sysfs: Sysfs,
    config: Config,
    source: str,
    dev_root: Path | None = None,
    *,
    mps_control: MpsControl | None = None,
) -> GpusFound:
    """Blocking. Raises BackendError or ConfigError, holding nothing then."""
    root = "" if dev_root is None else str(dev_root)
    flags = config.flags
    shares = config.sharing.shares
    if shares is not None and not shares.by_claims:
        log.warning("device_plugin_ignores_key", key="sharing.shares", reason="DRA only")
    channels = imex_channels(config.imex, flags.container_driver_root, root, source)
    try:
        waited(nvml.init, START_WAIT_S, "init")
    except BackendError as exc:
        if config.flags.fail_on_init_error:
            raise
        log.warning("gpu_family_disabled", reason=str(exc), setting="failOnInitError=false")
        return GpusFound((), (), {}, root, held=False)
    try:
        gpus = waited(lambda: discover(nvml, sysfs), START_WAIT_S, "discovery")
        driver = waited(lambda: _driver(nvml), START_WAIT_S, "driver versions")
        plans = plan_resources(gpus, config, source)
        caps = _mig_caps(gpus, root) if flags.mig_strategy != "none" else {}
        fabrics = waited(
            lambda: read_fabrics(nvml, [g.uuid for g in gpus]), START_WAIT_S, "fabric info"
        )
        mps = MpsDaemons(mps_control, root + (flags.mps_root or ""), plans, gpus, nvml)
        mps.ensure()  # before any of its resources is served
        shared = share_daemon(config.sharing.served_shares, mps_control, nvml, root, gpus)
    except BaseException:
        give_back(nvml)
        raise
    log.info("gpus_discovered", count=len(gpus), resources=[p.name for p in plans])
    return GpusFound(
        tuple(gpus),
        tuple(plans),
        caps,
        root,
        held=True,
        driver=driver,
        machine=sysfs.machine_type(),
        vgpus=vgpus(sysfs),
        fabrics=fabrics,
        imex_channels=channels,
        mps=mps if mps.daemons else None,
        share_mps=shared,
    )


def _driver(nvml: Nvml) -> DriverVersions:
    """The driver's versions; one NVML will not give is "" (and left out of DRA)."""
    versions = []
    for what, call in (("driver", nvml.driver_version), ("cuda", nvml.cuda_driver_version)):
        try:
            versions.append(call())
        except BackendError as exc:
            log.warning("nvml_version_unreadable", version=what, error=str(exc))
            versions.append("")
    return DriverVersions(*versions)


def give_back(nvml: Nvml) -> None:
    """Blocking: the NVML initialisation a discovery took, given back."""
    try:
        waited(nvml.shutdown, SHUTDOWN_WAIT_S, "shutdown")
    except BackendError as exc:
        log.warning("nvml_shutdown_failed", error=str(exc))


def _mig_caps(gpus: Sequence[Gpu], dev_root: str) -> dict[str, tuple[str, ...]]:
    """The capability devices of each MIG instance (by MIG UUID), its device nodes beside
    its GPU's. An instance whose access files cannot be read gets none, and says so."""
    caps: dict[str, tuple[str, ...]] = {}
    for gpu in gpus:
        for mig in gpu.mig:
            try:
                caps[mig.uuid] = mig_cap_devices(dev_root, gpu.minor, mig)
            except BackendError as exc:
                log.warning(
                    "mig_capabilities_unreadable",
                    gpu=gpu.uuid,
                    mig=mig.uuid,
                    error=str(exc),
                    effect="its containers get no /dev/nvidia-caps device nodes",
                )
    return caps


class GpuKind:
    name = "gpu"
    sections: tuple[str, ...] = ("flags", "sharing", "health", "pairing", "imex")
    pairs_as: str | None = GPU

    def discover(self, config: Config, backends: Backends, source: str) -> GpusFound:
        return discover_gpus(
            backends.nvml,
            backends.sysfs,
            config,
            source,
            backends.dev_root,
            mps_control=backends.mps,
        )

    def named_devices(self, config: Config) -> Config:
        """Under DRA a MIG-enabled GPU offers its instances and any other GPU itself, each
        named by UUID; claims share GPUs, so time-slicing and the keys that choose
        otherwise are set back, and the device-plugin API's own keys, which nothing reads
        here, are ignored: one warning each. `sharing.shares` is read here only."""
        flags, default = config.flags, Config.default()
        ignored = [
            key
            for key, set_ in (
                (
                    "sharing.timeSlicing",
                    config.sharing.time_slicing != default.sharing.time_slicing,
                ),
                ("sharing.mps", config.sharing.mps is not None),
                ("migStrategy", flags.mig_strategy != default.flags.mig_strategy),
                (
                    "deviceListStrategy",
                    flags.device_list_strategy != default.flags.device_list_strategy,
                ),
                ("deviceIDStrategy", flags.device_id_strategy != default.flags.device_id_strategy),
                ("passDeviceSpecs", flags.pass_device_specs != default.flags.pass_device_specs),
                ("imex", config.imex != default.imex),
            )
            if set_
        ]
        for key in ignored:
            log.warning("dra_ignores_key", key=key, family=self.name)
        named = dataclasses.replace(
            flags, mig_strategy="mixed", device_id_strategy="uuid", mps_root=None
        )
        shares = config.sharing.shares
        if shares is not None:
            shares = dataclasses.replace(shares, by_claims=True)
        sharing = Sharing(shares=shares)
        return dataclasses.replace(config, flags=named, sharing=sharing, imex=Imex())

    def build(self, found: GpusFound, config: Config, context: Context) -> GpuFamily:
        return GpuFamily(
            context.backends.nvml,
            found,
            config,
            health=context.health,
            pairing=context.pairing,
            timing=context.timing,
        )
