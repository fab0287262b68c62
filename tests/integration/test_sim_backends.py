"""simulated_backends: the host netlink socket it opens and the tree it builds go with it."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from agents.backends import MEMORY_TMP, simulated_backends
from agents.config import Config
from agents.daemon import Agent
from agents.errors import ConfigError
from agents.families import parse_families
from agents.plugin.api import DevicePlugins
from tests.conditions import WAIT, async_wait_until

NETLINK_ROUTE = 0
RTMGRP_LINK = 0x1


def _link_watch_sockets() -> set[int]:
    """Inodes of the rtnetlink sockets subscribed to link changes that this process holds."""
    held = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue  # the fd listing itself, closed meanwhile
        if target.startswith("socket:["):
            held.add(int(target[len("socket:[") : -1]))
    watching = set()
    # sk Eth Pid Groups Rmem Wmem Dump Locks Drops Inode
    for line in Path("/proc/net/netlink").read_text().splitlines()[1:]:
        fields = line.split()
        protocol, groups, inode = int(fields[1]), int(fields[3], 16), int(fields[9])
        if protocol == NETLINK_ROUTE and groups & RTMGRP_LINK and inode in held:
            watching.add(inode)
    return watching


async def test_a_gpu_only_agent_leaves_no_host_link_socket_open(
    node_file: Path, plugin_dir: Path
) -> None:
    before = _link_watch_sockets()
    stop = asyncio.Event()
    async with simulated_backends(node_file) as backends:
        assert len(_link_watch_sockets() - before) == 1  # the host's link monitor
        agent = Agent(
            Config.default(), "<test>", DevicePlugins(plugin_dir), backends, parse_families("gpu")
        )
        await agent.start()
        task = asyncio.ensure_future(agent.run(stop))
        try:
            await async_wait_until(agent.serving, WAIT, "GPU plugin serving")
        finally:
            stop.set()
            await asyncio.wait_for(task, WAIT)
    assert _link_watch_sockets() == before


async def test_backends_never_used_leave_no_host_link_socket_open(node_file: Path) -> None:
    before = _link_watch_sockets()
    async with simulated_backends(node_file):
        pass
    assert _link_watch_sockets() == before


async def test_a_node_file_that_fails_to_load_leaves_no_host_link_socket_open(
    tmp_path: Path,
) -> None:
    broken = tmp_path / "node.yaml"
    broken.write_text("gpus: [{uuid: 7}]\n")
    before = _link_watch_sockets()
    with pytest.raises(ConfigError):
        async with simulated_backends(broken):
            pass
    assert _link_watch_sockets() == before


@pytest.mark.skipif(
    not os.access(MEMORY_TMP, os.W_OK | os.X_OK), reason=f"{MEMORY_TMP} is not writable here"
)
async def test_the_simulated_tree_lives_in_memory_and_goes_with_the_context(
    node_file: Path,
) -> None:
    async with simulated_backends(node_file) as backends:
        root = backends.dev_root
        assert root is not None and root.parent == MEMORY_TMP
        assert (root / "sys/bus/pci/devices").is_dir()
    assert not root.exists()
