"""Degraded NICs through the whole agent on a simulated node: the node file's speeds,
counters and carrier changes read from its sysfs tree every probe period; a Degraded NIC
marked for the preferred allocation and told to the kubelet as the config says; a reload's
limits applied without a flap; and a link that goes down (real netlink, on a veth) winning
over Degraded."""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
import time
import urllib.request
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families
from structlog.testing import capture_logs

from agents.backends import simulated_backends
from agents.config import parse_config
from agents.core.device import Device
from agents.core.health import Cause, DeviceHealth, Grade, LinkNotUp, Signal
from agents.daemon import Agent
from agents.plugin.api import DevicePlugins
from agents.roce.family import RoceFamily
from agents.standin.kubelet import Kubelet
from tests.conditions import WAIT, async_wait_until
from tests.families import running_family
from tests.timing import SHORT
from tests.veth import ip, node_on_netdev, veth_pair
from tests.writers import write_atomic

NIC = "rdma/roce"
FAST, SLOW = 400000, 100000
HOLD_S = 1  # health.degraded.holdS of most tests here
HOLD = f"health: {{degraded: {{holdS: {HOLD_S}}}}}\n"

Doc = dict[str, Any]


def speeds(doc: Doc, slow: Mapping[int, int] | None = None) -> None:
    """Every NIC at FAST, those in `slow` (index -> Mb/s) slower."""
    for i, nic in enumerate(doc["nics"]):
        nic["speedMbps"] = (slow or {}).get(i, FAST)


def edit(node_file: Path, change: Callable[[Doc], None]) -> None:
    doc = yaml.safe_load(node_file.read_text())
    change(doc)
    write_atomic(node_file, yaml.safe_dump(doc, sort_keys=False))


@dataclass
class Running:
    agent: Agent
    kubelet: Kubelet
    node_file: Path
    at_start: dict[str, Device]  # the NICs as built from discovery, before any probe

    @property
    def family(self) -> RoceFamily:
        return running_family(self.agent, RoceFamily)  # a reload builds another

    def pci(self, index: int) -> str:
        return str(yaml.safe_load(self.node_file.read_text())["nics"][index]["pci"])

    def netdev(self, index: int) -> str:
        return str(yaml.safe_load(self.node_file.read_text())["nics"][index]["netdev"])

    def device(self, pci: str) -> Device:
        device = self.family.resources()[0].inventory.get(pci)
        assert device is not None, f"{pci} is not advertised"
        return device

    def health(self, pci: str) -> DeviceHealth:
        return next(h for h in self.family.device_health() if h.device_id == pci)

    def told(self, pci: str) -> str | None:
        """What the kubelet was told of the NIC: Healthy or Unhealthy."""
        view = self.kubelet.resource(NIC)
        state = view.devices.get(pci) if view is not None else None
        return state.health if state is not None else None

    def degraded(self) -> set[str]:
        return {d.id for d in self.family.resources()[0].inventory.devices if d.degraded}


@asynccontextmanager
async def running(
    node_file: Path, config: str = HOLD, *, metrics: bool = False
) -> AsyncIterator[Running]:
    with tempfile.TemporaryDirectory(prefix="na-deg-") as work:  # short: socket paths
        plugin_dir = Path(work) / "plugins"
        kubelet = Kubelet(plugin_dir, seed=1)
        await kubelet.start()
        stop = asyncio.Event()
        async with simulated_backends(node_file) as backends:
            agent = Agent(
                parse_config(config, "<test>"),
                "<test>",
                DevicePlugins(plugin_dir),
                backends,
                timing=SHORT,
                metrics_address="127.0.0.1:0" if metrics else None,
            )
            await agent.start()
            family = running_family(agent, RoceFamily)
            at_start = {d.id: d for d in family.resources()[0].inventory.devices}
            task = asyncio.ensure_future(agent.run(stop))
            try:
                ready = Running(agent, kubelet, node_file, at_start)
                await kubelet.wait_until(
                    lambda k: all(ready.told(d) is not None for d in at_start), WAIT
                )
                yield ready
            finally:
                stop.set()
                await task
        await kubelet.stop()


async def test_a_nic_slower_than_its_peers_is_degraded_then_healthy_after_the_hold(
    node_file: Path,
) -> None:
    edit(node_file, lambda d: speeds(d, {2: SLOW}))
    async with running(node_file) as on:
        slow = on.pci(2)
        assert on.at_start[slow].degraded, "judged at discovery, before the first probe"
        await async_wait_until(lambda: on.degraded() == {slow}, WAIT, "only NIC 2 Degraded")
        assert on.device(slow).healthy and on.told(slow) == "Healthy"
        netdev = on.netdev(2)
        assert on.health(slow) == DeviceHealth(
            NIC,
            slow,
            f"interface {netdev}",
            Signal(
                "link-speed",
                f"{netdev} at {SLOW} Mb/s, expected {FAST}",
                (("speedMbps", SLOW), ("expectedMbps", FAST)),
            ),
        )
        assert [on.health(on.pci(i)).grade for i in (0, 1, 3)] == [Grade.HEALTHY] * 3
        edit(node_file, speeds)
        began = time.monotonic()
        await async_wait_until(lambda: not on.degraded(), WAIT, "NIC 2 Healthy again")
        # Held from the last probe out of limits, which may precede the edit by a period.
        assert time.monotonic() - began >= HOLD_S - SHORT.signal_probe_s
        assert on.health(slow).grade is Grade.HEALTHY and on.told(slow) == "Healthy"


async def test_report_unhealthy_tells_the_kubelet_that_a_degraded_nic_is_unhealthy(
    node_file: Path,
) -> None:
    edit(node_file, lambda d: speeds(d, {5: SLOW}))
    config = f"health: {{degraded: {{report: unhealthy, holdS: {HOLD_S}}}}}\n"
    async with running(node_file, config) as on:
        slow = on.pci(5)
        assert not on.at_start[slow].healthy, "never advertised Healthy first"
        assert on.told(slow) == "Unhealthy"
        assert on.health(slow).grade is Grade.DEGRADED  # the cluster is told why
        assert {on.told(on.pci(i)) for i in range(8) if i != 5} == {"Healthy"}
        edit(node_file, speeds)
        await on.kubelet.wait_until(lambda _: on.told(slow) == "Healthy", WAIT)
        assert not on.degraded()


@pytest.mark.parametrize(
    ("before", "after", "signal"),
    [
        pytest.param(
            {"counters": {"symbol_error": 0, "rnr_nak_retry_err": 0}},
            {"counters": {"symbol_error": 3, "rnr_nak_retry_err": 40}},
            "rdma-errors",
            id="rdma-counters-climb",
        ),
        pytest.param({"carrierChanges": 1}, {"carrierChanges": 4}, "link-flaps", id="flaps"),
    ],
)
async def test_counters_climbing_on_the_simulated_node_make_the_nic_degraded(
    node_file: Path, before: Doc, after: Doc, signal: str
) -> None:
    """Back to Healthy is shown on the simulated tree with an injected clock
    (test_nic_signal_files): the windows are minutes long."""
    edit(node_file, lambda d: d["nics"][4].update(before))
    async with running(node_file) as on:
        nic = on.pci(4)
        assert not on.degraded()
        edit(node_file, lambda d: d["nics"][4].update(after))
        await async_wait_until(lambda: on.degraded() == {nic}, WAIT, f"NIC 4 Degraded ({signal})")
        cause = on.health(nic).cause
        assert isinstance(cause, Signal) and cause.label == signal
        assert on.told(nic) == "Healthy"


async def test_a_reload_applies_new_limits_and_keeps_what_was_measured(node_file: Path) -> None:
    edit(node_file, lambda d: speeds(d, {1: 200000}))
    held = "health: {degraded: {holdS: 5, nicSpeedMbps: 200000}}\n"
    async with running(node_file) as on:
        slow = on.pci(1)
        await async_wait_until(lambda: on.degraded() == {slow}, WAIT, "NIC 1 Degraded")
        await on.agent.reload(parse_config(held, "<test>"))
        # Within the new limit now, but held: a reload is no reason to flap.
        assert on.degraded() == {slow}
        await async_wait_until(lambda: not on.degraded(), WAIT + 5, "NIC 1 Healthy after the hold")
        await on.agent.reload(parse_config("health: {degraded: {nicSpeedMbps: 800000}}", "<t>"))
        every = {on.pci(i) for i in range(8)}
        await async_wait_until(lambda: on.degraded() == every, WAIT, "every NIC Degraded")
        assert {on.told(pci) for pci in every} == {"Healthy"}


@pytest.mark.netns
@pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("ip") is None, reason="needs root and iproute2"
)
async def test_a_degraded_nic_whose_link_goes_down_is_unhealthy_then_degraded_again() -> None:
    """NIC 0 is a veth here (its link state the kernel's), at a quarter of its peers' speed
    in the node file; its peer, in a namespace of its own, is taken down and up."""
    with (
        veth_pair("nad", "na-deg", "nadegpeer") as (host, netns),
        tempfile.TemporaryDirectory(prefix="na-degv-") as work,
    ):
        node_file, _ = node_on_netdev(Path(work), host)
        edit(node_file, lambda d: speeds(d, {0: SLOW}))
        async with running(node_file) as on:
            nic = on.pci(0)
            await async_wait_until(lambda: on.degraded() == {nic}, WAIT, "NIC 0 Degraded")
            ip("-n", netns, "link", "set", "nadegpeer", "down")
            await on.kubelet.wait_until(lambda _: on.told(nic) == "Unhealthy", WAIT)
            down = on.health(nic)
            assert down.grade is Grade.UNHEALTHY and down.cause == LinkNotUp("down")
            assert not on.degraded(), "Degraded only while not Unhealthy"
            ip("-n", netns, "link", "set", "nadegpeer", "up")
            await on.kubelet.wait_until(lambda _: on.told(nic) == "Healthy", WAIT)
            await async_wait_until(lambda: on.degraded() == {nic}, WAIT, "Degraded again")
            assert on.health(nic).grade is Grade.DEGRADED


async def test_new_figures_are_told_and_another_signal_also_wakes_the_inventory(
    node_file: Path,
) -> None:
    """The figures of a fault reach the cluster's consumers as they change; another signal
    at the same grade also wakes the readers of the inventory (DRA's taint names it)."""
    edit(node_file, lambda d: d["nics"][6].update({"counters": {"symbol_error": 0}}))
    async with running(node_file) as on:
        nic = on.pci(6)
        edit(node_file, lambda d: d["nics"][6].update({"counters": {"symbol_error": 99}}))
        await async_wait_until(lambda: on.degraded() == {nic}, WAIT, "NIC 6 Degraded")
        inventory = on.family.resources()[0].inventory
        version = inventory.version

        def cause() -> Cause:
            found = on.health(nic).cause
            assert found is not None, "NIC 6 Healthy again"
            return found

        edit(node_file, lambda d: d["nics"][6].update({"counters": {"symbol_error": 150}}))
        await async_wait_until(lambda: cause().figures()["symbol_error"] == 150, WAIT, "+150")
        assert inventory.version == version, "new figures of one fault change no slice"
        edit(node_file, lambda d: speeds(d, {6: SLOW}))
        both = "link-speed,rdma-errors"
        await async_wait_until(lambda: cause().label == both, WAIT, "the speed too")
        assert inventory.version > version, "readers of the inventory (DRA) were woken"
        assert on.degraded() == {nic} and on.told(nic) == "Healthy"


async def test_signals_a_node_does_not_offer_are_logged_once_reloads_included(
    node_file: Path,
) -> None:
    """The bundled node has no speed files and no RDMA counters: each NIC's two signals
    are unknown, told once, and not again by the family a reload builds."""
    with capture_logs() as logs:
        async with running(node_file) as on:
            nics = {on.pci(i) for i in range(8)}

            def unknown() -> list[tuple[str, str]]:
                """The NICs' (the GPUs' are told too)."""
                return [
                    (e["device"], e["signal"])
                    for e in logs
                    if e["event"] == "device_signal_unknown" and e["device"] in nics
                ]

            every = {(pci, s) for pci in nics for s in ("link-speed", "rdma-errors")}
            await async_wait_until(lambda: set(unknown()) == every, WAIT, "16 unknown told")
            reloaded = "health: {degraded: {nicSpeedMbps: 800000}}\n"
            await on.agent.reload(parse_config(reloaded, "<test>"))
            edit(node_file, lambda d: d["nics"][0].update({"speedMbps": FAST}))
            nic = on.pci(0)  # a probe of the new family after the edit
            await async_wait_until(lambda: on.degraded() == {nic}, WAIT, "NIC 0 Degraded")
            assert sorted(unknown()) == sorted(every)
            assert not on.degraded() - {nic}


def scrape(port: int) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """Blocking: every sample of the agent's /metrics, by name and labels."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=WAIT) as reply:
        text = reply.read().decode()
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


async def test_a_degraded_nic_and_the_readings_behind_it_are_scraped(node_file: Path) -> None:
    edit(node_file, lambda d: speeds(d, {7: SLOW}))
    async with running(node_file, metrics=True) as on:
        server = on.agent.metrics_server
        assert server is not None
        await asyncio.wait_for(server.bound.wait(), WAIT)
        slow, well = on.pci(7), on.pci(0)

        def of(device: str, **labels: str) -> frozenset[tuple[str, str]]:
            return frozenset({"resource": NIC, "device": device, **labels}.items())

        def scraped() -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
            return scrape(server.port)

        deadline = time.monotonic() + WAIT
        while ("node_agent_nic_link_speed_mbps", of(well)) not in (
            samples := await asyncio.to_thread(scraped)
        ):
            assert time.monotonic() < deadline, "no NIC readings scraped"
            await asyncio.sleep(0.05)  # polled, as async_wait_until does
        assert samples[("node_agent_device_degraded", of(slow, signal="link-speed"))] == 1
        assert samples[("node_agent_nic_link_speed_mbps", of(slow))] == SLOW
        assert samples[("node_agent_nic_link_speed_expected_mbps", of(slow))] == FAST
        assert samples[("node_agent_nic_link_speed_mbps", of(well))] == FAST
        assert ("node_agent_device_degraded", of(well, signal="link-speed")) not in samples
