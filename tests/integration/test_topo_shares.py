"""`node-agent topo` showing each GPU's shares: claims prepared by a real agent in DRA
mode (through the kubelet's DRA calls), read back from the GPU driver's checkpoint by the
real `node-agent topo`, with once for the node whether MPS enforces their limits; a GPU
older than Volta, and a garbled checkpoint, said in one line."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

from tests.integration.dra_node import GPU, DraNode, dra_node
from tests.integration.test_dra_shares import SHARE_A, SHARE_B, prepared, share, started

__all__ = ["dra_node"]

BY_MPS = "by MPS, per client process, where a daemon serves /run/nvidia/mps/gpu.nvidia.com/pipe"


def topo(node_file: Path, config: Path, plugins: Path, *args: str) -> str:
    """`node-agent topo` on the simulated node with the agent's config and plugins
    directory: its stdout; it must exit 0."""
    done = subprocess.run(
        [
            *(sys.executable, "-m", "agents.cli", "topo", "--simulate", str(node_file)),
            *("--config", str(config), "--kubelet-plugins-dir", str(plugins)),
            *("--lldp-wait", "0", *args),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def section(out: str) -> list[str]:
    """The lines of the Shares section, its heading included."""
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("Shares"))
    end = lines.index("", start)
    return lines[start:end]


async def test_topo_shows_two_claims_shares_of_one_gpu_and_that_mps_limits_them(
    dra_node: DraNode, node_file: Path, tmp_path: Path
) -> None:
    await started(dra_node, node_file, tmp_path, "mps")
    share(dra_node, "a", SHARE_A)
    share(dra_node, "b", SHARE_B)
    dra_node.claim("whole", [("gpu", GPU, "gpu-1")])
    for uid in ("a", "b", "whole"):
        assert (await prepared(dra_node, uid))[0] == ""
    config = tmp_path / "config.yaml"

    out = topo(node_file, config, dra_node.plugins)
    assert section(out) == [
        f"Shares (prepared claims: {dra_node.plugins}/{GPU}/checkpoint.json)",
        "  GPU0     2 shares, memory 40960 of 81559 MiB, compute 50 %",
        "    ns/c-a                   memory 20Gi    compute 25 %  MPS limits",
        "    ns/c-b                   memory 20Gi    compute 25 %  MPS limits",
        "  GPU1     whole GPU, claim ns/c-whole",
        f"  limits: {BY_MPS}",
    ]
    shares = json.loads(topo(node_file, config, dra_node.plugins, "--json"))["shares"]
    assert shares["enforced"] is True
    assert shares["gpus"]["GPU0"][0] == {
        "claim": "ns/c-a",
        "memory": "20Gi",
        "compute": "25",
        "limited": True,
        "whole": False,
    }
    assert shares["used"]["GPU0"] == {"memoryMiB": 40960, "compute": 50}


async def test_topo_says_once_that_the_shares_of_enforce_none_are_not_limited(
    dra_node: DraNode, node_file: Path, tmp_path: Path
) -> None:
    await started(dra_node, node_file, tmp_path, "none")
    share(dra_node, "a", SHARE_A)
    assert (await prepared(dra_node, "a"))[0] == ""

    out = topo(node_file, tmp_path / "config.yaml", dra_node.plugins)
    assert section(out)[1:] == [
        "  GPU0     1 share, memory 20480 of 81559 MiB, compute 25 %",
        "    ns/c-a                   memory 20Gi    compute 25 %  no MPS limits",
        "  limits: not enforced: enforce: none",
    ]
    assert out.count("not enforced") == 1


def shares_config(tmp_path: Path, shares: bool = True) -> Path:
    config = tmp_path / "config.yaml"
    config.write_text("version: v1\n" + ("sharing:\n  shares: {}\n" if shares else ""))
    return config


def test_topo_names_the_gpus_older_than_volta_whose_shares_mps_cannot_limit(
    node_file: Path, tmp_path: Path
) -> None:
    doc: dict[str, Any] = yaml.safe_load(node_file.read_text())
    doc["mps"] = {"available": True}
    for gpu in doc["gpus"][:2]:
        gpu["computeCapability"] = "6.1"  # Pascal
    node_file.write_text(yaml.safe_dump(doc))
    config, plugins = shares_config(tmp_path), tmp_path / "plugins"

    lines = section(topo(node_file, config, plugins))
    assert lines[1:] == [
        "  no checkpoint there: no claim prepared yet (or another --kubelet-plugins-dir)",
        f"  limits: {BY_MPS}; not on GPU0, GPU1 (older than Volta)",
    ]
    for gpu in doc["gpus"]:
        gpu["computeCapability"] = "6.0"
    node_file.write_text(yaml.safe_dump(doc))
    shares = json.loads(topo(node_file, config, plugins, "--json"))["shares"]
    assert shares["enforced"] is False
    old = ", ".join(f"GPU{i} (6.0)" for i in range(8))
    assert shares["limits"] == f"not enforced: compute capability older than Volta (7.0): {old}"


def test_a_garbled_checkpoint_is_said_in_one_line_and_left_as_it_is(
    node_file: Path, tmp_path: Path
) -> None:
    plugins = tmp_path / "plugins"
    path = plugins / GPU / "checkpoint.json"
    path.parent.mkdir(parents=True)
    path.write_text("{not json")

    lines = section(topo(node_file, shares_config(tmp_path, shares=False), plugins))
    assert len(lines) == 3
    assert lines[1].startswith(f"  {path} cannot be read (not JSON: ")
    assert lines[1].endswith("): prepared claims unknown")
    assert lines[2] == "  limits: as each share says (no sharing.shares in the config topo read)"
    assert path.read_text() == "{not json"  # topo changes nothing


def test_without_shares_and_a_checkpoint_topo_says_nothing_of_shares(
    node_file: Path, tmp_path: Path
) -> None:
    config = shares_config(tmp_path, shares=False)
    out = topo(node_file, config, tmp_path / "plugins")
    assert "Shares" not in out
    assert json.loads(topo(node_file, config, tmp_path / "plugins", "--json"))["shares"] is None


async def test_topo_says_shares_are_unavailable_while_the_api_server_drops_them(
    dra_node: DraNode, node_file: Path, tmp_path: Path
) -> None:
    dra_node.server.store.consumable_capacity = False
    agent = await started(dra_node, node_file, tmp_path, "none")
    note = dra_node.plugins / GPU / "shares-unavailable"
    await dra_node.wait(note.exists)
    config = tmp_path / "config.yaml"

    lines = section(topo(node_file, config, dra_node.plugins))
    assert lines[-1] == (
        "  unavailable: the API server dropped allowMultipleAllocations (DRAConsumableCapacity"
        " off): a GPU goes to one claim at a time"
    )
    assert agent.terminate() == 0
    dra_node.server.store.consumable_capacity = True  # the gate on, the agent restarted
    await dra_node.start(node_file, "--config", str(config))
    await dra_node.wait(lambda: not note.exists())
    assert "unavailable" not in topo(node_file, config, dra_node.plugins)
