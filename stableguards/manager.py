"""The guard manager: the one object Dynamo consults while ``stable_guards`` is on.

It owns the stable parts (symbol ids now; profiles, backend matching and
optimizer guards as they arrive), counts what they do and can say why.  It is
plain Python: the hooks in ``stableguards.integration`` call it with plain
values, and tests can drive it without Dynamo.
"""

from __future__ import annotations

import weakref
from collections import Counter, deque
from dataclasses import dataclass

from stableguards.symbols import DEFAULT_ID_SPACE, allocate

# Explanations are kept for the most recent events only: a long-running job
# must not grow memory because it compiles often.
_MAX_EVENTS = 256


@dataclass(frozen=True)
class Collision:
    """A source whose home slot was taken, so its id depends on creation order."""

    source: str
    home: int
    holder: str | None
    id: int
    probes: int

    def describe(self) -> str:
        holder = repr(self.holder) if self.holder else "an id allocated outside stableguards"
        return (
            f"source {self.source!r} wanted symbol id {self.home} (held by {holder}) and got "
            f"{self.id} after {self.probes} probe(s): its symbol (s{self.id}, or zf{self.id} "
            f"for a float) is part of the FX-graph and AOTAutograd cache keys via str(symbol), "
            f"so it is stable only while these sources are created in the same order"
        )


@dataclass(frozen=True)
class Fallback:
    """A hook that failed and handed the call back to upstream torch."""

    hook: str
    error: str

    def describe(self) -> str:
        return f"hook {self.hook!r} failed ({self.error}); torch's own behaviour was used"


class GuardManager:
    """Allocates stable symbol ids, keeps counters, and explains what happened."""

    def __init__(self, id_space: int = DEFAULT_ID_SPACE) -> None:
        self.id_space = id_space
        self.counters: Counter[str] = Counter()
        self._events: deque[Collision | Fallback] = deque(maxlen=_MAX_EVENTS)
        # Which source holds each id, per scope (a ShapeEnv under Dynamo), so a
        # collision can name the source it collided with.  Weak, so a finished
        # compile's scope and table go away together.
        self._holders: weakref.WeakKeyDictionary[object, dict[int, str]] = (
            weakref.WeakKeyDictionary()
        )

    def symbol_id(self, scope: object, source_name: str, taken: set[int]) -> int:
        """Give ``source_name`` its stable id within ``scope`` and record it in ``taken``."""
        allocation = allocate(source_name, taken, self.id_space)
        holders = self._holders.setdefault(scope, {})
        taken.add(allocation.id)
        holders[allocation.id] = source_name
        self.counters["symbols_allocated"] += 1
        if allocation.probes:
            self.counters["symbol_collisions"] += 1
            self.counters["symbol_probes"] += allocation.probes
            self._events.append(
                Collision(
                    source_name,
                    allocation.home,
                    holders.get(allocation.home),
                    allocation.id,
                    allocation.probes,
                )
            )
        return allocation.id

    def record_fallback(self, hook: str, error: BaseException) -> None:
        """Count a hook that failed open; the caller has already fallen back."""
        self.counters["fallbacks"] += 1
        self._events.append(Fallback(hook, f"{type(error).__name__}: {error}"))

    def explain(self) -> str:
        """Counters so far and, newest last, the events that make a restart miss or differ."""
        lines = ["stableguards: " + (_format_counters(self.counters) or "nothing recorded yet")]
        lines += ["  " + event.describe() for event in self._events]
        return "\n".join(lines)

    def reset(self) -> None:
        """Forget counters and events (ids already handed out keep their meaning)."""
        self.counters.clear()
        self._events.clear()


def _format_counters(counters: Counter[str]) -> str:
    return ", ".join(f"{name}={value}" for name, value in sorted(counters.items()))
