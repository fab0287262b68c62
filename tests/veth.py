"""A veth pair with its peer in a network namespace of its own, for tests that drive a
NIC's link through the kernel (root and iproute2), and the bundled node with a NIC on it."""

from __future__ import annotations

import os
import subprocess
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

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


def node_on_netdev(work: Path, netdev: str) -> tuple[Path, dict[str, Any]]:
    """The bundled 8-GPU, 8-NIC node with its first NIC on `netdev`, written to `work`."""
    node = yaml.safe_load(bundled_node("h100-8gpu-8nic").read_text())
    node["nics"][0]["netdev"] = netdev
    node_file = work / "node.yaml"
    node_file.write_text(yaml.safe_dump(node, sort_keys=False))
    return node_file, node
