"""The RoCE family's watch over its NICs' signals (agents.roce.signals): the expected speed
by model, causes and what a round changed (figures, or the signals behind them), the
readings for the gauges, NICs that come, go or are renamed, and a reload's limits applied
to what was measured before."""

from __future__ import annotations

from pathlib import Path

from agents.core.degraded import Limits
from agents.core.health import Grade, Signal, Signals
from agents.core.nic_signals import NicReading
from agents.hw.sysfs import Sysfs
from agents.roce.discovery import Nic
from agents.roce.signals import NicProbe, NicSignalWatch, Round

MODEL = "15b3:1021"
HOLD_S = 60.0


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def nic(n: int, netdev: str | None = None) -> Nic:
    return Nic(f"0000:{n:02x}:00.0", f"mlx5_{n}", 1, netdev or f"ens{n}np0", f"uverbs{n}", 0, None)


NICS = [nic(n) for n in range(4)]


def probe(speed: int = 400000, model: str = MODEL, **counters: int) -> NicProbe:
    return NicProbe(model, NicReading(speed, 0, True, tuple(sorted(counters.items()))))


def watch(limits: Limits | None = None) -> tuple[NicSignalWatch, Clock]:
    clock = Clock()
    w = NicSignalWatch(Sysfs(Path("/nonexistent")), limits or Limits(HOLD_S, 0, 10), clock=clock)
    w.watch(NICS)
    return w, clock


def up(_: Nic) -> bool:
    return True


def test_a_nic_slower_than_the_fastest_of_its_model_is_degraded_with_the_figures() -> None:
    w, _ = watch()
    probes = {n.pci: probe() for n in NICS}
    probes[NICS[2].pci] = probe(100000)
    probes[NICS[3].pci] = probe(100000, model="8086:1593")  # the only one of its model
    done = w.judge(probes, up)
    assert done.causes and done.signals
    assert [w.cause(n.pci) for n in (NICS[0], NICS[1], NICS[3])] == [None] * 3
    assert w.cause(NICS[2].pci) == Signal(
        "link-speed",
        "ens2np0 at 100000 Mb/s, expected 400000",
        (("speedMbps", 100000), ("expectedMbps", 400000)),
        Grade.DEGRADED,
    )
    assert done.readings[NICS[2].pci] == {
        "nic_link_speed_mbps": 100000,
        "nic_link_speed_expected_mbps": 400000,
    }
    assert done.readings[NICS[3].pci]["nic_link_speed_expected_mbps"] == 100000


def test_nics_whose_model_sysfs_does_not_show_are_compared_with_no_other() -> None:
    w, _ = watch()
    probes = {n.pci: probe(100000 if n is NICS[1] else 400000, model="") for n in NICS}
    assert not w.judge(probes, up).causes
    assert all(w.cause(n.pci) is None for n in NICS)


def test_a_configured_speed_applies_to_every_nic() -> None:
    w, _ = watch(Limits(HOLD_S, 800000, 10))
    w.judge({n.pci: probe() for n in NICS}, up)
    assert all(w.cause(n.pci) is not None for n in NICS)


def test_a_link_that_is_down_is_not_judged_by_its_speed() -> None:
    w, _ = watch()
    probes = {n.pci: probe() for n in NICS}
    probes[NICS[1].pci] = probe(100000)  # the file may lag the netlink state
    w.judge(probes, lambda n: n is not NICS[1])
    assert w.cause(NICS[1].pci) is None


def test_climbing_counters_change_the_figures_not_the_signals_until_another_joins() -> None:
    w, clock = watch()
    base = {n.pci: probe(symbol_error=0) for n in NICS}
    w.judge(base, up)
    first_pci = NICS[0].pci
    done = w.judge({**base, first_pci: probe(symbol_error=20)}, up)
    assert done.causes and done.signals
    cause = w.cause(first_pci)
    assert cause is not None and cause.label == "rdma-errors"
    assert cause.figures()["symbol_error"] == 20
    clock.now += 5
    done = w.judge({**base, first_pci: probe(symbol_error=40)}, up)
    assert done.causes and not done.signals  # new figures of the same fault
    climbed = w.cause(first_pci)
    assert climbed is not None and climbed.figures()["symbol_error"] == 40
    clock.now += 5
    done = w.judge({**base, first_pci: probe(100000, symbol_error=60)}, up)
    assert done.causes and done.signals  # another signal joined
    both = w.cause(first_pci)
    assert isinstance(both, Signals) and both.label == "link-speed,rdma-errors"
    assert both.grade is Grade.DEGRADED
    assert "RDMA errors" in both.text() and "100000 Mb/s" in both.text()


def test_healthy_again_only_after_the_hold() -> None:
    w, clock = watch()
    well = {n.pci: probe() for n in NICS}
    w.judge({**well, NICS[0].pci: probe(100000)}, up)
    clock.now += HOLD_S - 1
    assert not w.judge(well, up).signals  # held: the same signal, now marked held
    assert w.cause(NICS[0].pci) is not None
    clock.now += 1
    assert w.judge(well, up).signals
    assert w.cause(NICS[0].pci) is None


def test_a_nic_gone_or_renamed_starts_afresh() -> None:
    w, _ = watch()
    w.judge({**{n.pci: probe() for n in NICS}, NICS[0].pci: probe(100000)}, up)
    assert w.cause(NICS[0].pci) is not None
    w.watch([nic(0, "ens9np0"), *NICS[1:]])
    assert w.cause(NICS[0].pci) is None
    w.watch(NICS[1:])
    assert w.judge({NICS[0].pci: probe(100000)}, up) == Round()  # no longer watched


def test_following_an_earlier_watch_keeps_what_it_measured_under_the_new_limits() -> None:
    earlier, clock = watch()
    base = {n.pci: probe(symbol_error=0) for n in NICS}
    earlier.judge(base, up)
    clock.now += 5
    earlier.judge({**base, NICS[0].pci: probe(symbol_error=30)}, up)
    assert earlier.cause(NICS[0].pci) is not None
    later = NicSignalWatch(Sysfs(Path("/nonexistent")), Limits(HOLD_S, 0, 100), clock=clock)
    later.watch(NICS)
    later.follow(earlier)
    assert later.cause(NICS[0].pci) is not None  # held: no flap on a reload
    clock.now += 5
    later.judge({**base, NICS[0].pci: probe(symbol_error=60)}, up)  # +60 in a minute < 100
    assert later.cause(NICS[0].pci) is not None  # within the new limit, held
    clock.now += HOLD_S
    later.judge({**base, NICS[0].pci: probe(symbol_error=60)}, up)
    assert later.cause(NICS[0].pci) is None
