"""What BACKEND_MATCH tells the event log."""

from __future__ import annotations

from stableguards.fingerprint import BackendFingerprint
from stableguards.events import EVENTS


def switched(frame: str, new: BackendFingerprint, cached: list[BackendFingerprint | str]) -> None:
    """A frame compiled for a backend it had no code for, while it had code for others:
    names the components that tell the new backend from the closest one it has code for."""
    EVENTS.count("backend_switches")
    known = [c for c in cached if isinstance(c, BackendFingerprint)]
    why = ""
    if known:
        closest = min(known, key=lambda c: len(new.differences(c)))
        differs = new.differences(closest)
        why = (f"; the closest, {closest}, differs in {'; '.join(differs[:3])}"
               + (f"; and {len(differs) - 3} more" if len(differs) > 3 else ""))
    EVENTS.note(f"{frame}: compiled for backend {new}: its code for {len(cached)} other backend(s) is never "
                f"served to it (BACKEND_MATCH){why}")


def released(backend: str, entries: int) -> None:
    EVENTS.count("backend_entries_released", entries)
    EVENTS.note(f"backend {backend} is gone: released {entries} cache entr{'y' if entries == 1 else 'ies'} "
                f"compiled for it")
