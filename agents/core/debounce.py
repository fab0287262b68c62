"""Leading-edge debouncing of state flaps: the first change is reported at once, later
changes of the same key within the hold time are held back and only the last one kept."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Generic, TypeVar

K = TypeVar("K")
V = TypeVar("V")


@dataclass
class Debouncer(Generic[K, V]):
    hold_s: float
    _published: dict[K, V] = field(default_factory=dict)
    _last_report: dict[K, float] = field(default_factory=dict)
    _pending: dict[K, V] = field(default_factory=dict)

    def observe(self, key: K, value: V, now: float) -> None:
        """Record the current value of key; publish it now unless held."""
        if key not in self._published:
            self._published[key] = value
            return
        if self._published[key] == value:
            self._pending.pop(key, None)
            return
        last = self._last_report.get(key)
        if last is None or now - last >= self.hold_s:
            self._publish(key, value, now)
        else:
            self._pending[key] = value

    def _publish(self, key: K, value: V, now: float) -> None:
        self._published[key] = value
        self._last_report[key] = now
        self._pending.pop(key, None)

    def flush_due(self, now: float) -> None:
        """Publish held values whose hold time has passed."""
        for key, value in list(self._pending.items()):
            if now - self._last_report[key] >= self.hold_s:
                self._publish(key, value, now)

    def next_due(self) -> float | None:
        """When the earliest held value becomes publishable (None if none is held)."""
        if not self._pending:
            return None
        return min(self._last_report[k] + self.hold_s for k in self._pending)

    def value(self, key: K) -> V | None:
        return self._published.get(key)
