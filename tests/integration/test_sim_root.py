"""--simulate-root: the simulated tree under an operator's directory, which the agent
creates when missing and never removes unless it created it."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from agents.backends import simulated_backends
from agents.errors import ConfigError
from agents.sim.root import KEPT, SUBTREE, sim_root


def test_a_missing_root_is_created_and_removed_with_the_tree(tmp_path: Path) -> None:
    parent = tmp_path / "a" / "sim"
    with sim_root(parent) as root:
        assert root == parent / SUBTREE and root.is_dir()
    assert not parent.exists()
    assert (tmp_path / "a").is_dir()  # only what was asked for goes


def test_an_existing_root_and_what_else_it_holds_stay(tmp_path: Path) -> None:
    (tmp_path / "theirs").write_text("kept")
    with sim_root(tmp_path) as root:
        (root / "sys").mkdir()
    assert sorted(os.listdir(tmp_path)) == ["theirs"]


def test_a_tree_left_by_a_killed_run_is_replaced(tmp_path: Path) -> None:
    stale = tmp_path / SUBTREE / "dev" / "nvidia9"
    stale.parent.mkdir(parents=True)
    stale.touch()
    with sim_root(tmp_path) as root:
        assert os.listdir(root) == []


def test_a_root_that_is_a_file_is_a_config_error(tmp_path: Path) -> None:
    not_a_dir = tmp_path / "file"
    not_a_dir.touch()
    with pytest.raises(ConfigError, match="--simulate-root: a directory"), sim_root(not_a_dir):
        pass
    assert not_a_dir.is_file()


def test_without_a_root_the_tree_is_a_fresh_temporary_directory(tmp_path: Path) -> None:
    with sim_root(None, str(tmp_path)) as first, sim_root(None, str(tmp_path)) as second:
        assert first != second and first.parent == second.parent == tmp_path
    assert os.listdir(tmp_path) == []


async def test_device_nodes_of_the_simulated_node_are_under_the_root(
    node_file: Path, tmp_path: Path
) -> None:
    parent = tmp_path / "sim"
    parent.mkdir()
    async with simulated_backends(node_file, parent) as backends:
        assert backends.dev_root == parent / SUBTREE
        uverbs = parent / SUBTREE / "dev/infiniband/uverbs0"
        assert stat.S_ISCHR(uverbs.lstat().st_mode)
        assert (parent / SUBTREE / "sys/bus/pci/devices").is_dir()
    assert os.listdir(parent) == []


def test_the_simulated_hosts_runtime_state_outlives_the_agent(tmp_path: Path) -> None:
    parent = tmp_path / "sim"
    with sim_root(parent) as root:
        pipe = root / KEPT / "nvidia" / "mps" / "gpu.nvidia.com" / "pipe"
        pipe.mkdir(parents=True)
        (pipe / "control").touch()  # an MPS daemon's socket
        (root / "dev").mkdir()
    assert os.listdir(root) == [KEPT]  # the rest of the tree goes, the daemon's pipes stay
    assert (pipe / "control").exists()
    with sim_root(parent) as again:  # the next agent's start
        assert again == root and os.listdir(again) == [KEPT]
        (pipe / "control").unlink()  # the daemon gone: no file left to keep
    assert os.listdir(parent) == []  # nothing kept: the tree goes (the root, found, stays)
