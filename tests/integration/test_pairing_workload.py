"""GPU<->NIC pairing under a random workload: the agent, the kubelet stand-in admitting and
deleting pods with its checkpoint rewritten on every ListAndWatch update, a foreign plugin
flapping health every 50 ms, and every GPU+NIC container checked against brute force.

The figure is over every GPU+NIC container for which a fully paired choice existed among
the devices really free at its admission. `hack/pairing_rates` runs 60 seeds of
400 operations per case; here a few seeds keep the suite fast and still able to fail.
"""

from __future__ import annotations

import pytest

from hack.benchlib.pairing import Run, Setup, pairing_run

OPERATIONS = 400
SEEDS = (101, 202)
NODES = ["h100-8gpu-8nic", "h100-8gpu-4nic"]


def _report(label: str, runs: list[Run]) -> tuple[int, int, list[str]]:
    paired = sum(r.tally.paired_any for r in runs)
    pairable = sum(r.tally.pairable_any for r in runs)
    misses = [m for r in runs for m in r.misses]
    print(f"\n  {label}: {paired}/{pairable}; " + runs[0].line("first seed"))
    return paired, pairable, misses


@pytest.mark.parametrize("node", NODES)
async def test_every_gpu_nic_container_is_fully_paired_where_a_paired_choice_was_free(
    node: str,
) -> None:
    runs = [await pairing_run(Setup(node, seed, OPERATIONS)) for seed in SEEDS]
    paired, pairable, misses = _report(f"{node} with pod-resources", runs)
    assert all(r.flips >= 5 for r in runs), "the foreign plugin must flap during the run"
    assert pairable >= 100, "the workload must exercise pairing"
    assert misses == [], f"{len(misses)} containers not fully paired: {misses[:5]}"
    assert paired == pairable


@pytest.mark.parametrize("node", NODES)
async def test_pairing_survives_kill_9_of_the_agent_half_way(node: str) -> None:
    run = await pairing_run(Setup(node, SEEDS[0], OPERATIONS, kill_at=OPERATIONS // 2))
    _, pairable, misses = _report(f"{node} killed -9 at {OPERATIONS // 2}", [run])
    assert pairable >= 50
    assert misses == [], f"{len(misses)} containers not fully paired: {misses[:5]}"


@pytest.mark.parametrize("node", NODES)
async def test_without_pod_resources_pairing_still_works_from_the_checkpoint(node: str) -> None:
    """Pod ends are learned late without pod-resources: the rate is reported, and pairing
    must still beat no pairing at all."""
    without = await pairing_run(Setup(node, SEEDS[0], OPERATIONS, pod_resources=False))
    off = await pairing_run(Setup(node, SEEDS[0], OPERATIONS, pairing=False))
    print(f"\n  {without.line('without pod-resources')}\n  {off.line('pairing off')}")
    assert without.tally.pairable_any >= 50
    assert without.rate > off.rate
    assert without.rate >= 0.9
