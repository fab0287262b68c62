"""DRA mode given bad input, as device-plugin mode is: a malformed config or API name
exits 2 naming it; a corrupt claim checkpoint is kept aside and the agent starts with no
claims, saying so once; a claim allocated on another node's pool fails alone."""

from __future__ import annotations

import os
from pathlib import Path

from agents.dra.claim_checkpoint import CHECKPOINT
from tests.conditions import PROCESS_WAIT as WAIT
from tests.integration.dra_node import GPU, NIC, NODE, DraNode, dra_node, ref

__all__ = ["dra_node"]


def last_line(text: str) -> str:
    return text.strip().splitlines()[-1]


async def test_a_malformed_config_exits_2_naming_the_key(
    dra_node: DraNode, node_file: Path, tmp_path: Path
) -> None:
    config = tmp_path / "config.yaml"
    config.write_text("version: v1\nflags:\n  migStrategy: sideways\n")
    agent = dra_node.start_agent(dra_node.args(node_file, "--config", str(config)))
    assert agent.process.wait(WAIT) == 2
    line = last_line(agent.stderr)
    assert line.startswith(f"node-agent: {config}: flags.migStrategy: "), line
    assert not list(dra_node.registry.iterdir())  # nothing was served


async def test_an_unknown_api_exits_2_naming_it(dra_node: DraNode, node_file: Path) -> None:
    args = dra_node.args(node_file)
    args[args.index("dra")] = "bogus"
    agent = dra_node.start_agent(args)
    assert agent.process.wait(WAIT) == 2
    assert "--api" in agent.stderr and "bogus" in agent.stderr

    from_env = dra_node.start_agent(
        [a for a in dra_node.args(node_file) if a not in ("--api", "dra")],
        env={**os.environ, "NODE_AGENT_API": "bogus"},
    )
    assert from_env.process.wait(WAIT) == 2
    assert "NODE_AGENT_API" in from_env.stderr and "bogus" in from_env.stderr


async def test_a_corrupt_checkpoint_is_kept_aside_and_the_agent_starts_with_no_claims(
    dra_node: DraNode, node_file: Path
) -> None:
    checkpoint = dra_node.plugins / GPU / CHECKPOINT
    checkpoint.parent.mkdir(parents=True)
    garbage = b'{"version": 1, "checksum": "sha256:0", "data": {"claims": {"x"'
    checkpoint.write_bytes(garbage)
    agent = await dra_node.start(node_file)

    kept = checkpoint.with_name(CHECKPOINT + ".corrupt")
    assert kept.read_bytes() == garbage
    said = [line for line in agent.stderr.splitlines() if "dra_checkpoint_unusable" in line]
    assert len(said) == 1, said
    assert GPU in said[0] and str(kept) in said[0] and "no prepared claims" in said[0]
    # No claim holds a device: each is free for a new claim.
    dra_node.claim("fresh", [(f"gpu-{i}", GPU, f"gpu-{i}") for i in range(8)])
    answer = await dra_node.kubelet.prepare(GPU, [ref("fresh")])
    assert answer.claims["fresh"].error == ""
    assert checkpoint.exists()  # a good checkpoint again, with that claim
    assert "fresh" in checkpoint.read_text()
    assert agent.alive()


async def test_a_claim_allocated_on_another_nodes_pool_fails_alone(
    dra_node: DraNode, node_file: Path
) -> None:
    await dra_node.start(node_file)
    nic = sorted(dra_node.devices(NIC))[0]
    dra_node.server.store.put_claim(
        "ns",
        "c-elsewhere",
        "elsewhere",
        [
            {"request": "gpu", "driver": GPU, "pool": "dra-node-2", "device": "gpu-0"},
            {"request": "nic", "driver": NIC, "pool": NODE, "device": nic},
        ],
    )
    dra_node.claim("here", [("gpu", GPU, "gpu-0")])
    answer = await dra_node.kubelet.prepare(GPU, [ref("elsewhere"), ref("here")])
    error = answer.claims["elsewhere"].error
    assert "dra-node-2" in error and "gpu-0" in error
    assert answer.claims["here"].error == ""
    assert dra_node.spec(GPU, "elsewhere") is None
    # The NIC driver prepares its own result of that claim: its pool is this node's.
    answer = await dra_node.kubelet.prepare(NIC, [ref("elsewhere")])
    assert answer.claims["elsewhere"].error == ""
