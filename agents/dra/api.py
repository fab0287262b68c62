"""The DRA API (`--api dra`, docs/dra.md): the same families served as DRA drivers; its
flags, its runtime's maker, and what its claims still hold when another API serves. The
rest of agents/dra is imported only when used: it brings the API-server client."""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from agents.kernel.handover import Holdings
from agents.kernel.runtime import Serve

if TYPE_CHECKING:
    from agents.dra.runtime import DraSettings

DEFAULT_KUBELET_PLUGINS_DIR = "/var/lib/kubelet/plugins"
DEFAULT_KUBELET_REGISTRY_DIR = "/var/lib/kubelet/plugins_registry"
DEFAULT_CDI_ROOT = "/var/run/cdi"


class DraApi:
    name = "dra"

    def add_flags(self, run: argparse.ArgumentParser) -> None:
        run.add_argument(
            "--kubelet-plugins-dir",
            type=Path,
            metavar="DIR",
            default=Path(DEFAULT_KUBELET_PLUGINS_DIR),
            help=f"DRA: where each driver's service socket and checkpoint go "
            f"(default {DEFAULT_KUBELET_PLUGINS_DIR})",
        )
        run.add_argument(
            "--kubelet-registry-dir",
            type=Path,
            metavar="DIR",
            default=Path(DEFAULT_KUBELET_REGISTRY_DIR),
            help="DRA: the kubelet's plugin-watcher directory "
            f"(default {DEFAULT_KUBELET_REGISTRY_DIR})",
        )
        run.add_argument(
            "--cdi-root",
            type=Path,
            metavar="DIR",
            default=Path(DEFAULT_CDI_ROOT),
            help=f"DRA: where prepared claims' CDI specs are written (default {DEFAULT_CDI_ROOT})",
        )
        run.add_argument(
            "--dra-device-taints",
            action="store_true",
            help="DRA: keep an Unhealthy device in its slice with a NoSchedule taint instead "
            "of leaving it out, and taint a Degraded one (API server and scheduler need "
            "DRADeviceTaints)",
        )
        run.add_argument(
            "--dra-evict-unhealthy",
            action="store_true",
            help="DRA, with --dra-device-taints: an Unhealthy device's taint is NoExecute, so "
            "that the pods using it are evicted and placed again",
        )

    def flags_error(self, opts: argparse.Namespace) -> str | None:
        if opts.dra_evict_unhealthy and not opts.dra_device_taints:
            return "--dra-evict-unhealthy: only with --dra-device-taints"
        return None

    async def serve(self, opts: argparse.Namespace, env: Mapping[str, str]) -> Serve:
        """ConfigError without a node name or API server."""
        from agents.dra.runtime import DraSettings
        from agents.dra.wiring import dra_serve

        def settings(node: str) -> DraSettings:
            return DraSettings(
                node=node,
                plugins_dir=opts.kubelet_plugins_dir,
                registry_dir=opts.kubelet_registry_dir,
                cdi_root=opts.cdi_root,
                device_taints=opts.dra_device_taints,
                evict_unhealthy=opts.dra_evict_unhealthy,
            )

        return await dra_serve(settings, opts.kubeconfig, opts.node_name, env)

    def leftovers(self, opts: argparse.Namespace) -> Holdings:
        """Device-plugin mode's view of the DRA checkpoints (docs/dra.md)."""
        from agents.dra.holdings import DraHoldings
        from agents.kernel.kubelet_facts import PodResources

        socket = opts.pod_resources_socket
        return DraHoldings(
            opts.kubelet_plugins_dir,
            opts.kubelet_registry_dir,
            opts.cdi_root,
            PodResources(socket),
            poll_s=opts.timing.held_claims_poll_s,
        )
