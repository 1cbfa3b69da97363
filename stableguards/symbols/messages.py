"""What stable symbol ids tell the event log."""

from __future__ import annotations

from stableguards.events import EVENTS


def allocated(probes: int, *, repeat: bool) -> None:
    EVENTS.count("symbols_allocated")
    if repeat:
        # One source given several symbols (torch's ephemeral sources): numbered in
        # creation order, as upstream does; not a clash between sources.
        EVENTS.count("symbol_repeats")
    elif probes:
        EVENTS.count("symbol_collisions")
        EVENTS.count("symbol_probes", probes)


def collision(source: str, home: int, holder: str | None, symbol_id: int, probes: int) -> None:
    """A source whose home slot was taken, so its id depends on creation order."""
    held_by = repr(holder) if holder else "an id allocated outside stableguards"
    EVENTS.note(f"source {source!r} wanted symbol id {home} (held by {held_by}) and got {symbol_id} after "
                f"{probes} probe(s): its symbol (s{symbol_id}, or zf{symbol_id} for a float) is part of the "
                f"FX-graph and AOTAutograd cache keys via str(symbol), so it is stable only while these "
                f"sources are created in the same order")
