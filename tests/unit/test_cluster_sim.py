"""The pure parts of hack/cluster_sim: layouts, the seeded workload, claim templates, pair
accounting and the device plugins' replay (no API server in CI: the tool itself needs one)."""

from __future__ import annotations

import random
from collections import Counter
from typing import Any

import pytest

from hack.clusterlib.accounting import (
    COUNTS,
    Cluster,
    allocation_of,
    claim_paired,
    devices_paired,
    fits,
    free_pairs,
)
from hack.clusterlib.layouts import GPU_DRIVER, NIC_DRIVER, Layout, Place, layout
from hack.clusterlib.replay import NodeReplay
from hack.clusterlib.workload import (
    ROOT,
    SWITCH,
    Create,
    Delete,
    Shape,
    Workload,
    claim_template,
    pod,
)


def switches(lay: Layout) -> dict[str | None, Counter[str]]:
    by: dict[str | None, Counter[str]] = {}
    for p in lay.places:
        by.setdefault(p.switch, Counter())[p.kind] += 1
    return by


def test_bundled_layout_has_one_gpu_and_one_nic_per_switch() -> None:
    lay = layout("h100")
    assert all(c == Counter(gpu=1, nic=1) for c in switches(lay).values())
    assert len({p.root for p in lay.places}) == 8


def test_shared_root_layout_puts_two_switches_under_each_root_complex() -> None:
    lay = layout("shared-root")
    assert all(c == Counter(gpu=1, nic=1) for c in switches(lay).values())
    per_root = Counter(p.root for p in lay.places if p.kind == "gpu")
    assert sorted(per_root.values()) == [2, 2, 2, 2]
    # Each root complex's two GPUs sit on different switches.
    for root in per_root:
        assert len({p.switch for p in lay.of("gpu") if p.root == root}) == 2


def test_lone_gpu_layout_has_exactly_one_gpu_without_a_nic_on_its_switch() -> None:
    lay = layout("lone-gpu")
    lone = [s for s, c in switches(lay).items() if c["nic"] == 0]
    assert len(lone) == 1 and switches(lay)[lone[0]] == Counter(gpu=1)
    assert len(lay.of("gpu")) == 8 and len(lay.of("nic")) == 7


def test_layout_names_devices_as_dra_and_the_device_plugins_do() -> None:
    lay = layout("h100")
    gpu0 = next(p for p in lay.of("gpu") if p.dra_name == "gpu-0")
    assert gpu0.plugin_id.startswith("GPU-") and gpu0.switch == "0000:15:01.0"
    assert gpu0.root == "pci0000:15"
    nic = lay.by_dra()[(NIC_DRIVER, "nic-0000-19-00-0")]
    assert nic.plugin_id == "0000:19:00.0" and nic.switch == gpu0.switch


def test_workload_is_the_same_for_the_same_seed_and_differs_for_another() -> None:
    def ops(seed: int) -> list[object]:
        w = Workload(seed, 128)
        return [w.next() for _ in range(300)]

    assert ops(7) == ops(7)
    assert ops(7) != ops(8)


def test_workload_deletes_only_live_pods_and_stays_below_the_cluster_size() -> None:
    w = Workload(3, 128)
    live: list[Shape] = []
    kinds: Counter[str] = Counter()
    for _ in range(1000):
        op = w.next()
        if isinstance(op, Delete):
            assert 0 <= op.index < len(live)
            live.pop(op.index)
            kinds["delete"] += 1
        else:
            assert isinstance(op, Create) and op.shape.size in (1, 2, 4)
            live.append(op.shape)
            kinds["pairs" if op.shape.paired else "gpus"] += 1
        assert live == w.live
    assert sum(s.gpus for s in live) < 128
    assert kinds["pairs"] > 2 * kinds["gpus"] > 0 and kinds["delete"] > 0


def test_claim_template_constrains_each_pair_to_one_value_of_the_attribute() -> None:
    spec = claim_template("t", Shape(True, 2), SWITCH, ("g", "n"))["spec"]["spec"]["devices"]
    assert [r["name"] for r in spec["requests"]] == ["gpu-0", "nic-0", "gpu-1", "nic-1"]
    assert spec["constraints"] == [
        {"requests": ["gpu-0", "nic-0"], "matchAttribute": SWITCH},
        {"requests": ["gpu-1", "nic-1"], "matchAttribute": SWITCH},
    ]
    gpus = claim_template("t", Shape(False, 4), ROOT, ("g", "n"))["spec"]["spec"]["devices"]
    assert len(gpus["requests"]) == 4 and "constraints" not in gpus


def test_pod_asks_by_claim_or_by_counts() -> None:
    by_claim = pod("p", Shape(True, 2), "pairs-2-switch")["spec"]
    assert by_claim["resourceClaims"][0]["resourceClaimTemplateName"] == "pairs-2-switch"
    limits = pod("p", Shape(True, 2), None)["spec"]["containers"][0]["resources"]["limits"]
    assert limits == {"nvidia.com/gpu": "2", "rdma/roce": "2"}


def crossed(lay: Layout) -> tuple[Place, Place]:
    """The GPU of one switch and the NIC of the other switch under the same root."""
    g = lay.of("gpu")[0]
    n = next(p for p in lay.of("nic") if p.root == g.root and p.switch != g.switch)
    return g, n


def test_free_pairs_count_by_switch_and_by_root_differ_once_a_root_is_split() -> None:
    lay = layout("shared-root")
    g, n = crossed(lay)
    free = [p for p in lay.places if p not in (g, n)]
    # The root keeps a GPU and a NIC, but on different switches.
    assert free_pairs(free, "switch") == 6
    assert free_pairs(free, "root") == 7
    assert fits(Shape(True, 7), free, "root") and not fits(Shape(True, 7), free, "switch")


@pytest.mark.parametrize(
    ("shape", "grouping", "expected"),
    [
        (Shape(True, 1), "switch", False),
        (Shape(True, 1), COUNTS, True),
        (Shape(False, 2), "switch", True),
        (Shape(False, 3), "switch", False),
    ],
    ids=["pair-needs-a-switch", "counts-ignore-switches", "gpus-alone", "too-many-gpus"],
)
def test_fits_on_a_node_with_two_gpus_and_a_nic_on_another_switch(
    shape: Shape, grouping: str, expected: bool
) -> None:
    lay = layout("h100")
    gpus = lay.of("gpu")[:2]
    nic = next(p for p in lay.of("nic") if p.switch not in {g.switch for g in gpus})
    assert fits(shape, [*gpus, nic], grouping) is expected


def claim(node: str, results: list[tuple[str, str, str]]) -> dict[str, Any]:
    return {
        "status": {
            "allocation": {
                "devices": {
                    "results": [
                        {"request": r, "driver": d, "pool": node, "device": dev}
                        for r, d, dev in results
                    ]
                }
            }
        }
    }


def test_claim_is_paired_only_when_every_pair_shares_a_switch() -> None:
    lay = layout("shared-root")
    cluster = Cluster({"sim-00": lay})
    g, n = crossed(lay)
    own = next(p for p in lay.of("nic") if p.switch == g.switch)
    good = allocation_of(
        claim("sim-00", [("gpu-0", GPU_DRIVER, g.dra_name), ("nic-0", NIC_DRIVER, own.dra_name)]),
        cluster,
    )
    bad = allocation_of(
        claim("sim-00", [("gpu-0", GPU_DRIVER, g.dra_name), ("nic-0", NIC_DRIVER, n.dra_name)]),
        cluster,
    )
    assert good is not None and claim_paired(good)
    assert bad is not None and not claim_paired(bad)
    assert allocation_of({"status": {}}, cluster) is None


def test_devices_are_paired_when_they_split_into_same_switch_pairs() -> None:
    lay = layout("lone-gpu")
    by_switch: dict[str | None, dict[str, Place]] = {}
    for p in lay.places:
        by_switch.setdefault(p.switch, {})[p.kind] = p
    full = [d for d in by_switch.values() if len(d) == 2]
    lone = next(d["gpu"] for d in by_switch.values() if "nic" not in d)
    assert devices_paired([full[0]["gpu"], full[1]["gpu"]], [full[1]["nic"], full[0]["nic"]])
    assert not devices_paired([full[0]["gpu"]], [full[1]["nic"]])
    assert not devices_paired([lone], [full[0]["nic"]])


@pytest.mark.parametrize("name", ["h100", "shared-root"])
def test_replay_pairs_every_pod_whose_pairs_were_free_on_its_node(name: str) -> None:
    """The agent's ledger, asked as a kubelet asks, in a random order: whenever the node
    had the pairs free, the pod gets them. (Not on "lone-gpu": there the GPU without a NIC
    on its switch counts its NUMA node's NICs as partners, and a GPU-first choice may take
    it; the replay shows what the agent does, and the tool reports it.)"""
    lay = layout(name)
    replay = NodeReplay(lay, seed=5)
    by_id = lay.by_plugin_id()
    rng = random.Random(5)
    live: list[str] = []
    judged = 0
    for n in range(400):
        free = [by_id[i] for kind in ("gpu", "nic") for i in replay.free(kind)]
        if live and rng.random() < 0.45:
            replay.release(live.pop(rng.randrange(len(live))))
            continue
        shape = Shape(rng.random() < 0.75, rng.choice((1, 2, 4)))
        if not fits(shape, free, COUNTS if shape.paired else "switch"):
            continue
        got = replay.admit(f"p{n}", shape)
        live.append(f"p{n}")
        assert len(got["gpu"]) == shape.size and set(got["gpu"]) <= set(replay.ids["gpu"])
        if shape.paired and fits(shape, free, "switch"):
            judged += 1
            gpus = [by_id[i] for i in got["gpu"]]
            nics = [by_id[i] for i in got["nic"]]
            assert devices_paired(gpus, nics), (n, got)
    assert judged > 50


def test_replay_frees_a_released_pods_devices() -> None:
    replay = NodeReplay(layout("h100"), seed=1)
    replay.admit("a", Shape(True, 4))
    assert len(replay.free("gpu")) == 4 and len(replay.free("nic")) == 4
    replay.release("a")
    assert len(replay.free("gpu")) == 8 and len(replay.free("nic")) == 8
