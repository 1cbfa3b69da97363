"""What profiles tell the event log."""

from __future__ import annotations

from collections.abc import Iterable

from stableguards.events import EVENTS
from stableguards.profiles.profile import CodeKey, Dim


def none_yet(where: str) -> None:
    EVENTS.note(f"profile {where}: none yet, compiling cold")


def loaded(where: str, sources: int, frames: int) -> None:
    EVENTS.note(f"profile {where}: loaded {sources} source(s) in {frames} frame(s)")


def specialized(found: Iterable[tuple[CodeKey, str, Dim]], what: str) -> None:
    """Sources whose dimension a compile specialized: ``what`` happens to them."""
    for code, source, dim in sorted(found, key=lambda f: (f[0].sort_key(), f[1], str(f[2]))):
        EVENTS.note(f"source {source!r} of {code.name} at {code.filename}:{code.firstlineno} {what}: {dim}")
