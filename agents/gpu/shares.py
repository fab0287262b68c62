"""Shares of whole GPUs under DRA (`sharing.shares`): what a container gets for the shares
its claim consumed (the GPUs in PCI bus order, and MPS's limits where MPS enforces them),
and whether it does."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping, Sequence
from fractions import Fraction

import structlog

from agents.config_shares import Shares
from agents.core.quantity import quantity
from agents.gpu import mps_paths
from agents.gpu.discovery import Gpu
from agents.gpu.dra import COMPUTE, DRIVER, MEMORY
from agents.gpu.share_mps import ShareDaemon
from agents.hw.mps_control import MpsControl
from agents.hw.nvml import Nvml
from agents.kernel.edits import Consumed, ContainerEdits, DeviceKey

log = structlog.get_logger(__name__)

DEVICE_ORDER = "CUDA_DEVICE_ORDER"
MEMORY_LIMIT = "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"
THREAD_PERCENTAGE = "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"
MPS_PIPES = DRIVER  # one pipe directory under the MPS root for every shared GPU
VOLTA = (7, 0)  # MPS limits a client's memory and SMs from this compute capability on


def unlimited(gpus: Sequence[Gpu]) -> frozenset[str]:
    """The UUIDs of GPUs older than Volta: MPS holds their clients to no limit."""
    return frozenset(g.uuid for g in gpus if (c := g.capability()) is not None and c < VOLTA)


def share_daemon(
    shares: Shares | None,
    control: MpsControl | None,
    nvml: Nvml,
    root: str = "",
    gpus: Sequence[Gpu] = (),
) -> ShareDaemon | None:
    """Blocking (makes the directories containers mount, adopts or starts the daemon).
    The MPS control daemon that enforces shares' limits, its containers told them; None
    where none does, said once (and once for GPUs older than Volta, never limited)."""
    if shares is None:
        return None
    host = root + shares.mps_root
    pipe = mps_paths.pipe_dir(host, MPS_PIPES)
    why = "enforce: none" if shares.enforce == "none" else "no nvidia-cuda-mps-control found"
    old = unlimited(gpus)
    if shares.enforce == "mps" and old:
        log.warning(
            "gpu_shares_unenforced",
            reason="compute capability below 7.0 (older than Volta): MPS has no client limits",
            gpus=sorted(g.index for g in gpus if g.uuid in old),
            effect="shares of these GPUs get no MPS limits",
        )
    if shares.enforce == "mps" and gpus and len(old) == len(gpus):
        why = "every GPU is older than Volta (compute capability below 7.0)"
    elif shares.enforce == "mps" and control is not None:
        try:
            for directory in (pipe, mps_paths.shm_dir(host)):
                os.makedirs(directory, exist_ok=True)
        except OSError as exc:
            why = f"{pipe} cannot be made: {exc}"
        else:
            why = ""
    if why:
        log.warning("gpu_shares_unenforced", reason=why, effect="shares get no MPS limits")
        return None
    assert control is not None
    log_dir = mps_paths.log_dir(host, MPS_PIPES)
    daemon = ShareDaemon(control, pipe, log_dir, mps_paths.shm_dir(host), nvml)
    failed = daemon.ensure()  # before the first share is served
    if failed is not None:
        log.warning(
            "gpu_shares_unenforced",
            reason=f"the MPS control daemon does not start at {pipe}: {failed}",
            effect="no share is prepared until it starts (tried again)",
        )
    return daemon


def share_edits(
    base: ContainerEdits,
    ordered: Sequence[DeviceKey],
    consumed: Consumed,
    mps: tuple[Shares, str] | None,
) -> ContainerEdits:
    """`base` (the edits of `ordered`, GPUs in PCI bus order) for a container of shares:
    CUDA counts GPUs in that order too, and with `mps` (the shares' config and the host
    root it is under) each GPU's consumed memory and the smallest compute asked for are
    MPS's limits, with the daemon's pipes and shared memory."""
    env = {**base.env, DEVICE_ORDER: "PCI_BUS_ID"}
    if mps is None:
        return dataclasses.replace(base, env=env)
    shares, host_root = mps
    env |= mps_paths.client_env(MPS_PIPES)
    limits = memory_limits(ordered, consumed)
    if limits:
        env[MEMORY_LIMIT] = limits
    computes = [c for key in ordered if (c := _amount(consumed.get(key, {}), COMPUTE)) > 0]
    if computes:
        env[THREAD_PERCENTAGE] = str(int(min(computes)))
    mounts = (*base.mounts, *mps_paths.client_mounts(host_root + shares.mps_root, MPS_PIPES))
    return dataclasses.replace(base, env=env, mounts=tuple(dict.fromkeys(mounts)))


def memory_limits(ordered: Sequence[DeviceKey], consumed: Consumed) -> str:
    """`<ordinal>=<MiB>M,...` of each shared GPU by its place in `ordered`."""
    return ",".join(
        f"{ordinal}={int(memory) // 2**20}M"
        for ordinal, key in enumerate(ordered)
        if (memory := _amount(consumed.get(key, {}), MEMORY)) > 0
    )


def _amount(capacities: Mapping[str, str], name: str) -> Fraction:
    value = quantity(capacities.get(name, "0"))
    return value if isinstance(value, Fraction) else Fraction(0)
