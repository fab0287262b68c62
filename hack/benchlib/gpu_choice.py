"""The agent's GPU choices as single calls over plain tables, checked for sense: the
oracle that the unit tests and the benchmarks compare the agent's answers with."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from agents.core.gpu_choice import choose, gpu_pair_costs, replica_order, spread_over
from agents.core.topology import Distance

PcieDistances = Callable[[str, str], Distance] | Mapping[frozenset[str], Distance]


def choose_gpus(
    available: Sequence[str],
    must_include: Sequence[str],
    size: int,
    *,
    nvlinks: Mapping[frozenset[str], int],
    pcie: PcieDistances,
) -> list[str]:
    """The `size` GPUs, `must_include` among them, with the most NVLinks between
    pairs, then the smallest sum of PCIe distances, then the smallest sorted IDs.

    Missing NVLink pairs count as 0 links, missing PCIe pairs as SYS.
    """
    check_request(available, must_include, size)
    return choose(available, must_include, size, gpu_pair_costs(available, nvlinks, _lookup(pcie)))


def spread_replicas(
    available_replicas: Sequence[str],
    must_include: Sequence[str],
    size: int,
    *,
    gpu_of: Callable[[str], str],
    in_use: Mapping[str, int],
    packed: bool = False,
) -> list[str]:
    """`size` replicas, `must_include` among them, each next one on a GPU this
    request does not use yet where possible, then on the least loaded GPU; of one
    GPU, the lowest replica number first (`packed`: see `spread_over`).

    `in_use` counts the replicas of each GPU held by other containers.
    """
    check_request(available_replicas, must_include, size)
    free_by_gpu: dict[str, list[str]] = {}
    for replica in sorted(set(available_replicas) - set(must_include), key=replica_order):
        free_by_gpu.setdefault(gpu_of(replica), []).append(replica)
    return spread_over(free_by_gpu, must_include, size, gpu_of=gpu_of, in_use=in_use, packed=packed)


def check_request(available: Sequence[str], must_include: Sequence[str], size: int) -> None:
    if len(set(available)) != len(available):
        raise ValueError("available device IDs repeat")
    if len(set(must_include)) != len(must_include):
        raise ValueError("must-include device IDs repeat")
    missing = set(must_include) - set(available)
    if missing:
        raise ValueError(f"must-include devices not available: {sorted(missing)}")
    if not len(must_include) <= size <= len(available):
        raise ValueError(
            f"cannot choose {size} of {len(available)} devices with {len(must_include)} required"
        )


def _lookup(pcie: PcieDistances) -> Callable[[str, str], Distance]:
    if callable(pcie):
        return pcie
    table = pcie

    def lookup(a: str, b: str) -> Distance:
        return table.get(frozenset((a, b)), Distance.SYS)

    return lookup
