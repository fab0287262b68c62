#!/usr/bin/env python3
"""Smoke-test the agent on a real GPU node: the real NVML (and RDMA, where present) against
the in-process kubelet stand-in in a temporary device-plugin directory. Also runs on the
NVML library of the tests (LD_LIBRARY_PATH and NODE_AGENT_NVML_STATE, see tests/nvml).

Prints what was advertised, admits one pod asking for one GPU, prints the Allocate answer
and stops. Exits 0 on success, 1 with a one-line reason otherwise (e.g. no NVML here).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
import tempfile
from pathlib import Path
from typing import Any

from agents.backends import real_backends
from agents.cli import configure_logging
from agents.config import Config, load_config
from agents.daemon import Agent
from agents.errors import AgentError
from agents.families import parse_families
from agents.gpu.family import GpuFamily
from agents.gpu.plan import GPU_RESOURCE, MIG_PREFIX
from agents.plugin.api import DevicePlugins
from agents.standin.kubelet import AdmissionError, Container, Kubelet, Pod

WAIT_S = 20.0
INFINIBAND = Path("/sys/class/infiniband")


class SmokeError(Exception):
    """The run did not show what a working node shows."""


def families() -> tuple[str, ...]:
    """gpu, and roce only where the node has RDMA devices."""
    has_rdma = INFINIBAND.is_dir() and any(INFINIBAND.iterdir())
    return ("gpu", "roce") if has_rdma else ("gpu",)


def listed(kubelet: Kubelet, expected: set[str]) -> bool:
    """Every expected resource registered and its first device list received: the
    resource names alone arrive before any device does."""
    views = kubelet.resources()
    return set(views) == expected and all(
        views[name].connected and views[name].updates > 0 for name in expected
    )


def gpu_resource(kubelet: Kubelet) -> str:
    names = sorted(kubelet.resources())
    for name in (GPU_RESOURCE, f"{GPU_RESOURCE}.shared"):
        if name in names:
            return name
    mig = [n for n in names if n.startswith(MIG_PREFIX)]
    if not mig:
        raise SmokeError(f"no GPU resource was advertised (got {names or 'none'})")
    return mig[0]


def show_advertised(kubelet: Kubelet) -> None:
    print("Advertised:")
    for name, view in sorted(kubelet.resources().items()):
        healthy = len(view.healthy())
        print(f"  {name}: {len(view.devices)} devices, {healthy} healthy")
        for device_id, state in sorted(view.devices.items()):
            numa = ",".join(str(n) for n in state.numa) or "-"
            print(f"    {device_id}  NUMA {numa}  {state.health}")


def show_answer(resource: str, ids: list[str], answer: Any) -> None:
    print(f"\nAllocate for one container asking {resource}: 1 -> {', '.join(ids)}")
    for key, value in sorted(answer.envs.items()):
        print(f"  env {key}={value}")
    for spec in answer.devices:
        print(f"  device {spec.container_path} <- {spec.host_path} ({spec.permissions})")
    for cdi in answer.cdi_devices:
        print(f"  cdi {cdi.name}")


async def smoke(config: Config, source: str, plugin_dir: Path) -> None:
    kubelet = Kubelet(plugin_dir, seed=1)
    await kubelet.start()
    stop = asyncio.Event()
    try:
        agent = Agent(
            config,
            source,
            DevicePlugins(plugin_dir),
            real_backends(),
            parse_families(",".join(families())),
        )
        await agent.start()  # BackendError when NVML cannot initialise
        gpu = agent.family(GpuFamily)
        if gpu is None or not gpu.gpus:
            raise SmokeError("NVML answered but lists no GPU")
        task = asyncio.ensure_future(agent.run(stop))
        try:
            expected = {r.name for f in agent.families.values() for r in f.resources()}
            await kubelet.wait_until(lambda k: listed(k, expected), WAIT_S)
            show_advertised(kubelet)
            resource = gpu_resource(kubelet)
            got = await kubelet.admit(Pod("real-gpu-smoke", [Container("c", {resource: 1})]))
            show_answer(
                resource,
                got.devices("c", resource),
                got.containers["c"].responses[resource],
            )
        finally:
            stop.set()
            await asyncio.wait_for(task, WAIT_S)
    finally:
        await kubelet.stop()


def check_stopped(plugin_dir: Path) -> None:
    left = sorted(p.name for p in plugin_dir.glob("node-agent-*.sock"))
    if left:
        raise SmokeError(f"sockets left behind after stop: {', '.join(left)}")
    print("\nStopped cleanly: every plugin socket removed.")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--config", type=Path, help="agent configuration file (YAML)")
    parser.add_argument("--verbose", action="store_true", help="show the agent's info logs")
    args = parser.parse_args(argv)
    configure_logging("console", logging.INFO if args.verbose else logging.WARNING)
    try:
        config = load_config(args.config) if args.config else Config.default()
        source = str(args.config) if args.config else "<defaults>"
        with tempfile.TemporaryDirectory(prefix="real-gpu-") as work:
            asyncio.run(smoke(config, source, Path(work)))
            check_stopped(Path(work))
    except (AgentError, SmokeError, AdmissionError, TimeoutError) as exc:
        print(f"real_gpu: FAILED: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
