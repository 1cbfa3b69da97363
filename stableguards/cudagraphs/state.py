"""What the cudagraph feature records: static-input addresses per recording, and the names of
recent compiles' graph inputs."""

from __future__ import annotations

import collections
from typing import Any

from stableguards.cudagraphs.checks import StaticInputWatch
from stableguards.identity_table import IdentityTable

# Dynamo sources of the graph inputs of this many recent compiles (cudagraph names).
_MAX_COMPILES_NAMED = 256


class Cudagraphs:
    def __init__(self) -> None:
        self.static_inputs = StaticInputWatch()
        self.input_sources: collections.OrderedDict[Any, list[str]] = collections.OrderedDict()
        # Optimizers whose copied grads were already warned about.
        self.copied_grads_told: IdentityTable[bool] = IdentityTable()

    def note_input_sources(self, compile_id: Any, sources: list[str]) -> None:
        self.input_sources[compile_id] = sources
        while len(self.input_sources) > _MAX_COMPILES_NAMED:
            self.input_sources.popitem(last=False)

    def reset(self) -> None:
        """Forget the recordings and names (the optimizers already warned about stay)."""
        self.static_inputs = StaticInputWatch()
        self.input_sources.clear()


STATE = Cudagraphs()
