"""stableguards: make torch.compile reuse its work across process restarts.

Turn it on with ``torch._dynamo.config.stable_guards = True`` (or the
environment variable ``TORCHDYNAMO_STABLE_GUARDS=1``).  Importing this package,
or importing torch with the package installed, registers the flag; nothing
changes until it is on.
"""

from __future__ import annotations

from stableguards import registry as _registry
from stableguards.events import EVENTS
from stableguards.hooks import arm as _arm
from stableguards.optimizers.lives import static_grads

__all__ = ["EVENTS", "counters", "explain", "reset", "static_grads"]


def explain() -> str:
    """Why restarts missed, recompiled, bypassed a cache or left a frame out: the counters and
    recent events, newest last."""
    return EVENTS.explain(_registry.DISABLED)


def counters() -> dict[str, int]:
    """What stableguards counted in this process (hits, misses, left-out frames, fallbacks)."""
    return dict(EVENTS.counters)


def reset() -> None:
    """Forget what every part counted and explained (for tests)."""
    _registry.reset()


_arm()
