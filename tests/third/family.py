"""A third device family, defined outside agents/ to show that one needs nothing of it
beyond the family interface: accelerator cards found under the sysfs tree
(`class/toycard/<card>/`), each with a model, a NUMA node and a `health` file that reads
`ok` or `hot <celsius>`, followed by inotify."""

from __future__ import annotations

import asyncio
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from agents.backends import Backends
from agents.config import Config
from agents.core.device import Device, DeviceNode
from agents.core.health import Cause, DeviceHealth, Figure, Taint
from agents.core.topology import PciLocation
from agents.family import Context, Family, HealthSink, Located
from agents.hw.inotify import Change, DirectoryWatch
from agents.kernel.catalogue import Inventory
from agents.kernel.edits import Consumed, ContainerEdits, DeviceKey, by_resource, merged
from agents.kernel.facts import NUMA_NODE, AttributeValue, DeviceFacts, FamilyFacts, Version
from agents.tasks import first

RESOURCE = "example.com/card"
DRIVER = "card.example.com"
CLASS_DIR = "class/toycard"  # under the sysfs root
VISIBLE_ENV = "TOYCARD_VISIBLE_DEVICES"
OK = "ok"


@dataclass(frozen=True)
class Card:
    name: str  # card0: the device ID, and its node /dev/<name>
    model: str
    numa: int | None
    firmware: str


@dataclass(frozen=True)
class Overheated(Cause):
    """The card says it is too hot; the figure is its temperature."""

    celsius: int

    @property
    def label(self) -> str:
        return "overheated"

    def text(self) -> str:
        return f"card at {self.celsius} C"

    def figures(self) -> Mapping[str, Figure]:
        return {"celsius": self.celsius}

    def taint(self, driver: str) -> Taint:
        return Taint(f"{driver}/overheated", str(self.celsius))


def cards_dir(backends: Backends) -> Path:
    return backends.sysfs.root / CLASS_DIR


def discover_cards(root: Path) -> tuple[Card, ...]:
    """Blocking: every card directory under `root`, by name."""
    if not root.is_dir():
        return ()
    return tuple(
        Card(
            d.name,
            (d / "model").read_text().strip(),
            int((d / "numa_node").read_text()),
            (d / "firmware").read_text().strip(),
        )
        for d in sorted(root.iterdir())
        if d.is_dir()
    )


def read_health(root: Path, cards: Sequence[Card]) -> dict[str, Cause | None]:
    """Blocking: each card's health file; a file that says anything but `ok` or
    `hot <celsius>` counts as ok."""
    out: dict[str, Cause | None] = {}
    for card in cards:
        words = (root / card.name / "health").read_text().split()
        out[card.name] = Overheated(int(words[1])) if words[:1] == ["hot"] else None
    return out


class CardResource:
    """The one resource of the family: whole cards."""

    summary = "cards"

    def __init__(self, cards: Sequence[Card], dev_root: str) -> None:
        self._cards = {c.name: c for c in cards}
        self._dev_root = dev_root
        self._inventory = Inventory(Device(c.name, True, c.numa) for c in cards)

    @property
    def name(self) -> str:
        return RESOURCE

    @property
    def inventory(self) -> Inventory:
        return self._inventory

    def definition(self) -> Hashable:
        return tuple(sorted(self._cards))

    def set_health(self, causes: Mapping[str, Cause | None]) -> bool:
        return self._inventory.replace(
            Device(c.name, causes.get(c.name) is None, c.numa) for c in self._cards.values()
        )

    def _node(self, device_id: str) -> DeviceNode:
        return DeviceNode(f"/dev/{device_id}", f"{self._dev_root}/dev/{device_id}")

    def edits(self, device_ids: Sequence[str]) -> ContainerEdits:
        own = {(RESOURCE, i): (self._node(i),) for i in device_ids}
        nodes = tuple(self._node(i) for i in device_ids)
        return ContainerEdits({VISIBLE_ENV: ",".join(device_ids)}, nodes, own)

    def physical_id(self, device_id: str) -> str:
        return device_id

    def allocate(self, device_ids: Sequence[str]) -> ContainerEdits:
        return self.edits(device_ids)

    def preferred(
        self, available: Sequence[str], must_include: Sequence[str], size: int
    ) -> list[str]:
        rest = sorted(i for i in available if i not in must_include)
        return [*must_include, *rest[: size - len(must_include)]]


class CardFamily:
    name = "card"

    def __init__(self, root: Path, cards: Sequence[Card], dev_root: str, sink: HealthSink) -> None:
        self._root = root
        self._cards = tuple(cards)
        self._sink = sink
        self._causes: dict[str, Cause | None] = {c.name: None for c in cards}
        self._resource = CardResource(cards, dev_root)

    def resources(self) -> Sequence[CardResource]:
        return [self._resource]

    def located(self) -> Located:
        return Located("", {})

    def locations(self) -> dict[str, PciLocation]:
        return {}

    def labels(self) -> dict[str, str]:
        return {"card.count": str(len(self._cards))}

    def device_health(self) -> list[DeviceHealth]:
        return [
            DeviceHealth(RESOURCE, c.name, f"card {c.name}", self._causes[c.name])
            for c in self._cards
        ]

    def facts(self) -> FamilyFacts:
        return FamilyFacts(DRIVER, tuple(_facts(c) for c in self._cards))

    def edits(
        self, devices: Sequence[DeviceKey], consumed: Consumed | None = None
    ) -> ContainerEdits:
        by_name = {r.name: r for r in self.resources()}
        return merged([by_name[r].edits(ids) for r, ids in by_resource(devices).items()])

    def follow(self, earlier: Family) -> None:
        if isinstance(earlier, CardFamily):
            self._causes |= {k: v for k, v in earlier._causes.items() if k in self._causes}
            self._resource.set_health(self._causes)

    async def run(self) -> None:
        """Read each card's health file whenever one of their directories changes."""
        watches = [
            DirectoryWatch(self._root / c.name, Change.WRITTEN | Change.CREATED)
            for c in self._cards
        ]
        try:
            while True:  # the first read comes after the watches: no change is missed
                causes = await asyncio.to_thread(read_health, self._root, self._cards)
                self._causes = causes
                self._resource.set_health(causes)
                self._sink.publish(self.device_health())
                if not watches:
                    await asyncio.Event().wait()
                await first(*(w.changed() for w in watches))
                for watch in watches:
                    watch.drain()
        finally:
            for watch in watches:
                watch.close()

    async def close(self) -> None:
        """Nothing to give back."""


def _facts(card: Card) -> DeviceFacts:
    attributes: dict[str, AttributeValue] = {
        "model": card.model,
        "firmware": Version(card.firmware),
    }
    if card.numa is not None:
        attributes[NUMA_NODE] = card.numa
    return DeviceFacts(card.name, RESOURCE, card.name, attributes, {"memory": "16Gi"})


class CardKind:
    """How the card family is made: plugged in as `Agent(kinds=(..., CardKind()))`."""

    name = "card"
    sections: tuple[str, ...] = ()  # no config section of its own
    pairs_as: str | None = None

    def discover(self, config: Config, backends: Backends, source: str) -> tuple[Card, ...]:
        return discover_cards(cards_dir(backends))

    def build(self, found: tuple[Card, ...], config: Config, context: Context) -> CardFamily:
        dev_root = "" if context.backends.dev_root is None else str(context.backends.dev_root)
        return CardFamily(cards_dir(context.backends), found, dev_root, context.health)

    def named_devices(self, config: Config) -> Config:
        return config


def write_card(root: Path, name: str, *, numa: int, model: str = "ToyCard 9000") -> Path:
    """A card directory as the kernel would show it, healthy."""
    card = root / CLASS_DIR / name
    card.mkdir(parents=True)
    (card / "model").write_text(model + "\n")
    (card / "numa_node").write_text(f"{numa}\n")
    (card / "firmware").write_text("1.2.3\n")
    (card / "health").write_text(OK + "\n")
    return card


def set_health(card: Path, text: str) -> None:
    """Flip a card's health file with a rename, as a driver replacing it would."""
    tmp = card / ".health.tmp"
    tmp.write_text(text + "\n")
    tmp.replace(card / "health")
