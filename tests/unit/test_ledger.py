"""The pairing ledger (agents.core.ledger) fed as the kubelet feeds it: calls, checkpoint
files in the kubelet's own JSON format, and pod-resources listings."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence

import pytest

from agents.core.kubelet_checkpoint import CheckpointFormatError, parse_checkpoint
from agents.core.ledger import GPU, NIC, Event, Ledger
from agents.standin.checkpoint import CheckpointEntry, checkpoint_data, pod_uid

GPU_RES, NIC_RES, FOREIGN = "nvidia.com/gpu", "rdma/roce", "example.com/fpga"
RESOURCE = {GPU: GPU_RES, NIC: NIC_RES}
# One switch per pair: g<i> <-> n<i>.
ONE_TO_ONE = {
    GPU: {f"g{i}": frozenset({f"n{i}"}) for i in range(4)},
    NIC: {f"n{i}": frozenset({f"g{i}"}) for i in range(4)},
}
# Two GPUs per switch and NIC: g0,g1 <-> n0; g2,g3 <-> n1.
TWO_TO_ONE = {
    GPU: {f"g{i}": frozenset({f"n{i // 2}"}) for i in range(4)},
    NIC: {f"n{i}": frozenset({f"g{2 * i}", f"g{2 * i + 1}"}) for i in range(2)},
}


class Node:
    """The kubelet's side: it admits containers resource by resource, writes its
    checkpoint file (update writes and end-of-admission writes) and lists pods."""

    def __init__(self, partners: Mapping[str, Mapping[str, frozenset[str]]]) -> None:
        self.partners = partners
        self.events: list[Event] = []
        self.ledger = Ledger(RESOURCE, partners, report=self.events.append)
        self.held: dict[tuple[str, str], dict[str, list[str]]] = {}  # in the file
        self.deleted: set[str] = set()  # pods gone, entries still in the file
        self.healthy = {GPU_RES: set(partners[GPU]), NIC_RES: set(partners[NIC]), FOREIGN: {"f0"}}
        self.renames = 0
        self.write()  # the file as the agent finds it at start
        self.ledger.checkpoint(parse_checkpoint(self.text), 0)
        self.renames = 0

    # The checkpoint file

    def write(self) -> None:
        entries = [
            CheckpointEntry(pod, container, resource, {0: ids}, b"")
            for (pod, container), by in self.held.items()
            for resource, ids in by.items()
        ]
        self.text = json.dumps(checkpoint_data(entries, self.healthy))
        self.renames += 1

    def flap(self) -> None:
        """Another vendor's plugin changes health: an update write."""
        self.healthy[FOREIGN] = set() if self.healthy[FOREIGN] else {"f0"}
        self.write()

    def sync(self) -> None:
        """What the agent does before each call: take in the renames since the last."""
        if self.renames:
            self.ledger.checkpoint(parse_checkpoint(self.text), self.renames)
            self.renames = 0

    # Admission

    def free(self, kind: str) -> list[str]:
        used = {
            i
            for key, by in self.held.items()
            if key[0] not in self.deleted
            for i in by.get(RESOURCE[kind], ())
        }
        return sorted(set(self.partners[kind]) - used)

    def ask(self, pod: str, kind: str, size: int, *, must: Sequence[str] = ()) -> list[str]:
        self.sync()
        got = self.ledger.prefer(kind, self.free(kind), list(must), size, None)
        self.sync()
        self.ledger.allocated(kind, got)
        self.held.setdefault((pod, "main"), {})[RESOURCE[kind]] = got
        return got

    def admit(
        self, pod: str, *asks: tuple[str, int], flap_between: bool = False
    ) -> dict[str, list[str]]:
        got = {}
        for n, (kind, size) in enumerate(asks):
            if n and flap_between:
                self.flap()
            got[kind] = self.ask(pod, kind, size)
        self.write()  # end of admission: RegisteredDevices as it was
        return got

    def delete(self, pod: str) -> None:
        self.deleted.add(pod)  # the file keeps its entries until the next admission

    def listing(self) -> dict[tuple[str, str], dict[str, list[str]]]:
        return {k: dict(v) for k, v in self.held.items() if k[0] not in self.deleted}


def paired(node: Node, got: Mapping[str, list[str]]) -> bool:
    return {n for g in got[GPU] for n in node.partners[GPU][g]} >= set(got[NIC])


@pytest.mark.parametrize("order", [(GPU, NIC), (NIC, GPU)], ids=["gpu-first", "nic-first"])
@pytest.mark.parametrize("shape", [ONE_TO_ONE, TWO_TO_ONE], ids=["8x8", "8x4"])
def test_stray_update_write_between_a_containers_two_resources_never_splits_its_pairs(
    order: tuple[str, str], shape: Mapping[str, Mapping[str, frozenset[str]]]
) -> None:
    node = Node(shape)
    sizes = {GPU: 2, NIC: 2 if shape is ONE_TO_ONE else 1}
    node.admit("a", (GPU, 1))  # something before, so the file has content
    for pod in ("b", "c"):
        got = node.admit(pod, *((k, sizes[k]) for k in order), flap_between=True)
        assert paired(node, got), got
        node.delete(pod)


def test_end_of_admission_write_ends_the_container() -> None:
    node = Node(ONE_TO_ONE)
    node.admit("a", (GPU, 1))  # a GPU-only container
    # The next container's NIC is not pulled towards a's GPU: its partner pairs with no one.
    got = node.ask("b", NIC, 1)
    assert set(got) != ONE_TO_ONE[GPU][node.held[("a", "main")][GPU_RES][0]]


def test_an_end_and_an_update_write_seen_together_still_end_the_container() -> None:
    node = Node(ONE_TO_ONE)
    node.ask("a", GPU, 1)
    node.write()  # end of a (GPU only) ...
    node.flap()  # ... and an update, both renamed before the next call
    gpu = node.held[("a", "main")][GPU_RES][0]
    assert set(node.ask("b", NIC, 1)) != ONE_TO_ONE[GPU][gpu]


def test_pod_resources_makes_a_deleted_pods_devices_free_at_once() -> None:
    node = Node(ONE_TO_ONE)
    node.admit("a", (NIC, 3))  # n0..n2 (in some order) held by a NIC-only pod
    node.delete("a")  # gone; the file still lists it until the next admission begins
    node.ledger.pod_resources(node.listing())
    got = node.admit("b", (GPU, 2), (NIC, 2))
    assert paired(node, got)
    assert len({n for g in got[GPU] for n in ONE_TO_ONE[GPU][g]}) == 2


def test_without_pod_resources_a_pod_ends_when_its_devices_are_offered_again() -> None:
    node = Node(ONE_TO_ONE)
    got_a = node.admit("a", (GPU, 2), (NIC, 2))
    node.admit("b", (NIC, 2))  # the two other NICs
    node.delete("a")
    # a's GPUs are offered again, so its NICs are free: a GPU asked first goes there.
    first = node.ask("c", GPU, 1)
    assert first[0] in got_a[GPU]


def test_ledger_rebuilt_at_start_from_the_checkpoint_pairs_the_next_container() -> None:
    node = Node(ONE_TO_ONE)
    node.admit("a", (NIC, 2))
    restarted = Ledger(RESOURCE, ONE_TO_ONE)
    restarted.checkpoint(parse_checkpoint(node.text), 0)
    node.ledger = restarted
    gpus = node.ask("b", GPU, 2)  # partners of a's NICs are held: take those with free ones
    held = set(node.held[("a", "main")][NIC_RES])
    assert not {n for g in gpus for n in ONE_TO_ONE[GPU][g]} & held


def test_unreadable_checkpoint_falls_back_to_renames_and_reports_once() -> None:
    node = Node(ONE_TO_ONE)
    for pod in ("a", "b", "c"):
        node.ledger.checkpoint(None, 1)
        got = {GPU: node.ask(pod, GPU, 1)}
        got[NIC] = node.ask(pod, NIC, 1)
        assert paired(node, got)
    assert [e.name for e in node.events] == ["pairing_checkpoint_unreadable"]


def test_a_container_whose_admission_failed_half_way_is_forgotten() -> None:
    node = Node(ONE_TO_ONE)
    node.ask("f", NIC, 1)  # f got a NIC, then its GPUs did not fit: no end write
    del node.held[("f", "main")]
    gpu = node.ask("c", GPU, 1)
    # f's NIC offered again: f is gone, and c's NIC pairs with c's GPU.
    assert set(node.ask("c", NIC, 1)) == ONE_TO_ONE[GPU][gpu[0]]


@pytest.mark.parametrize(
    "text",
    [
        "",
        "{}",
        '{"Data": {}}',
        '{"Data": {"PodDeviceEntries": [{"PodUID": "p"}], "RegisteredDevices": {}}}',
        '{"Data": {"PodDeviceEntries": [], "RegisteredDevices": {"r": "x"}}}',
        '{"Entries": [], "Checksum": 1}',
    ],
    ids=["empty", "no-data", "no-fields", "entry-lacks-fields", "ids-not-a-list", "old-format"],
)
def test_parse_checkpoint_rejects_other_formats(text: str) -> None:
    with pytest.raises(CheckpointFormatError):
        parse_checkpoint(text)


def test_parse_checkpoint_reads_the_kubelet_format() -> None:
    entries = [
        CheckpointEntry("uid-1", "main", GPU_RES, {0: ["g0"], 1: ["g1"]}, b"\x01"),
        CheckpointEntry("uid-1", "main", NIC_RES, {-1: ["n0"]}, b""),
    ]
    document = parse_checkpoint(json.dumps(checkpoint_data(entries, {GPU_RES: ["g0", "g2"]})))
    assert document.holdings[GPU_RES] == {(pod_uid("uid-1"), "main"): frozenset({"g0", "g1"})}
    assert document.held(NIC_RES) == {"n0"}
    assert document.registered == {GPU_RES: frozenset({"g0", "g2"})}


def _listed(node: Node, admitting: str) -> dict[tuple[str, str], dict[str, list[str]]]:
    """What pod-resources lists: live pods, and the pod being admitted (devices so far)."""
    return {(admitting, "main"): {}, **node.listing()}


def test_renames_read_together_that_flip_health_back_keep_the_container_with_pod_resources() -> (
    None
):
    node = Node(ONE_TO_ONE)
    node.admit("a", (GPU, 1))
    node.ledger.pod_resources(_listed(node, "b"))
    gpus = node.ask("b", GPU, 2)
    node.flap()
    node.flap()  # flipped back: two renames, RegisteredDevices as it was
    node.ledger.pod_resources(_listed(node, "b"))  # no other pod began
    nics = node.ask("b", NIC, 2)
    assert paired(node, {GPU: gpus, NIC: nics})


def test_renames_read_together_end_the_container_when_another_pod_is_listed() -> None:
    node = Node(ONE_TO_ONE)
    node.ledger.pod_resources(_listed(node, "a"))
    gpu = node.ask("a", GPU, 1)
    node.write()  # end of a (GPU only) ...
    node.flap()
    node.flap()  # ... and two updates, all read together
    node.ledger.pod_resources(_listed(node, "b"))  # b's admission has begun
    assert set(node.ask("b", NIC, 1)) != ONE_TO_ONE[GPU][gpu[0]]


def test_pod_resources_is_asked_again_only_when_the_container_may_have_changed() -> None:
    node = Node(ONE_TO_ONE)
    assert node.ledger.wants_listing(GPU)  # never listed
    node.ledger.pod_resources(_listed(node, "a"))
    assert node.ledger.wants_listing(GPU) and node.ledger.wants_listing(NIC)
    node.ask("a", GPU, 1)
    node.sync()
    # a's second resource: the listing taken for its first still says who holds what.
    assert not node.ledger.wants_listing(NIC)
    assert node.ledger.wants_listing(GPU)  # the same resource again: not a's second
    node.write()  # end of a
    node.sync()
    assert node.ledger.wants_listing(NIC)  # the next container's first resource
    # b's first resource was chosen without asking us (no real choice): its listing is a's.
    node.ask("b", GPU, 1)
    node.sync()
    assert node.ledger.wants_listing(NIC)


def test_pod_resources_is_asked_again_when_renames_read_together_leave_the_end_in_doubt() -> None:
    node = Node(ONE_TO_ONE)
    node.ledger.pod_resources(_listed(node, "a"))
    node.ask("a", GPU, 1)
    node.write()  # end of a (GPU only) ...
    node.flap()
    node.flap()  # ... and two updates, all read together: a may have ended
    node.sync()
    assert node.ledger.wants_listing(NIC)
    node.ledger.pod_resources(None)  # pod-resources stopped answering
    assert node.ledger.wants_listing(NIC)
