"""The real backends open their netlink link monitor only when a link is first asked
about: a node whose families read no link keeps no socket that every host link change
would wake (docs/benchmarks.md, "Beside the floor")."""

from __future__ import annotations

import asyncio

import pytest

from agents.backends import LinksOnFirstUse
from agents.errors import BackendError
from agents.hw.netlink import LinkMonitor, LinkState


class CountedLinks:
    """A LinkMonitor that counts how often it was made and asked."""

    made = 0

    def __init__(self) -> None:
        CountedLinks.made += 1
        self.closed = False

    def state(self, ifname: str) -> LinkState:
        return LinkState.UP if ifname == "eth0" else LinkState.ABSENT

    async def next_change(self, timeout_s: float) -> bool:
        return True

    def close(self) -> None:
        self.closed = True


@pytest.fixture(autouse=True)
def _count_from_zero() -> None:
    CountedLinks.made = 0


def _opened(links: LinksOnFirstUse) -> LinkMonitor:
    return links._opened()


def test_nothing_is_opened_until_a_link_is_asked_about() -> None:
    links = LinksOnFirstUse(CountedLinks)
    assert CountedLinks.made == 0 and not links.opened
    assert links.state("eth0") is LinkState.UP
    assert links.state("eth9") is LinkState.ABSENT
    assert asyncio.run(links.next_change(1.0)) is True
    assert CountedLinks.made == 1 and links.opened


def test_closing_an_unused_monitor_opens_nothing_and_later_use_is_refused() -> None:
    links = LinksOnFirstUse(CountedLinks)
    links.close()
    links.close()
    assert CountedLinks.made == 0
    with pytest.raises(BackendError):
        links.state("eth0")


def test_closing_a_used_monitor_closes_the_one_it_opened() -> None:
    links = LinksOnFirstUse(CountedLinks)
    links.state("eth0")
    opened = _opened(links)
    links.close()
    assert isinstance(opened, CountedLinks) and opened.closed


def test_the_real_backends_open_no_netlink_socket_at_start() -> None:
    from agents.backends import real_backends

    backends = real_backends()
    try:
        assert isinstance(backends.links, LinksOnFirstUse)
        assert not backends.links.opened
    finally:
        backends.links.close()
