"""stableguards: make torch.compile reuse its work across process restarts.

Turn it on with ``torch._dynamo.config.stable_guards = True`` (or the
environment variable ``TORCHDYNAMO_STABLE_GUARDS=1``).  Importing this package,
or importing torch with the package installed, registers the flag; nothing
changes until it is on.
"""

from __future__ import annotations

from stableguards.hooks import STATE as _STATE
from stableguards.hooks import arm as _arm
from stableguards.optimizer_guards import static_grads

__all__ = ["explain", "manager", "static_grads"]

manager = _STATE.manager


def explain() -> str:
    """Why restarts missed or recompiled: the manager's counters and recent events."""
    return manager.explain()


_arm()
