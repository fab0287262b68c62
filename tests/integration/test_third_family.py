"""A third device family, defined in the tests (tests/third/family.py) and plugged in
beside the GPU and RoCE families with `Agent(kinds=...)`: nothing under agents/ names it,
yet both runtimes serve it. Through device plugins, the kubelet stand-in registers it,
lists its cards, gets their edits from Allocate and hears a card turn Unhealthy; the
health fan-out tells the log and the cluster reporter of it as a typed value. Through
DRA its cards appear in a ResourceSlice with their facts, and a claim of one is prepared
with its edits."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import shutil
import tempfile
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import structlog.testing

from agents.backends import Backends, simulated_backends
from agents.command_line import parse_args
from agents.config import Config
from agents.core.health import DeviceHealth, Grade
from agents.daemon import Agent
from agents.dra.api import DraApi
from agents.families import KINDS
from agents.plugin.api import DevicePlugins
from agents.sim.bundled import bundled_node
from agents.standin.kubelet import Container, Kubelet, Pod
from tests.conditions import WAIT, async_wait_until
from tests.standin.apiserver import ApiServer, write_kubeconfig
from tests.standin.dra_kubelet import DraKubelet, PluginWatcher
from tests.third.family import (
    CLASS_DIR,
    DRIVER,
    RESOURCE,
    VISIBLE_ENV,
    CardKind,
    Overheated,
    set_health,
    write_card,
)
from tests.timing import SHORT

NODE = "third-node"
CARDS = ("card0", "card1", "card2")


class Told:
    """The cluster reporter's end of the health fan-out: every change it is told of."""

    def __init__(self) -> None:
        self.changes: list[DeviceHealth] = []

    def changed(self, change: DeviceHealth) -> None:
        self.changes.append(change)

    async def run(self, current: Callable[[], list[DeviceHealth]]) -> None:
        await asyncio.Event().wait()

    def of(self, device: str) -> list[DeviceHealth]:
        return [c for c in self.changes if c.resource == RESOURCE and c.device_id == device]


@contextlib.asynccontextmanager
async def node_with_cards(tmp_path: Path) -> AsyncIterator[Backends]:
    """The bundled 8-GPU, 8-NIC node, simulated, with three cards in its sysfs tree."""
    node_file = tmp_path / "node.yaml"
    shutil.copy(bundled_node("h100-8gpu-8nic"), node_file)
    async with simulated_backends(node_file) as backends:
        for i, name in enumerate(CARDS):
            write_card(backends.sysfs.root, name, numa=i % 2)
        yield backends


@contextlib.asynccontextmanager
async def running(agent: Agent) -> AsyncIterator[Agent]:
    await agent.start()
    stop = asyncio.Event()
    task = asyncio.ensure_future(agent.run(stop))
    try:
        yield agent
    finally:
        stop.set()
        await asyncio.wait_for(task, WAIT)


def heard(kubelet: Kubelet, card: str) -> str | None:
    """The card's health as the kubelet last heard it."""
    view = kubelet.resource(RESOURCE)
    state = None if view is None else view.devices.get(card)
    return None if state is None else state.health


def card_dir(backends: Backends, name: str) -> Path:
    return backends.sysfs.root / CLASS_DIR / name


async def test_a_third_family_is_served_through_device_plugins_with_its_health(
    tmp_path: Path,
) -> None:
    # A unix socket path must fit in 108 bytes: pytest's tmp_path leaves too little room.
    plugin_dir = Path(tempfile.mkdtemp(prefix="dp-"))
    kubelet = Kubelet(plugin_dir, seed=3)
    await kubelet.start()
    told = Told()
    try:
        async with node_with_cards(tmp_path) as backends:
            agent = Agent(
                Config.default(),
                "<test>",
                DevicePlugins(plugin_dir),
                backends,
                kinds=(*KINDS, CardKind()),
                reporter=told,
                timing=SHORT,
            )
            with structlog.testing.capture_logs() as logs:
                async with running(agent):
                    # The cards beside the GPUs and NICs:
                    counts = {RESOURCE: 3, "nvidia.com/gpu": 8, "rdma/roce": 8}
                    await kubelet.wait_until(lambda k: k.capacity() == counts, WAIT)
                    view = kubelet.resource(RESOURCE)
                    assert view is not None
                    assert {i: (s.health, s.numa) for i, s in view.devices.items()} == {
                        "card0": ("Healthy", (0,)),
                        "card1": ("Healthy", (1,)),
                        "card2": ("Healthy", (0,)),
                    }

                    pod = await kubelet.admit(Pod("p", [Container("c", {RESOURCE: 2})]))
                    got = pod.containers["c"].devices[RESOURCE]
                    answer = pod.containers["c"].responses[RESOURCE]
                    assert dict(answer.envs) == {VISIBLE_ENV: ",".join(got)}
                    root = str(backends.dev_root)
                    assert [(d.container_path, d.host_path) for d in answer.devices] == [
                        (f"/dev/{i}", f"{root}/dev/{i}") for i in got
                    ]

                    set_health(card_dir(backends, "card1"), "hot 97")
                    await kubelet.wait_until(lambda k: heard(k, "card1") == "Unhealthy", WAIT)
                    await async_wait_until(lambda: told.of("card1"), WAIT, "card1 told")
                    fault = told.of("card1")[-1]
                    assert fault.cause == Overheated(97)
                    assert fault.grade is Grade.UNHEALTHY
                    assert dict(fault.cause.figures()) == {"celsius": 97}
                    assert fault.where == "card card1"

                    set_health(card_dir(backends, "card1"), "ok")
                    await kubelet.wait_until(lambda k: heard(k, "card1") == "Healthy", WAIT)
                    await async_wait_until(lambda: len(told.of("card1")) == 2, WAIT, "recovery")
                    assert told.of("card1")[-1].cause is None
                    assert told.of("card0") == []  # only the card that changed is told
    finally:
        await kubelet.stop()
        shutil.rmtree(plugin_dir, ignore_errors=True)
    said = [(e["event"], e.get("reason")) for e in logs if e.get("device") == "card1"]
    assert said == [("device_unhealthy", "overheated"), ("device_healthy", None)]


def dra_opts(root: Path) -> argparse.Namespace:
    """`--api dra`'s command line, parsed as the agent parses it."""
    return parse_args(
        [
            *("run", "--api", "dra", "--node-name", NODE),
            *("--kubeconfig", str(root / "kubeconfig")),
            *("--kubelet-plugins-dir", str(root / "plugins")),
            *("--kubelet-registry-dir", str(root / "registry")),
            *("--cdi-root", str(root / "cdi")),
        ]
    )


def slice_devices(server: ApiServer) -> dict[str, dict[str, Any]]:
    return {
        d["name"]: d
        for s in server.store.slices.values()
        if s["spec"]["driver"] == DRIVER and s["spec"]["nodeName"] == NODE
        for d in s["spec"]["devices"]
    }


async def test_a_third_family_is_published_through_dra_with_its_facts(tmp_path: Path) -> None:
    server = ApiServer((NODE,))
    await server.start()
    root = Path(tempfile.mkdtemp(prefix="dra-"))  # sockets: short paths
    write_kubeconfig(root / "kubeconfig", server.url)
    (root / "registry").mkdir()
    watcher = PluginWatcher(root / "registry")
    await watcher.start()
    kubelet = DraKubelet(watcher)
    opts = dra_opts(root)
    try:
        async with node_with_cards(tmp_path) as backends:
            agent = Agent(
                Config.default(),
                "<test>",
                await DraApi().serve(opts, {}),
                backends,
                kinds=(CardKind(),),
                timing=SHORT,
            )
            async with running(agent):
                await watcher.registered(DRIVER, WAIT)
                await async_wait_until(lambda: len(slice_devices(server)) == 3, WAIT, "slice")
                card0 = slice_devices(server)["card0"]
                assert card0["attributes"] == {
                    "model": {"string": "ToyCard 9000"},
                    "firmware": {"version": "1.2.3"},
                    "resource.kubernetes.io/numaNode": {"int": 0},
                    "node-agents.io/health": {
                        "string": "Healthy"
                    },  # every family's, by the runtime
                }
                assert card0["capacity"] == {"memory": {"value": "16Gi"}}

                server.store.put_claim(
                    "ns",
                    "c-u1",
                    "u1",
                    [{"request": "r", "driver": DRIVER, "pool": NODE, "device": "card2"}],
                )
                answer = await kubelet.prepare(DRIVER, [("ns", "u1", "c-u1")])
                assert answer.claims["u1"].error == ""
                assert [d.device_name for d in answer.claims["u1"].devices] == ["card2"]
                spec = (root / "cdi" / f"k8s.{DRIVER}-claim_u1.yaml").read_text()
                assert f"{VISIBLE_ENV}=card2" in spec and "/dev/card2" in spec

                set_health(card_dir(backends, "card1"), "hot 90")
                await async_wait_until(
                    lambda: set(slice_devices(server)) == {"card0", "card2"}, WAIT, "card1 out"
                )
    finally:
        await kubelet.close()
        await watcher.stop()
        await server.stop()
        shutil.rmtree(root, ignore_errors=True)
