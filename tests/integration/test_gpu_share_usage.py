"""Each pod's GPU memory beside its share through a real agent in DRA mode: a share
prepared through the kubelet's DRA calls, the simulated GPU's running processes, a /proc
of their cgroups under the simulated root, the claim's reservedFor in the API-server
stand-in; the series scraped over HTTP, one GPUShareExceeded Event per episode, a pod
that joins the claim later, and the series gone (not 0) while NVML fails."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import urllib.request
from pathlib import Path
from typing import Any

import yaml

from agents.sim.mps_control import PID_FILE
from tests.conditions import PROCESS_WAIT as WAIT
from tests.integration.conftest import AgentProcess
from tests.integration.dra_node import GPU, DraNode, dra_node, ref
from tests.writers import write_atomic

__all__ = ["dra_node"]

SHARE = "5d4bb0f6-2a37-4c41-9a36-0c5b7c1d2e0a"
POD_A = "3f2a1b4c-5d6e-4f70-8a9b-0c1d2e3f4a5b"
POD_B = "9e8d7c6b-5a49-4837-a261-504f3e2d1c0b"
CONTAINER = "ab" * 32
GIB = 2**30
USED = "node_agent_gpu_share_memory_used_bytes"
LIMIT = "node_agent_gpu_share_memory_limit_bytes"
SAMPLE = re.compile(r"^(\w+)\{(.*)\} (\S+)$")
LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def scrape(port: int) -> Samples:
    """Blocking: the share samples of the agent's /metrics, by name and labels."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=WAIT) as reply:
        text = reply.read().decode()
    out: Samples = {}
    for line in text.splitlines():
        m = SAMPLE.match(line)
        if m is not None and m.group(1) in (USED, LIMIT):
            out[m.group(1), frozenset(LABEL.findall(m.group(2)))] = float(m.group(3))
    return out


def labels(uuid: str, pod: str) -> frozenset[tuple[str, str]]:
    keys = {"resource": "nvidia.com/gpu", "device": uuid, "namespace": "ns", "pod": pod}
    return frozenset({**keys, "claim": "c-a"}.items())


def processes(node_file: Path, listed: list[tuple[int, int]], **gpu: Any) -> None:
    """GPU 0 runs these (pid, MiB), with `gpu`'s other keys (e.g. an NVML fault)."""
    doc = yaml.safe_load(node_file.read_text())
    doc["gpus"][0]["processes"] = [{"pid": p, "usedMemoryMiB": m} for p, m in listed]
    doc["gpus"][0].pop("nvml", None)
    doc["gpus"][0].update(gpu)
    write_atomic(node_file, yaml.safe_dump(doc, sort_keys=False))


def first_uuid(node_file: Path) -> str:
    return str(yaml.safe_load(node_file.read_text())["gpus"][0]["uuid"])


def in_pod(proc: Path, pid: int, cgroup: str) -> None:
    (proc / str(pid)).mkdir(parents=True, exist_ok=True)
    (proc / str(pid) / "cgroup").write_text(cgroup)


def reserve(node: DraNode, *pods: tuple[str, str]) -> None:
    claim = node.server.store.claims["ns", "c-a"]
    claim["status"]["reservedFor"] = [
        {"resource": "pods", "name": name, "uid": uid} for name, uid in pods
    ]


def exceeded(node: DraNode) -> list[dict[str, Any]]:
    return [e for e in node.server.store.events.values() if e["reason"] == "GPUShareExceeded"]


async def started(node: DraNode, node_file: Path, tmp_path: Path) -> tuple[AgentProcess, int]:
    config = tmp_path / "config.yaml"
    config.write_text("version: v1\nsharing:\n  shares: {enforce: none}\n")
    sim_root = tmp_path / "sim"
    agent = await node.start(
        node_file,
        "--config",
        str(config),
        "--simulate-root",
        str(sim_root),
        "--metrics-address",
        "127.0.0.1:0",
    )
    await node.wait(lambda: "metrics_serving" in agent.stderr)
    [address] = re.findall(r"metrics_serving\W+address\W+127\.0\.0\.1:(\d+)", agent.stderr)
    return agent, int(address)


async def samples_until(port: int, condition: Any, what: str) -> Samples:
    """Scrapes until condition(samples) holds (polled, as async_wait_until does)."""
    deadline = asyncio.get_running_loop().time() + WAIT
    while not condition(got := await asyncio.to_thread(scrape, port)):
        assert asyncio.get_running_loop().time() < deadline, f"{what}: {got}"
        await asyncio.sleep(0.05)
    return got


async def test_a_pods_memory_on_its_share_is_scraped_and_one_event_told_per_episode(
    dra_node: DraNode, node_file: Path, tmp_path: Path
) -> None:
    uuid = first_uuid(node_file)
    agent, port = await started(dra_node, node_file, tmp_path)
    proc = tmp_path / "sim" / "node-agent-sim" / "proc"
    systemd = f"kubepods-burstable-pod{POD_A.replace('-', '_')}.slice"
    in_pod(
        proc,
        4242,
        f"0::/kubepods.slice/kubepods-burstable.slice/{systemd}/cri-containerd-{CONTAINER}.scope\n",
    )
    in_pod(proc, 4243, "0::/system.slice/sshd.service\n")  # on the GPU, in no pod
    in_pod(proc, 4244, f"12:memory:/kubepods/besteffort/pod{POD_B}/{CONTAINER}\n")
    dra_node.claim("a", [("gpu", GPU, "gpu-0")], shareID=SHARE, consumedCapacity={"memory": "20Gi"})
    reserve(dra_node, ("pa", POD_A))
    answer = (await dra_node.kubelet.prepare(GPU, [ref("a")])).claims["a"]
    assert str(answer.error) == ""
    processes(node_file, [(4242, 10 * 1024), (4243, 30 * 1024)])

    a = labels(uuid, "pa")
    got = await samples_until(port, lambda s: s.get((USED, a)) == 10 * GIB, "10 GiB of pa")
    assert got == {(USED, a): 10 * GIB, (LIMIT, a): 20 * GIB}

    processes(node_file, [(4242, 25 * 1024), (4243, 30 * 1024)])  # over its 20 GiB
    await dra_node.wait(lambda: exceeded(dra_node), WAIT)
    [event] = exceeded(dra_node)
    assert event["involvedObject"] == {
        "apiVersion": "v1",
        "kind": "Pod",
        "namespace": "ns",
        "name": "pa",
        "uid": POD_A,
    }
    assert event["type"] == "Warning"
    assert f"uses 25.0 GiB of GPU {uuid}, over the 20.0 GiB its claim c-a" in event["message"]
    processes(node_file, [(4242, 26 * 1024)])  # still over: the same episode
    await samples_until(port, lambda s: s.get((USED, a)) == 26 * GIB, "26 GiB")
    processes(node_file, [(4242, 5 * 1024)])  # back within: the episode ends
    await samples_until(port, lambda s: s.get((USED, a)) == 5 * GIB, "5 GiB")
    assert len(exceeded(dra_node)) == 1
    processes(node_file, [(4242, 21 * 1024)])  # a new episode
    await dra_node.wait(lambda: len(exceeded(dra_node)) == 2, WAIT)

    # A pod that joins the claim later: its process on the GPU has the claim read again.
    reserve(dra_node, ("pa", POD_A), ("pb", POD_B))
    processes(node_file, [(4242, 1024), (4244, 3 * 1024)])
    b = labels(uuid, "pb")
    got = await samples_until(port, lambda s: s.get((USED, b)) == 3 * GIB, "3 GiB of pb")
    assert got[(LIMIT, b)] == 20 * GIB
    assert got[(USED, a)] == GIB

    # NVML fails for the GPU: the memory in use is not known, so no series (not 0).
    processes(node_file, [(4242, 1024)], nvml={"error": "Unknown"})
    got = await samples_until(port, lambda s: (USED, a) not in s, "no series while NVML fails")
    assert got == {(LIMIT, a): 20 * GIB, (LIMIT, b): 20 * GIB}
    assert agent.stderr.count("gpu_processes_unreadable") == 1
    processes(node_file, [(4242, 2 * 1024)])
    await samples_until(port, lambda s: s.get((USED, a)) == 2 * GIB, "back once NVML answers")
    assert len(exceeded(dra_node)) == 2


def process(proc: Path, pid: int, uid: int, cgroup: str, environ: dict[str, str]) -> None:
    in_pod(proc, pid, cgroup)
    (proc / str(pid) / "status").write_text(f"Name:\tp\nUid:\t{uid}\t{uid}\t{uid}\t{uid}\n")
    (proc / str(pid) / "environ").write_bytes(
        b"".join(f"{k}={v}".encode() + b"\0" for k, v in environ.items())
    )


def mps_config(node_file: Path, tmp_path: Path) -> Path:
    node_file.write_text(node_file.read_text() + "mps: {available: true}\n")
    config = tmp_path / "config.yaml"
    config.write_text("version: v1\nsharing:\n  shares: {enforce: mps}\n")
    return config


async def test_a_pod_of_another_user_than_the_mps_servers_is_told_whom_it_waits_behind(
    dra_node: DraNode, node_file: Path, tmp_path: Path
) -> None:
    config = mps_config(node_file, tmp_path)
    sim = tmp_path / "sim"
    args = ("--config", str(config), "--simulate-root", str(sim))
    agent = await dra_node.start(node_file, *args)
    proc = sim / "node-agent-sim" / "proc"
    client = {"CUDA_MPS_PIPE_DIRECTORY": "/mps/gpu.nvidia.com/pipe", "HOME": "/"}
    in_pod(proc, 5000, "0::/system.slice/node-agents-mps\n")  # the MPS server
    (proc / "5000" / "status").write_text("Name:\tnvidia-cuda-mps-server\nUid:\t1000\t1000\n")
    process(proc, 4242, 1000, f"0::/kubepods/burstable/pod{POD_A}/{CONTAINER}\n", client)
    process(proc, 4244, 2000, f"0::/kubepods/burstable/pod{POD_B}/{CONTAINER}\n", client)
    process(proc, 4245, 65535, f"0::/kubepods/burstable/pod{POD_B}/{'cd' * 32}\n", {})
    [pipe] = sim.rglob("gpu.nvidia.com/pipe")
    try:
        (pipe / "servers").write_text("5000\n")
        dra_node.claim(
            "a", [("gpu", GPU, "gpu-0")], shareID=SHARE, consumedCapacity={"memory": "20Gi"}
        )
        reserve(dra_node, ("pa", POD_A), ("pb", POD_B))
        assert str((await dra_node.kubelet.prepare(GPU, [ref("a")])).claims["a"].error) == ""
        processes(node_file, [(4242, 1024)])

        def waits() -> list[dict[str, Any]]:
            found = dra_node.server.store.events.values()
            return [e for e in found if e["reason"] == "GPUShareWaitsForUser"]

        await dra_node.wait(waits, WAIT)
        [event] = waits()
        assert event["involvedObject"]["name"] == "pb"
        assert event["involvedObject"]["uid"] == POD_B
        assert "runs its GPU processes as user 2000" in event["message"]
        assert "MPS server runs for user 1000" in event["message"]
        told = pipe.parent / "log" / "control.log"

        def looks() -> int:
            return told.read_text().count("get_server_list")

        seen = looks()
        await dra_node.wait(lambda: looks() >= seen + 2, WAIT)  # still waiting: told once
        assert len(waits()) == 1
        (pipe / "servers").write_text("")  # the server's clients ended: pb's turn
        seen = looks()
        await dra_node.wait(lambda: looks() >= seen + 2, WAIT)
        (pipe / "servers").write_text("5000\n")  # pa's server again: pb waits anew
        await dra_node.wait(lambda: len(waits()) == 2, WAIT)
        assert {e["involvedObject"]["name"] for e in waits()} == {"pb"}
    finally:  # the test's doing: the simulated host's daemon outlives the agent
        if agent.alive():
            agent.terminate()  # first, or it would start the daemon again
        with contextlib.suppress(OSError, ValueError):
            os.kill(int((pipe / PID_FILE).read_text()), signal.SIGTERM)
