"""What the cluster is told: Event notes, the Node condition, and repeats counted into
one Event."""

from __future__ import annotations

from agents.core.health import DeviceHealth, GpuLost, LinkNotUp, Signal, Xids
from agents.core.node_report import (
    MESSAGE_LIMIT,
    EventBook,
    condition_of,
    conditions_of,
    degraded_condition_of,
    note_of,
)

GPU = DeviceHealth("nvidia.com/gpu", "GPU-aa", "GPU 5", Xids((79,)))
NIC = DeviceHealth("rdma/roce", "0000:1c:00.0", "interface ens1np0", LinkNotUp("down"))


def test_unhealthy_note_is_a_warning_naming_resource_device_index_and_cause() -> None:
    note = note_of(GPU)
    assert (note.type, note.reason) == ("Warning", "DeviceUnhealthy")
    assert (
        note.message
        == "nvidia.com/gpu device GPU-aa (GPU 5) is Unhealthy: XID 79 (fell off the bus)"
    )


def test_degraded_note_is_a_warning_naming_the_signal_and_its_figures() -> None:
    x8 = Signal("pcie-width", "PCIe link x8 of x16", (("current", 8), ("max", 16)))
    note = note_of(DeviceHealth("nvidia.com/gpu", "GPU-aa", "GPU 5", x8))
    assert (note.type, note.reason) == ("Warning", "DeviceDegraded")
    assert note.message == "nvidia.com/gpu device GPU-aa (GPU 5) is Degraded: PCIe link x8 of x16"
    assert condition_of([DeviceHealth("nvidia.com/gpu", "GPU-aa", "GPU 5", x8)]).status == "True"


SLOW_GPU = DeviceHealth(
    "nvidia.com/gpu",
    "GPU-cc",
    "GPU 2",
    Signal("nvlink-down", "NVLink 2 of 18 links down", (("down", 2), ("links", 18))),
)
SLOW_NIC = DeviceHealth(
    "rdma/roce",
    "0000:1d:00.0",
    "interface ens2np0",
    Signal("link-speed", "ens2np0 at 100000 Mb/s, expected 400000"),
)


def test_degraded_condition_is_false_when_no_device_is_degraded() -> None:
    ok = DeviceHealth("nvidia.com/gpu", "GPU-bb", "GPU 1")
    condition = degraded_condition_of([ok, GPU])  # an Unhealthy device is not Degraded
    assert (condition.status, condition.reason) == ("False", "NoDeviceDegraded")
    assert condition.message == "none of 2 devices is Degraded"


def test_degraded_condition_is_true_and_lists_each_degraded_device_with_its_figures() -> None:
    ok = DeviceHealth("nvidia.com/gpu", "GPU-bb", "GPU 1")
    conditions = conditions_of([SLOW_GPU, ok, GPU, SLOW_NIC])
    degraded = conditions["DevicesDegraded"]
    assert (degraded.status, degraded.reason) == ("True", "DeviceDegraded")
    assert degraded.message == (
        "2 of 4 devices Degraded: nvidia.com/gpu GPU-cc (GPU 2): NVLink 2 of 18 links down; "
        "rdma/roce 0000:1d:00.0 (interface ens2np0): ens2np0 at 100000 Mb/s, expected 400000"
    )
    healthy = conditions["DevicesHealthy"]  # counts the Unhealthy one only
    assert (healthy.status, healthy.message[:29]) == ("False", "1 of 4 devices Unhealthy: nvi")


def test_devices_healthy_stays_true_with_degraded_devices_and_says_so() -> None:
    condition = condition_of([SLOW_GPU, DeviceHealth("nvidia.com/gpu", "GPU-bb", "GPU 1")])
    assert (condition.status, condition.reason) == ("True", "DevicesHealthy")
    assert condition.message == "no device of 2 is Unhealthy; 1 Degraded"


def test_degraded_condition_message_stays_short() -> None:
    slow = [
        DeviceHealth("nvidia.com/gpu", f"GPU-{i:040d}", f"GPU {i}", SLOW_GPU.cause)
        for i in range(64)
    ]
    message = degraded_condition_of(slow).message
    assert len(message) <= MESSAGE_LIMIT and message.endswith(" more")


def test_healthy_note_is_normal_and_names_the_interface() -> None:
    note = note_of(DeviceHealth("rdma/roce", "0000:1c:00.0", "interface ens1np0"))
    assert (note.type, note.reason) == ("Normal", "DeviceHealthy")
    assert "0000:1c:00.0 (interface ens1np0) is Healthy again" in note.message


def test_condition_is_true_when_every_device_is_healthy() -> None:
    ok = [DeviceHealth("nvidia.com/gpu", f"GPU-{i}", f"GPU {i}") for i in range(8)]
    condition = condition_of(ok)
    assert (condition.status, condition.reason) == ("True", "DevicesHealthy")
    assert "all 8 devices" in condition.message


def test_condition_is_false_and_lists_each_unhealthy_device() -> None:
    ok = DeviceHealth("nvidia.com/gpu", "GPU-bb", "GPU 1")
    condition = condition_of([GPU, ok, NIC])
    assert (condition.status, condition.reason) == ("False", "DeviceUnhealthy")
    assert condition.message == (
        "2 of 3 devices Unhealthy: nvidia.com/gpu GPU-aa (GPU 5): XID 79 (fell off the bus); "
        "rdma/roce 0000:1c:00.0 (interface ens1np0): link down"
    )


def test_condition_message_stays_short_and_says_how_many_more() -> None:
    bad = [
        DeviceHealth("nvidia.com/gpu", f"GPU-{i:040d}", f"GPU {i}", GpuLost()) for i in range(64)
    ]
    message = condition_of(bad).message
    assert len(message) <= MESSAGE_LIMIT
    assert message.endswith(" more")


def test_repeats_of_one_change_count_into_one_record() -> None:
    book = EventBook("node-1.ab")
    down = note_of(NIC)
    up = note_of(DeviceHealth("rdma/roce", "0000:1c:00.0", "interface ens1np0"))
    for i in range(20):
        book.add(down, f"t{i}")
        book.add(up, f"t{i}")
    records = book.unsent()  # none was sent: every record
    assert [r.count for r in records] == [20, 20]
    assert len({r.name for r in records}) == 2
    assert records[0].first == "t0" and records[0].last == "t19"


def test_a_sent_record_is_unsent_again_after_a_repeat() -> None:
    book = EventBook("n")
    record = book.add(note_of(GPU), "t0")
    record.sent_count, record.created = 1, True
    assert book.unsent() == []
    book.add(note_of(GPU), "t1")
    assert book.unsent() == [record]


def test_renewed_record_gets_a_new_name_and_is_created_again() -> None:
    book = EventBook("n")
    record = book.add(note_of(GPU), "t0")
    old = record.name
    record.sent_count, record.created = 1, True
    book.renew(record)
    assert record.name != old and not record.created and book.unsent() == [record]


def test_the_book_forgets_the_oldest_kind_beyond_its_limit() -> None:
    book = EventBook("n", limit=3)
    for i in range(5):
        book.add(note_of(DeviceHealth("r", f"d{i}", "x", GpuLost())), "t")
    assert [r.note.key[1] for r in book.unsent()] == ["d2", "d3", "d4"]
