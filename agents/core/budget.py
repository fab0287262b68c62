"""How long a search may run: a deadline read from a clock the caller passes in (core
never reads the time itself). A search asks it every few steps and, once it has
expired, stands by the best choice it has found so far."""

from __future__ import annotations

from collections.abc import Callable

Expired = Callable[[], bool]

# Steps between two looks at the clock: a step costs microseconds, a look about as much.
CHECK_EVERY = 4
# What one GetPreferredAllocation may spend searching. The kubelet waits for the answer
# with every other pod's admission held up; the searches finish well within it on
# regular nodes, and past it the best choice found so far is answered.
PREFERRED_ALLOCATION_S = 0.001


def never() -> bool:
    """No deadline: the search runs to the proven best."""
    return False


def deadline(clock: Callable[[], float], seconds: float) -> Expired:
    """Expired once `clock` reads `seconds` past its reading now."""
    end = clock() + seconds

    def expired() -> bool:
        return clock() >= end

    return expired


class Watch:
    """Counts a search's steps and looks at the deadline on the first step and every
    CHECK_EVERY after; once expired it stays so, without asking again."""

    def __init__(self, expired: Expired) -> None:
        self._expired = expired
        self.steps = 0
        self.stopped = False

    def step(self) -> bool:
        """Count one step; True when the search must stop."""
        self.steps += 1
        if not self.stopped and self.steps % CHECK_EVERY == 1:
            self.stopped = self._expired()
        return self.stopped
