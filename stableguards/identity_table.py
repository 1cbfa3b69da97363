"""Values attached to objects by identity, for as long as each object lives."""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any, Generic, TypeVar

V = TypeVar("V")


class IdentityTable(Generic[V]):
    """Values attached to objects by identity, for as long as each object lives.

    Never calls the object's ``__eq__`` or ``__hash__`` (a ``WeakKeyDictionary``
    would).  An entry goes when its object dies (a weakref finalizer runs
    before the object's memory, and so its ``id()``, can be reused).  An
    object that cannot be weakly referenced is kept alive by the table, as
    torch keeps every backend alive.
    """

    def __init__(self) -> None:
        self._values: dict[int, tuple[V, Any]] = {}

    def get(self, obj: object, make: Callable[[], V]) -> V:
        entry = self._values.get(id(obj))
        if entry is not None:
            return entry[0]
        value = make()
        try:
            weakref.finalize(obj, self._values.pop, id(obj), None)
            self._values[id(obj)] = (value, None)
        except TypeError:
            self._values[id(obj)] = (value, obj)  # keeps obj alive: its id stays its own
        return value

    def peek(self, obj: object) -> V | None:
        entry = self._values.get(id(obj))
        return None if entry is None else entry[0]

    def __len__(self) -> int:
        return len(self._values)
