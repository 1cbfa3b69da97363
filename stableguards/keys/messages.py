"""What cache-key explanations tell the event log."""

from __future__ import annotations

from stableguards.events import EVENTS


def recompiled(frame: str, reasons: list[str]) -> None:
    """Why Dynamo compiled a frame again: the guards that failed, as torch reports them."""
    EVENTS.count("recompiles")
    EVENTS.note(f"{frame} recompiled: " + "; ".join(reasons))


def fx_cache_miss(key: str, nearest: str | None, differences: list[str]) -> None:
    """An FX-graph cache miss, against the closest key recorded before, if any."""
    EVENTS.count("fx_cache_misses")
    if nearest is None:
        return  # nothing recorded to compare with: a cold cache says nothing useful
    if not differences:
        EVENTS.note(f"FX-graph cache miss for key {key[:12]}: the closest recorded key {nearest[:12]} has the same "
                    f"components as inductor prints them: what differs is hashed outside them (a value torch "
                    f"pickles into the key but not into its debug lines)")
        return
    shown = "; ".join(differences[:6]) + (f"; and {len(differences) - 6} more" if len(differences) > 6 else "")
    EVENTS.note(f"FX-graph cache miss for key {key[:12]}: the closest recorded key {nearest[:12]} differs in "
                f"{shown}")


def operator_bypass(why: str) -> None:
    """A graph that calls a custom operator whose kernels cannot all be described: no cache."""
    EVENTS.count("operator_cache_bypasses")
    EVENTS.note(f"FX-graph and AOTAutograd caches bypassed: {why}")
