"""An agent on a simulated node, served from a thread of its own, for blocking clients."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

from agents.backends import simulated_backends
from agents.config import Config
from agents.daemon import Agent
from agents.plugin.api import DevicePlugins
from agents.plugin.server import socket_name
from hack.benchlib.agent import Client
from tests.families import plugin_manager


class LiveAgent:
    """start() returns once every resource answers; stop() ends the thread."""

    def __init__(self, node_file: Path, plugin_dir: Path, config: Config) -> None:
        self.node_file = node_file
        self.plugin_dir = plugin_dir
        self.config = config
        self.resources: list[str] = []
        self._ready = threading.Event()
        self._failed: BaseException | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._thread = threading.Thread(target=self._main, daemon=True)

    def socket(self, resource: str) -> Path:
        return self.plugin_dir / socket_name(resource)

    def start(self) -> None:
        self._thread.start()
        if not self._ready.wait(30) or self._failed is not None:
            raise RuntimeError(f"agent did not start: {self._failed}")
        for resource in self.resources:
            with Client(self.socket(resource)) as client:
                client.options(timeout=10)

    def stop(self) -> None:
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(30)

    def _main(self) -> None:
        try:
            asyncio.run(self._serve())
        except BaseException as exc:
            self._failed = exc
            self._ready.set()

    async def _serve(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        async with simulated_backends(self.node_file) as backends:
            agent = Agent(self.config, "<fuzz>", DevicePlugins(self.plugin_dir), backends)
            await agent.start()
            self.resources = sorted(plugin_manager(agent).servers)
            self._ready.set()
            await agent.run(self._stop)
