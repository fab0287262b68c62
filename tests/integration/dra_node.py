"""A node in DRA mode for tests: a real `node-agent run --api dra` process on a simulated
node, the API-server stand-in it publishes to and reads claims from, and the kubelet's
plugin watcher and DRA calls (tests/standin/dra_kubelet.py), all over real sockets."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conditions import PROCESS_WAIT as WAIT
from tests.integration.conftest import AgentProcess
from tests.standin.apiserver import ApiServer, write_kubeconfig
from tests.standin.dra_kubelet import DraKubelet, PluginWatcher

NODE = "dra-node-1"
GPU = "gpu.nvidia.com"
NIC = "roce.node-agents.io"
Obj = dict[str, Any]


@dataclass
class DraNode:
    root: Path
    server: ApiServer
    watcher: PluginWatcher
    kubelet: DraKubelet
    start_agent: Callable[..., AgentProcess]  # (args, env=None)

    @property
    def plugins(self) -> Path:
        return self.root / "plugins"

    @property
    def registry(self) -> Path:
        return self.root / "registry"

    @property
    def cdi(self) -> Path:
        return self.root / "cdi"

    @property
    def device_plugins(self) -> Path:
        return self.root / "device-plugins"

    def args(self, node_file: Path | None, *more: str) -> list[str]:
        """The command line on the simulated node `node_file`; None: the real backends
        (the test NVML library, through `env`)."""
        simulate = ["--simulate", str(node_file)] if node_file is not None else []
        return [
            "run",
            "--api",
            "dra",
            *simulate,
            "--node-name",
            NODE,
            "--kubeconfig",
            str(self.root / "kubeconfig"),
            "--kubelet-plugins-dir",
            str(self.plugins),
            "--kubelet-registry-dir",
            str(self.registry),
            "--cdi-root",
            str(self.cdi),
            "--device-plugin-dir",
            str(self.device_plugins),
            "--pod-resources-socket",
            str(self.root / "pod-resources.sock"),
            *more,
        ]

    async def start(
        self,
        node_file: Path | None,
        *more: str,
        drivers: Sequence[str] = (GPU, NIC),
        env: Mapping[str, str] | None = None,
    ) -> AgentProcess:
        """The agent (on tests/timing.py's short hold times and probe periods), once its
        drivers are registered and their slices published."""
        after = {d: r.serial for d, r in self.watcher.drivers.items()}
        agent = self.start_agent(self.args(node_file, *more), env=env, short_timing=True)
        for driver in drivers:
            await self.registered(agent, driver, after.get(driver, 0))
        await self.wait(lambda: all(self.devices(d) for d in drivers) or not agent.alive())
        assert agent.alive(), agent.stderr[-3000:]
        return agent

    async def registered(self, agent: AgentProcess, driver: str, after: int = 0) -> None:
        """Until the plugin watcher registered `driver` anew; fails at once, with the
        agent's last words, if the agent exits first."""

        def newer() -> bool:
            found = self.watcher.drivers.get(driver)
            return found is not None and found.serial > after

        await self.wait(lambda: newer() or not agent.alive())
        assert newer(), f"the agent exited: {agent.stderr[-3000:]}"

    async def restart_kubelet(self) -> None:
        """The kubelet restarted: its plugin watcher and calls stop, new ones start on the
        same registry directory, knowing no driver until the agent's register again."""
        await self.kubelet.close()
        await self.watcher.stop()
        self.watcher = PluginWatcher(self.registry)
        await self.watcher.start()
        self.kubelet = DraKubelet(self.watcher)

    def slices(self, driver: str) -> list[Obj]:
        return [
            s
            for s in self.server.store.slices.values()
            if s["spec"]["driver"] == driver and s["spec"]["nodeName"] == NODE
        ]

    def devices(self, driver: str) -> dict[str, Obj]:
        """Device name -> the device as its slice shows it."""
        return {d["name"]: d for s in self.slices(driver) for d in s["spec"]["devices"]}

    def claim(self, uid: str, results: Sequence[tuple[str, str, str]], **extra: Any) -> Obj:
        """A claim in namespace `ns`, name `c-<uid>`, allocated to (request, driver,
        device) on this node."""
        entries = [
            {"request": r, "driver": d, "pool": NODE, "device": dev, **extra}
            for r, d, dev in results
        ]
        return self.server.store.put_claim("ns", f"c-{uid}", uid, entries)

    async def wait(self, condition: Callable[[], object], within: float = WAIT) -> None:
        from tests.conditions import async_wait_until

        await async_wait_until(lambda: bool(condition()), within)

    def spec(self, driver: str, uid: str) -> Obj | None:
        path = self.cdi / f"k8s.{driver}-claim_{uid}.yaml"
        return yaml.safe_load(path.read_text()) if path.exists() else None


def ref(uid: str) -> tuple[str, str, str]:
    """The kubelet's reference to claim `uid` (namespace, UID, name)."""
    return ("ns", uid, f"c-{uid}")


@pytest.fixture
async def dra_node(
    tmp_path: Path, start_agent: Callable[..., AgentProcess]
) -> AsyncIterator[DraNode]:
    server = ApiServer((NODE,))
    await server.start()
    root = tmp_path / "dra"
    root.mkdir()
    write_kubeconfig(root / "kubeconfig", server.url)
    (root / "registry").mkdir()
    watcher = PluginWatcher(root / "registry")
    await watcher.start()
    node = DraNode(root, server, watcher, DraKubelet(watcher), start_agent)
    try:
        yield node
    finally:
        await node.kubelet.close()
        await node.watcher.stop()
        await server.stop()
