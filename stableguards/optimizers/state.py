"""What the optimizer feature keeps: which entries depend on which optimizer, and what each
trace saw of optimizers."""

from __future__ import annotations

import weakref
from dataclasses import dataclass, field
from typing import Any

from stableguards.identity_table import IdentityTable
from stableguards.optimizers.lives import OptimizerLives


@dataclass
class Trace:
    """What one trace (one TracingContext) saw of optimizers."""

    # Per optimizer step: (weak optimizer, [(source of opt.state[p], that dict)]).
    steps: list[tuple[weakref.ref[Any], list[tuple[Any, dict]]]] = field(default_factory=list)
    # Every optimizer the frame saw, by identity.
    seen: dict[int, weakref.ref[Any]] = field(default_factory=dict)


class Optimizers:
    def __init__(self) -> None:
        # Set by optimizers.hooks, whose callback releases a dead optimizer's entries.
        self.lives: OptimizerLives | None = None
        # What each trace (by its TracingContext) saw of optimizers.
        self.traces: IdentityTable[Trace] = IdentityTable()


STATE = Optimizers()
