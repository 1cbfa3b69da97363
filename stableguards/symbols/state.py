"""Which source holds each symbol id, per scope (a ShapeEnv), so a collision can name both."""

from __future__ import annotations

import weakref

from stableguards.symbols import messages
from stableguards.symbols.ids import DEFAULT_ID_SPACE, allocate


class SymbolIds:
    def __init__(self, id_space: int = DEFAULT_ID_SPACE) -> None:
        self.id_space = id_space
        # Weak: a finished compile's scope and its table go together.
        self._holders: weakref.WeakKeyDictionary[object, dict[int, str]] = weakref.WeakKeyDictionary()

    def symbol_id(self, scope: object, source_name: str, taken: set[int]) -> int:
        """Give ``source_name`` its stable id within ``scope`` and record it in ``taken``."""
        allocation = allocate(source_name, taken, self.id_space)
        holders = self._holders.setdefault(scope, {})
        taken.add(allocation.id)
        holders[allocation.id] = source_name
        holder = holders.get(allocation.home)
        repeat = bool(allocation.probes) and holder == source_name
        messages.allocated(allocation.probes, repeat=repeat)
        if allocation.probes and not repeat:
            messages.collision(source_name, allocation.home, holder, allocation.id, allocation.probes)
        return allocation.id


STATE = SymbolIds()
