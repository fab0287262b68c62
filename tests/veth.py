"""A veth pair with its peer in a network namespace of its own, for tests that drive a
NIC's link through the kernel (root and iproute2), Debian's lldpd on such a peer as a
switch, and the bundled node with a NIC on it."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import yaml

from agents.sim.bundled import bundled_node


def ip(*args: str, check: bool = True) -> None:
    subprocess.run(["ip", *args], check=check, capture_output=True)


@contextmanager
def veth_pair(prefix: str, netns_prefix: str, peer: str) -> Iterator[tuple[str, str]]:
    """(host-side name, netns): one end here, named `prefix` and a tag, its peer `peer`
    in a fresh netns; both removed after (the host end may be gone already)."""
    tag = uuid.uuid4().hex[:8]
    host, netns = f"{prefix}{tag}", f"{netns_prefix}-{os.getpid()}-{tag}"
    ip("netns", "add", netns)
    try:
        ip("link", "add", host, "type", "veth", "peer", "name", peer, "netns", netns)
        ip("link", "set", host, "up")
        ip("-n", netns, "link", "set", peer, "up")
        yield host, netns
    finally:
        ip("link", "del", host, check=False)
        ip("netns", "del", netns, check=False)


def lldpd_binary() -> str:
    """Debian's lldpd; a failure in CI, where .ci/run installs it, a skip elsewhere."""
    found = shutil.which("lldpd") or shutil.which("lldpd", path="/usr/sbin")
    if found is None:
        why = "lldpd is not installed (Debian package lldpd; .ci/run installs it)"
        if os.environ.get("CI") == "true":
            pytest.fail(why)
        pytest.skip(why)
    return found


@contextmanager
def lldpd_switch(
    prefix: str, netns_prefix: str, peer: str
) -> Iterator[tuple[str, str, subprocess.Popen[bytes]]]:
    """(host netdev, the peer's MAC: lldpd's port ID, lldpd) with lldpd on a veth peer,
    sending every second as the switch `leaf-lldpd`; stopped and removed after."""
    lldpd = lldpd_binary()
    with (
        veth_pair(prefix, netns_prefix, peer) as (host, netns),
        tempfile.TemporaryDirectory(prefix="lldpd-") as work,
    ):
        os.chmod(work, 0o755)  # lldpd configures itself by lldpcli, as its own user
        conf = Path(work) / "lldpd.conf"
        conf.write_text("configure system hostname leaf-lldpd\nconfigure lldp tx-interval 1\n")
        out = subprocess.run(
            ["ip", "-j", "-n", netns, "link", "show", peer], capture_output=True, check=True
        )
        mac = json.loads(out.stdout)[0]["address"]
        # -d: foreground; -I: this port only; its own control socket and pid file, so that
        # several can run at once; -O: our configuration instead of /etc/lldpd.d.
        command = [lldpd, "-d", "-I", peer, "-u", f"{work}/ctl", "-p", f"{work}/pid"]
        process = subprocess.Popen(["ip", "netns", "exec", netns, *command, "-O", str(conf)])
        try:
            yield host, mac, process
        finally:
            process.kill()
            process.wait(10)


def node_on_netdev(work: Path, netdev: str) -> tuple[Path, dict[str, Any]]:
    """The bundled 8-GPU, 8-NIC node with its first NIC on `netdev`, written to `work`."""
    node = yaml.safe_load(bundled_node("h100-8gpu-8nic").read_text())
    node["nics"][0]["netdev"] = netdev
    node_file = work / "node.yaml"
    node_file.write_text(yaml.safe_dump(node, sort_keys=False))
    return node_file, node
