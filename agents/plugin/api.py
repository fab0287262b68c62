"""The device-plugin API (`--api device-plugin`, the default): one server per resource,
registered with the kubelet; and what its pods still hold when another API serves."""

from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from agents.kernel.handover import Holdings
from agents.kernel.offer import Offer
from agents.kernel.runtime import Host, Serve

if TYPE_CHECKING:
    from agents.plugin.kubelet_pairing import Pairing
    from agents.plugin.manager import PluginManager


class DevicePlugins:
    """Serving through device plugins in `plugin_dir`, with the GPU<->NIC pairing that
    the kubelet's preferred allocations ask for, fed by the kubelet's device checkpoint
    there and by its pod-resources socket."""

    names_devices = False

    def __init__(self, plugin_dir: Path, pod_resources_socket: Path | None = None) -> None:
        self.plugin_dir = plugin_dir
        self.pod_resources_socket = pod_resources_socket
        self._pairing: Pairing | None = None

    def pairing(self) -> Pairing:
        """One pairing for the agent's life: the kubelet's facts outlive a config reload."""
        if self._pairing is None:
            from agents.kernel.kubelet_facts import CheckpointFile, PodResources
            from agents.plugin.kubelet_pairing import Pairing

            facts = CheckpointFile(self.plugin_dir), PodResources(self.pod_resources_socket)
            self._pairing = Pairing(*facts)
        return self._pairing

    def runtime(self, fresh: Sequence[Offer], host: Host) -> PluginManager:
        from agents.plugin.manager import PluginManager  # grpc: only once serving

        pairing = self._pairing
        return PluginManager(
            self.plugin_dir,
            [r for f in fresh for r in f.resources()],
            telemetry=host.telemetry,
            before_preferred=None if pairing is None else pairing.refresh,
            withheld=host.withheld,
            flags=lambda: host.config().flags,
        )


class DevicePluginApi:
    name = "device-plugin"

    def add_flags(self, run: argparse.ArgumentParser) -> None:
        """None of its own: --device-plugin-dir and --pod-resources-socket are the agent's
        (in DRA mode, what pods still hold is read from them too)."""

    def flags_error(self, opts: argparse.Namespace) -> str | None:
        return None

    async def serve(self, opts: argparse.Namespace, env: Mapping[str, str]) -> Serve:
        opts.device_plugin_dir.mkdir(parents=True, exist_ok=True)
        return DevicePlugins(opts.device_plugin_dir, opts.pod_resources_socket)

    def leftovers(self, opts: argparse.Namespace) -> Holdings:
        from agents.plugin.leftovers import PodHoldings

        return PodHoldings(
            opts.device_plugin_dir,
            opts.pod_resources_socket,
            poll_s=opts.timing.held_pods_poll_s,
        )
