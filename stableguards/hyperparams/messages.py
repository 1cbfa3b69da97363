"""What the hyperparameter feature tells the event log."""

from __future__ import annotations

from stableguards.events import EVENTS


def lifted(uses: int) -> None:
    """Uses of scheduled hyperparameters rewritten so the graph takes them as inputs."""
    EVENTS.count("hyperparameter_uses_lifted", uses)


def specialized(sources: list[str]) -> None:
    """A scheduled hyperparameter was made a constant again: AOTAutograd or inductor pinned its
    value while tracing."""
    EVENTS.count("hyperparameters_specialized")
    EVENTS.note(f"specialized {', '.join(sources)}: a decomposition pinned its value, and AOTAutograd's cache "
                f"would drop that guard; each new value recompiles")


def graph_not_cached() -> None:
    """A step graph left out of AOTAutograd's cache: its cache would drop guards on a scheduled
    hyperparameter."""
    EVENTS.count("hyperparameter_graphs_not_cached")
