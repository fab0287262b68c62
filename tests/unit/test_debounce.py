"""Leading-edge debouncing with a fake clock: the first change at once, flaps held."""

from __future__ import annotations

import pytest

from agents.core.debounce import Debouncer

HOLD = 2.0


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def advance(self, seconds: float) -> float:
        self.now += seconds
        return self.now


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def debouncer(clock: FakeClock) -> Debouncer[str, bool]:
    d: Debouncer[str, bool] = Debouncer(HOLD)
    d.observe("nic", True, clock.now)  # the first value is the starting point
    return d


def test_first_value_is_published_as_is(debouncer: Debouncer[str, bool]) -> None:
    assert debouncer.value("nic") is True
    assert debouncer.value("other") is None
    assert debouncer.next_due() is None


def test_first_change_is_published_at_once(
    debouncer: Debouncer[str, bool], clock: FakeClock
) -> None:
    debouncer.observe("nic", False, clock.advance(0.001))
    assert debouncer.value("nic") is False
    assert debouncer.next_due() is None


@pytest.mark.parametrize(
    ("flaps", "last"),
    [([True], True), ([True, False], False), ([True, False, True], True)],
    ids=["back-up", "up-then-down-again", "three-flaps-ending-up"],
)
def test_flaps_within_the_hold_are_held_and_the_last_published_when_it_ends(
    debouncer: Debouncer[str, bool], clock: FakeClock, flaps: list[bool], last: bool
) -> None:
    debouncer.observe("nic", False, clock.now)  # reported at once, starts the hold
    reported_at = clock.now
    for value in flaps:
        debouncer.observe("nic", value, clock.advance(0.3))
        debouncer.flush_due(clock.now)
        assert debouncer.value("nic") is False  # held
    due = debouncer.next_due()
    if last is False:
        assert due is None  # back to what is published: nothing to publish
        return
    assert due == pytest.approx(reported_at + HOLD)
    debouncer.flush_due(clock.advance(reported_at + HOLD - clock.now - 0.01))
    assert debouncer.value("nic") is False
    debouncer.flush_due(clock.advance(0.01))
    assert debouncer.value("nic") is last
    assert debouncer.next_due() is None


def test_change_after_the_hold_is_published_at_once(
    debouncer: Debouncer[str, bool], clock: FakeClock
) -> None:
    debouncer.observe("nic", False, clock.now)
    debouncer.observe("nic", True, clock.advance(HOLD))
    assert debouncer.value("nic") is True


def test_keys_are_debounced_apart(debouncer: Debouncer[str, bool], clock: FakeClock) -> None:
    debouncer.observe("other", True, clock.now)
    debouncer.observe("nic", False, clock.advance(0.1))
    debouncer.observe("other", False, clock.advance(0.1))
    assert (debouncer.value("nic"), debouncer.value("other")) == (False, False)
