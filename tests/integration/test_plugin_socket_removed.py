"""A socket of ours deleted while kubelet.sock stays (the kubelet cleaned its directory):
the resource is served on a fresh socket and registered again, the others untouched."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from agents.standin.kubelet import Kubelet
from tests.conditions import WAIT
from tests.integration.test_agent_lifecycle import (
    GPU,
    NIC,
    everything_listed,
    listed,
    running,
)
from tests.integration.test_agent_resilience import events, logs


def _identity(path: Path) -> tuple[int, int]:
    """Which file is at `path` (an inode number alone may be reused)."""
    st = os.stat(path)
    return st.st_ino, st.st_ctime_ns


async def test_one_deleted_socket_is_served_afresh_and_only_its_resource_registers_again(
    node_file: Path, plugin_dir: Path, kubelet: Kubelet
) -> None:
    with logs() as captured:
        async with running(node_file, plugin_dir):
            await kubelet.wait_until(everything_listed, WAIT)
            before = len(kubelet.registrations)
            gpu, nic = kubelet.endpoint(GPU), kubelet.endpoint(NIC)
            assert gpu is not None and nic is not None
            kubelet_socket = _identity(plugin_dir / "kubelet.sock")

            gpu.socket.unlink()

            await kubelet.wait_until(
                lambda k: k.endpoint(GPU) is not gpu and listed(GPU, 8)(k), WAIT
            )
            assert [r.resource_name for r in kubelet.registrations[before:]] == [GPU]
            assert all(r.error is None for r in kubelet.registrations)
            mode = os.stat(gpu.socket).st_mode
            assert stat.S_ISSOCK(mode) and stat.S_IMODE(mode) == 0o600
            assert kubelet.endpoint(NIC) is nic and listed(NIC, 8)(kubelet)
            assert _identity(plugin_dir / "kubelet.sock") == kubelet_socket  # it stayed
    assert [e["name"] for e in events(captured, "plugin_socket_removed")] == [GPU]


async def test_every_deleted_socket_is_served_afresh_and_each_resource_registers_once(
    node_file: Path, plugin_dir: Path, kubelet: Kubelet
) -> None:
    async with running(node_file, plugin_dir):
        await kubelet.wait_until(everything_listed, WAIT)
        before = len(kubelet.registrations)
        old = {r: kubelet.endpoint(r) for r in (GPU, NIC)}

        for endpoint in old.values():
            assert endpoint is not None
            endpoint.socket.unlink()

        await kubelet.wait_until(
            lambda k: everything_listed(k) and all(k.endpoint(r) is not e for r, e in old.items()),
            WAIT,
        )
        assert sorted(r.resource_name for r in kubelet.registrations[before:]) == sorted([GPU, NIC])
        assert all(r.error is None for r in kubelet.registrations)
