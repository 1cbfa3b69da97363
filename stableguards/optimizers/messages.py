"""What the optimizer feature tells the event log."""

from __future__ import annotations

from stableguards.events import EVENTS


def state_guards_versioned(state_dicts: int, identity_guards: int) -> None:
    """A step's state tensors were guarded by their dicts' versions instead of their identities."""
    EVENTS.count("optimizer_state_dicts_versioned", state_dicts)
    EVENTS.count("optimizer_identity_guards_dropped", identity_guards)


def released(optimizer: str, entries: int) -> None:
    EVENTS.count("optimizer_entries_released", entries)
    EVENTS.note(f"optimizer {optimizer} was collected: released {entries} cache entr"
                f"{'y' if entries == 1 else 'ies'} compiled for it")
