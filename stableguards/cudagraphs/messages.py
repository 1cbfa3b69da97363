"""What the cudagraph feature tells the event log."""

from __future__ import annotations

from collections.abc import Sequence

from stableguards.cudagraphs.checks import copied_grads_message
from stableguards.events import EVENTS, log


def static_inputs_moved(description: str) -> None:
    """A cudagraph is re-recorded because static inputs moved: worth a warning, every time."""
    EVENTS.count("cudagraph_rerecords")
    EVENTS.note(description)
    log.warning("stableguards: %s", description)


def copied_grads(names: Sequence[str]) -> bool:
    """Which grads of an optimizer cudagraphs will copy (said once per optimizer)."""
    log.warning(copied_grads_message(names))
    return True
