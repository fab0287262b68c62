"""The demo's DRA shares: two claims' shares of one GPU prepared side by side on the
simulated node with MPS (the simulator's twin of nvidia-cuda-mps-control), what each
container is told, and the GPU's compute mode while the shares are held and after."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

import yaml

from agents.backends import simulated_backends
from agents.config import parse_config
from agents.dra.claims import AllocationResult, Claim, ClaimError
from agents.dra.driver import ClaimRef, ClaimStore, Driver
from agents.family import Context, config_view
from agents.gpu.kind import GpuKind
from agents.health_fanout import HealthFanout
from agents.hw.mps_control import PIPE_VARIABLE

DRIVER = "gpu.nvidia.com"
POOL = "demo"
SHARES_CONFIG = "version: v1\nsharing:\n  shares: {enforce: mps}\n"
SHARES = {  # claim -> what it asks of gpu-0
    "team-a/notebook": {"memory": "20Gi", "compute": "25"},
    "team-b/inference": {"memory": "10Gi", "compute": "30"},
}
SHOWN = ("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", PIPE_VARIABLE)


async def show_shares(node_file: Path, work: Path, out: Callable[[str], None]) -> None:
    """Prepare the SHARES of gpu-0 as the kubelet's DRA calls would, then unprepare them."""
    shared = await asyncio.to_thread(_with_mps, node_file, work / "shares-node.yaml")
    kind = GpuKind()
    config = kind.named_devices(config_view(kind, parse_config(SHARES_CONFIG, "<demo>")))
    async with simulated_backends(shared) as backends:
        found = await asyncio.to_thread(kind.discover, config, backends, "<demo>")
        family = kind.build(found, config, Context(backends, HealthFanout(), None))
        claims = {
            name: Claim(
                name.split("/")[0],
                name.split("/")[1],
                f"uid-{i}",
                (AllocationResult("gpu", DRIVER, POOL, "gpu-0", share_id=f"s{i}", consumed=c),),
                (),
            )
            for i, (name, c) in enumerate(SHARES.items())
        }

        async def read(ref: ClaimRef) -> Claim:
            return claims[f"{ref.namespace}/{ref.name}"]

        driver = Driver(DRIVER, POOL, ClaimStore(DRIVER, work / "plugins", work / "cdi"), read)
        driver.publish(family.facts(), {r.name: r for r in family.resources()}, family.edits)
        gpu = family.gpus[0]
        out(
            f"\nDRA shares (sharing.shares, enforce: mps) of GPU{gpu.index}"
            f" ({gpu.memory_mib} MiB), MPS control daemon started by the agent:"
        )
        refs = [ClaimRef(c.namespace, c.uid, c.name) for c in claims.values()]
        for ref, answer in (await driver.prepare(refs)).items():
            claim = next(c for c in claims.values() if c.uid == ref)
            asked = SHARES[f"{claim.namespace}/{claim.name}"]
            if isinstance(answer, ClaimError):
                out(f"  claim {claim.namespace}/{claim.name}: refused: {answer}")
                continue
            what = ", ".join(f"{k} {v}" for k, v in asked.items())
            out(f"  claim {claim.namespace}/{claim.name} ({what}): prepared; its container gets")
            for key in SHOWN:
                if key in answer.env:
                    out(f"    env {key}={answer.env[key]}")
        mode = await asyncio.to_thread(backends.nvml.compute_mode, gpu.uuid)
        out(f"  GPU{gpu.index} compute mode while they run: {mode}")
        await driver.unprepare(refs)
        mode = await asyncio.to_thread(backends.nvml.compute_mode, gpu.uuid)
        out(f"  both unprepared: GPU{gpu.index} compute mode {mode}")
        await family.close()


def _with_mps(node_file: Path, to: Path) -> Path:
    """A copy of the node file whose node has MPS (the twin of its control program)."""
    doc = yaml.safe_load(node_file.read_text())
    doc["mps"] = {"available": True}
    to.write_text(yaml.safe_dump(doc, sort_keys=False))
    return to
