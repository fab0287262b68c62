"""The device-plugin API (`--api device-plugin`, the default): one server per resource,
registered with the kubelet; and what its pods still hold when another API serves."""

from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from agents.kernel.handover import Holdings
from agents.kernel.offer import Offer
from agents.kernel.runtime import Host, Serve

if TYPE_CHECKING:
    from agents.plugin.manager import PluginManager


class DevicePlugins:
    """Serving through device plugins: it needs nothing from the command line beyond the
    agent's own flags."""

    pairs = True  # the kubelet asks for preferred allocations, which pairing answers
    names_devices = False

    def runtime(self, fresh: Sequence[Offer], host: Host) -> PluginManager:
        from agents.plugin.manager import PluginManager  # grpc: only once serving

        return PluginManager(
            host.plugin_dir,
            [r for f in fresh for r in f.resources()],
            telemetry=host.telemetry,
            before_preferred=host.before_preferred,
            withheld=host.withheld,
        )


class DevicePluginApi:
    name = "device-plugin"

    def add_flags(self, run: argparse.ArgumentParser) -> None:
        """None of its own: --device-plugin-dir and --pod-resources-socket are the agent's
        (pairing reads them too)."""

    async def serve(self, opts: argparse.Namespace, env: Mapping[str, str]) -> Serve:
        return DevicePlugins()

    def leftovers(self, opts: argparse.Namespace) -> Holdings:
        from agents.plugin.leftovers import PodHoldings

        return PodHoldings(
            opts.device_plugin_dir,
            opts.pod_resources_socket,
            poll_s=opts.timing.held_pods_poll_s,
        )
