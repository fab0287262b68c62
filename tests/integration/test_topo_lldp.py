"""`node-agent topo` hearing each NIC's leaf switch over LLDP on real frames: NICs whose
netdevs are veths, each cabled to a 'switch' in a network namespace of its own (the
project's frame sender, or Debian's lldpd); and --lldp-wait 0 and no CAP_NET_RAW."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest
import yaml

from agents.sim.bundled import bundled_node
from tests.conditions import PROCESS_WAIT, wait_until
from tests.lldp_frames import PeerSender, frame
from tests.veth import lldpd_switch, veth_pair

pytestmark = pytest.mark.netns

PEER = "swp1"
WAIT_S = 30  # the --lldp-wait the hearing tests give: returning well before it is the point
LISTENING = "listening for LLDP"


class Topo:
    """`node-agent topo --simulate NODE --json ARGS` running, its stderr read as it comes."""

    def __init__(self, node: Path, *args: str, prefix: Sequence[str] = ()) -> None:
        command = [sys.executable, "-m", "agents.cli", "topo", "--simulate", str(node), "--json"]
        self.started = time.monotonic()
        self.process = subprocess.Popen(
            [*prefix, *command, *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.err: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stderr is not None
        self.err.extend(self.process.stderr)

    def said(self, text: str) -> bool:
        return any(text in line for line in self.err)

    def wait_listening(self) -> None:
        """Until topo says it listens (its sockets are open by then); fails, with topo's
        stderr, if it exits first."""
        wait_until(
            lambda: self.said(LISTENING) or self.process.poll() is not None,
            PROCESS_WAIT,
            "the progress line",
        )
        if not self.said(LISTENING):
            self._reader.join(PROCESS_WAIT)  # all it wrote, for the failure
        assert self.said(LISTENING), "".join(self.err)

    def report(self) -> tuple[dict[str, Any], float]:
        """The JSON report and the seconds topo ran; it must exit 0."""
        try:
            self.process.wait(PROCESS_WAIT + WAIT_S)
        finally:
            self.process.kill()
        took = time.monotonic() - self.started
        self._reader.join(PROCESS_WAIT)
        assert self.process.stdout is not None and self.process.stderr is not None
        with self.process.stdout, self.process.stderr:
            out = self.process.stdout.read()
        assert self.process.returncode == 0, "".join(self.err)
        report: dict[str, Any] = json.loads(out)  # stdout holds the JSON alone
        return report, took


def leaves(report: dict[str, Any]) -> dict[str, tuple[str | None, str | None]]:
    return {n["netdev"]: (n["leafSwitch"], n["leafPort"]) for n in report["nics"]}


def write_node(work: Path, netdevs: list[str]) -> Path:
    """The bundled 8-GPU node with as many NICs as `netdevs`, on them, hearing from the wire."""
    node = yaml.safe_load(bundled_node("h100-8gpu-8nic").read_text())
    node["nics"] = node["nics"][: len(netdevs)]
    for nic, netdev in zip(node["nics"], netdevs, strict=True):
        nic["netdev"] = netdev
        nic.pop("lldp", None)
    path = work / "node.yaml"
    path.write_text(yaml.safe_dump(node, sort_keys=False))
    return path


@pytest.fixture
def two_nics(tmp_path: Path) -> Iterator[tuple[Path, list[str], list[PeerSender]]]:
    """(node file, its NICs' netdevs, a frame sender at each veth's far end)."""
    with ExitStack() as stack:
        ends = [stack.enter_context(veth_pair(f"tpl{i}", "natopo", PEER)) for i in range(2)]
        netdevs = [host for host, _ in ends]
        senders = [stack.enter_context(PeerSender(netns, PEER)) for _, netns in ends]
        yield write_node(tmp_path, netdevs), netdevs, senders


def test_topo_shows_each_nics_leaf_and_returns_once_all_have_heard(
    two_nics: tuple[Path, list[str], list[PeerSender]],
) -> None:
    node, (eth0, eth1), (switch0, switch1) = two_nics
    topo = Topo(node, "--lldp-wait", str(WAIT_S))
    topo.wait_listening()
    sent = time.monotonic()
    switch0.send(frame(system_name="leaf-a", port_name="Ethernet1/1"))
    switch1.send(frame(system_name="leaf-b", port_name="Ethernet1/7"))
    report, _ = topo.report()
    after_frames = time.monotonic() - sent
    assert leaves(report) == {eth0: ("leaf-a", "Ethernet1/1"), eth1: ("leaf-b", "Ethernet1/7")}
    assert after_frames < WAIT_S / 3, f"{after_frames:.1f} s after the last NIC heard"
    assert report["leafSource"].startswith("the node file; LLDP heard by topo: 2 of 2 NICs")
    assert topo.said("node-agent topo: LLDP heard by topo: 2 of 2 NICs")


def test_topo_waits_out_lldp_wait_for_a_nic_that_hears_nothing(
    two_nics: tuple[Path, list[str], list[PeerSender]],
) -> None:
    node, (eth0, eth1), (switch0, _) = two_nics
    topo = Topo(node, "--lldp-wait", "2")
    topo.wait_listening()
    switch0.send(frame(system_name="leaf-a", port_name="Ethernet1/1"))
    report, took = topo.report()
    assert leaves(report) == {eth0: ("leaf-a", "Ethernet1/1"), eth1: (None, None)}
    assert took >= 2
    assert "1 of 2 NICs" in report["leafSource"], report["leafSource"]


def test_lldp_wait_0_does_not_listen(two_nics: tuple[Path, list[str], list[PeerSender]]) -> None:
    node, netdevs, _ = two_nics
    report, took = Topo(node, "--lldp-wait", "0").report()
    assert leaves(report) == dict.fromkeys(netdevs, (None, None))
    assert report["leafSource"] == "the node file; LLDP not listened for (--lldp-wait 0)"
    assert took < WAIT_S / 3  # the start alone; nothing is waited for


def test_without_cap_net_raw_topo_says_so_in_one_line_and_shows_no_leaf(
    two_nics: tuple[Path, list[str], list[PeerSender]],
) -> None:
    node, netdevs, _ = two_nics
    # Root keeps no capability its bounding set lacks across exec.
    drop = ["setpriv", "--bounding-set", "-net_raw", "--inh-caps", "-net_raw", "--"]
    topo = Topo(node, "--lldp-wait", str(WAIT_S), prefix=drop)
    report, took = topo.report()
    assert leaves(report) == dict.fromkeys(netdevs, (None, None))
    assert [line for line in topo.err if line.strip()] == [
        "node-agent topo: LLDP not listened for: that needs CAP_NET_RAW (run topo as root); "
        "the leaf column shows -\n"
    ]
    assert took < WAIT_S / 3


@pytest.fixture
def lldpd_nic(tmp_path: Path) -> Iterator[tuple[Path, str, str]]:
    """(node file, its one NIC's netdev, the peer's MAC: lldpd's port ID) with Debian's
    lldpd at the veth's far end, sending every second as the switch `leaf-lldpd`."""
    with lldpd_switch("tpd", "natopo-lldpd", PEER) as (host, mac, _):
        yield write_node(tmp_path, [host]), host, mac


def test_topo_hears_a_real_lldpd_within_the_default_wait(
    lldpd_nic: tuple[Path, str, str],
) -> None:
    node, host, mac = lldpd_nic
    report, took = Topo(node).report()  # the default --lldp-wait, 31 s
    assert leaves(report) == {host: ("leaf-lldpd", mac)}
    assert took < WAIT_S / 2  # lldpd sends every second
