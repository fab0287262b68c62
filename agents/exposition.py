"""The Prometheus text exposition format 0.0.4, written by the agent itself: counters,
gauges and histograms with labels, collectors that yield families at scrape time, and
the writer. A client library would cost the agent megabytes of imports it never uses."""

from __future__ import annotations

import math
import threading
import time
from bisect import bisect_left
from collections.abc import Iterable, Iterator, Sequence
from typing import Generic, Protocol, TypeVar

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
INF = math.inf


class Family:
    """One metric family as a scrape writes it. A collector makes one each scrape, e.g.
    `f = Family("node_agent_devices", "Advertised devices", ["resource"])`,
    `f.add(["nvidia.com/gpu"], 8)`, and yields it; the type is "gauge" unless told."""

    __slots__ = ("_order", "help", "kind", "labels", "name", "samples")

    def __init__(
        self, name: str, help: str, labels: Sequence[str] = (), kind: str = "gauge"
    ) -> None:
        self.name, self.help, self.kind = name, help, kind
        self.labels = tuple(labels)
        self._order = _order(self.labels)
        # (suffix of the sample's name, its labels as written, value)
        self.samples: list[tuple[str, str, float]] = []

    def add(self, values: Sequence[str], value: float) -> None:
        """A sample with these label values (in the order of the family's labels)."""
        self.samples.append(("", self.label_text(values), value))

    def label_text(self, values: Sequence[str], extra: tuple[str, str] | None = None) -> str:
        """`{name="value",...}`, names sorted, values escaped; "" without labels."""
        if len(values) != len(self.labels):
            raise ValueError(f"{self.name}: labels {self.labels} given values {tuple(values)}")
        if not values and extra is None:
            return ""
        pairs = [(self.labels[i], str(values[i])) for i in self._order]
        if extra is not None:
            pairs.append(extra)
            pairs.sort()
        return "{" + ",".join(f'{k}="{escape(v)}"' for k, v in pairs) + "}"


class Collector(Protocol):
    """Anything a registry asks for families at each scrape."""

    def collect(self) -> Iterable[Family]: ...


C = TypeVar("C", bound=Collector)


class Registry:
    """The collectors of one exposition, written in the order they were registered."""

    def __init__(self) -> None:
        self._collectors: list[Collector] = []

    def register(self, collector: C) -> C:
        self._collectors.append(collector)
        return collector

    def collect(self) -> Iterator[Family]:
        for collector in list(self._collectors):
            yield from collector.collect()

    def exposition(self) -> bytes:
        return write(self.collect())


def write(families: Iterable[Family]) -> bytes:
    """The text exposition of the families, in their order and their samples' order."""
    out: list[str] = []
    for f in families:
        out.append(f"# HELP {f.name} {escape_help(f.help)}\n# TYPE {f.name} {f.kind}\n")
        out.extend(f"{f.name}{suffix}{labels} {number(v)}\n" for suffix, labels, v in f.samples)
    return "".join(out).encode()


def escape(value: str) -> str:
    """A label value as the format quotes it: backslash, double quote, newline escaped."""
    if "\\" in value or '"' in value or "\n" in value:
        return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return value


def escape_help(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def number(value: float) -> str:
    """A sample value as Prometheus reads it: NaN, +Inf, -Inf, else the shortest decimal
    that reads back as the same float (integers too, e.g. 16.0)."""
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(float(value))


def _order(labels: tuple[str, ...]) -> tuple[int, ...]:
    if len(set(labels)) != len(labels):
        raise ValueError(f"labels repeated: {labels}")
    return tuple(sorted(range(len(labels)), key=labels.__getitem__))


class _Child:
    """One labelled series of an instrument: its labels as written, value, creation time."""

    __slots__ = ("_lock", "created", "text", "value")

    def __init__(self, text: str, lock: threading.Lock) -> None:
        self.text, self.value, self.created, self._lock = text, 0.0, time.time(), lock


T = TypeVar("T", bound=_Child)


class _Instrument(Generic[T]):
    """Series by label values, created on first use; a series stays until removed."""

    def __init__(self, name: str, help: str, labels: Sequence[str] = ()) -> None:
        self.name, self.help = name, help
        self._shape = Family(name, help, labels)  # checks and writes the labels
        self._lock = threading.Lock()  # telemetry may come from a worker thread
        self._children: dict[tuple[str, ...], T] = {}
        if not self._shape.labels:
            self.labels()

    def labels(self, *values: str) -> T:
        key = tuple(str(v) for v in values)
        child = self._children.get(key)
        if child is None:
            with self._lock:
                child = self._children.get(key)
                if child is None:
                    child = self._children[key] = self._child(key)
        return child

    def remove(self, *values: str) -> None:
        """Drop a series; KeyError if there is none with these label values."""
        with self._lock:
            del self._children[tuple(str(v) for v in values)]

    def _child(self, key: tuple[str, ...]) -> T:
        raise NotImplementedError

    def _series(self) -> list[T]:
        with self._lock:
            return list(self._children.values())

    def _family(self, name: str, kind: str) -> Family:
        return Family(name, self.help, self._shape.labels, kind)

    def _created(self, children: list[T]) -> Family:
        created = self._family(f"{self.name}_created", "gauge")
        created.samples.extend(("", c.text, c.created) for c in children)
        return created


class _GaugeChild(_Child):
    __slots__ = ()

    def set(self, value: float) -> None:
        self.value = float(value)


class Gauge(_Instrument[_GaugeChild]):
    """A value that goes up and down: `gauge.labels("a", "b").set(3)`."""

    def _child(self, key: tuple[str, ...]) -> _GaugeChild:
        return _GaugeChild(self._shape.label_text(key), self._lock)

    def collect(self) -> Iterator[Family]:
        family = self._family(self.name, "gauge")
        family.samples.extend(("", c.text, c.value) for c in self._series())
        yield family


class _CounterChild(_Child):
    __slots__ = ()

    def inc(self, amount: float = 1.0) -> None:
        if amount < 0:
            raise ValueError(f"a counter only grows; asked to add {amount}")
        with self._lock:
            self.value += amount


class Counter(_Instrument[_CounterChild]):
    """A count that only grows, written as `<name>_total`, with `<name>_created` (the
    series' creation time, seconds since the epoch) beside it as a gauge."""

    def __init__(self, name: str, help: str, labels: Sequence[str] = ()) -> None:
        super().__init__(name.removesuffix("_total"), help, labels)

    def _child(self, key: tuple[str, ...]) -> _CounterChild:
        return _CounterChild(self._shape.label_text(key), self._lock)

    def collect(self) -> Iterator[Family]:
        children = self._series()
        total = self._family(f"{self.name}_total", "counter")
        total.samples.extend(("", c.text, c.value) for c in children)
        yield total
        yield self._created(children)


class _HistogramChild(_Child):
    __slots__ = ("_bounds", "counts", "les")

    def __init__(
        self, text: str, les: list[str], bounds: list[float], lock: threading.Lock
    ) -> None:
        super().__init__(text, lock)
        self.les, self._bounds = les, bounds
        self.counts = [0] * len(bounds)  # per bucket, not cumulative

    def observe(self, value: float) -> None:
        at = bisect_left(self._bounds, value)  # the first bound >= value: le is inclusive
        with self._lock:
            self.counts[at] += 1
            self.value += value


class Histogram(_Instrument[_HistogramChild]):
    """Observations counted into buckets by upper bound (+Inf added): `_bucket{le}`
    (cumulative), `_count`, `_sum`, and `<name>_created` beside it as a gauge."""

    def __init__(
        self, name: str, help: str, labels: Sequence[str], buckets: Sequence[float]
    ) -> None:
        bounds = [float(b) for b in buckets]
        if bounds != sorted(set(bounds)) or "le" in labels:
            raise ValueError(f"{name}: buckets must be increasing and no label named le")
        self.bounds = bounds if bounds[-1:] == [INF] else [*bounds, INF]
        super().__init__(name, help, labels)

    def _child(self, key: tuple[str, ...]) -> _HistogramChild:
        text = self._shape.label_text(key)
        les = [self._shape.label_text(key, ("le", number(b))) for b in self.bounds]
        return _HistogramChild(text, les, self.bounds, self._lock)

    def collect(self) -> Iterator[Family]:
        children = self._series()
        family = self._family(self.name, "histogram")
        for c in children:
            with self._lock:
                counts, total = list(c.counts), c.value
            running = 0
            for le, n in zip(c.les, counts, strict=True):
                running += n
                family.samples.append(("_bucket", le, running))
            family.samples.append(("_count", c.text, running))
            family.samples.append(("_sum", c.text, total))
        yield family
        yield self._created(children)
