"""Node files and configs for benchmarks: any number of GPUs and NICs on PCIe switches."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import yaml


def _gpu_uuid(i: int) -> str:
    return f"GPU-{i:08x}-0000-4000-8000-{i:012x}"


def generate_node(
    gpus: int,
    nics: int,
    *,
    mig_gpus: int = 0,
    netdevs: dict[int, str] | None = None,
) -> dict[str, Any]:
    """`gpus` GPUs, one PCIe switch each, NICs spread over the switches round-robin.

    Half the switches hang off NUMA node 0, half off node 1; GPUs are NVLinked within
    groups of 8. The first `mig_gpus` GPUs have MIG enabled with seven 1g.10gb slices.
    `netdevs` renames NIC i's interface (a veth that exists on the host).
    """
    switches = max(gpus, 1)
    numa_of = [0 if s < switches / 2 else 1 for s in range(switches)]
    ports: list[int] = [0] * switches

    def place(switch: int) -> tuple[str, list[str]]:
        base = 0x10 + switch * 12
        port = ports[switch]
        ports[switch] += 1
        upstream = [f"0000:{base:02x}:01.0", f"0000:{base + 1:02x}:00.0"]
        upstream.append(f"0000:{base + 2:02x}:{port:02x}.0")
        return f"0000:{base + 3 + port:02x}:00.0", upstream

    gpu_docs: list[dict[str, Any]] = []
    for i in range(gpus):
        pci, upstream = place(i)
        group = range(i - i % 8, min(i - i % 8 + 8, gpus))
        doc: dict[str, Any] = {
            "uuid": _gpu_uuid(i),
            "pci": pci,
            "upstream": upstream,
            "numa": numa_of[i],
            "model": "NVIDIA H100 80GB HBM3",
            "memoryMiB": 81559,
            "minor": i,
            "nvlinks": [_gpu_uuid(j) for j in group if j != i],
            "xids": [],
            "lost": False,
        }
        if i < mig_gpus:
            doc["mig"] = {
                "enabled": True,
                "instances": [
                    {"uuid": f"MIG-{i:08x}-{k:04x}-4000-8000-{k:012x}", "profile": "1g.10gb"}
                    for k in range(7)
                ],
            }
        gpu_docs.append(doc)
    nic_docs: list[dict[str, Any]] = []
    for n in range(nics):
        pci, upstream = place(n % switches)
        nic_docs.append(
            {
                "pci": pci,
                "upstream": upstream,
                "numa": numa_of[n % switches],
                "netdev": (netdevs or {}).get(n, f"bench{n}np0"),
                "rdma": f"mlx5_{n}",
                "vendor": "15b3",
                "linkLayer": "Ethernet",
                "link": "up",
            }
        )
    return {"numaNodes": 2, "gpus": gpu_docs, "nics": nic_docs}


def write_yaml(path: Path, doc: dict[str, Any]) -> Path:
    """Write atomically (a rename), as a person editing the node file with a tool would."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(yaml.safe_dump(doc, sort_keys=False))
    tmp.replace(path)
    return path


def sharing_config(replicas: int, *, mig_strategy: str = "none") -> dict[str, Any]:
    """A config with every whole GPU time-shared `replicas` ways."""
    return {
        "version": "v1",
        "flags": {"migStrategy": mig_strategy},
        "sharing": {
            "timeSlicing": {"resources": [{"name": "nvidia.com/gpu", "replicas": replicas}]}
        },
    }


def irregular_node(rng: random.Random, gpus: int, nics: int) -> dict[str, Any]:
    """`gpus` GPUs and `nics` NICs hung at random on an uneven PCIe tree: two NUMA nodes
    of two host bridges, root ports with switches nested zero to three deep, so that
    devices are at every distance from each other; a random NVLink mesh of random width.
    """
    tree = _Tree(rng)
    gpu_docs: list[dict[str, Any]] = []
    for i in range(gpus):
        pci, upstream, numa = tree.place()
        peers = [j for j in range(gpus) if j != i and rng.random() < 0.3]
        gpu_docs.append(
            {
                "uuid": _gpu_uuid(i),
                "pci": pci,
                "upstream": upstream,
                "numa": numa,
                "model": "NVIDIA H100 80GB HBM3",
                "memoryMiB": 81559,
                "minor": i,
                "nvlinks": [],
                "xids": [],
                "lost": False,
            }
        )
        gpu_docs[i]["_peers"] = peers
    for i, doc in enumerate(gpu_docs):
        # Links are symmetric: the pair's count, listed by both ends.
        for j in doc.pop("_peers"):
            if j > i:
                links = rng.randint(1, 4)
                doc["nvlinks"] += [_gpu_uuid(j)] * links
                gpu_docs[j]["nvlinks"] += [_gpu_uuid(i)] * links
    nic_docs: list[dict[str, Any]] = []
    for n in range(nics):
        pci, upstream, numa = tree.place()
        nic_docs.append(
            {
                "pci": pci,
                "upstream": upstream,
                "numa": numa,
                "netdev": f"bench{n}np0",
                "rdma": f"mlx5_{n}",
                "vendor": "15b3",
                "linkLayer": "Ethernet",
                "link": "up",
            }
        )
    return {"numaNodes": 2, "gpus": gpu_docs, "nics": nic_docs}


class _Tree:
    """Bridges made up on demand: a device lands below a random chain of them, reusing
    the chains already made about half the time, so devices share switches unevenly."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.next_bus = 0x10
        self.chains: list[list[str]] = []
        self.root_ports = [0] * 4

    def _bus(self) -> int:
        self.next_bus += 1
        return self.next_bus - 1

    def place(self) -> tuple[str, list[str], int]:
        rng = self.rng
        host = rng.randrange(4)  # host bridges 0, 1 on NUMA node 0; 2, 3 on node 1
        mine = [c for c in self.chains if int(c[0][5:7], 16) == host]
        if mine and rng.random() < 0.6:
            chain = list(rng.choice(mine))
            chain = chain[: rng.randint(1, len(chain))]
        else:
            self.root_ports[host] += 1
            chain = [f"0000:{host:02x}:{self.root_ports[host]:02x}.0"]
        for _ in range(rng.choice((0, 0, 1, 2, 3)) if len(chain) == 1 else rng.randrange(2)):
            chain.append(f"0000:{self._bus():02x}:00.0")
        self.chains.append(chain)
        return f"0000:{self._bus():02x}:00.0", chain, host // 2
