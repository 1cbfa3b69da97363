"""Read a compiled frame's C++ guard tree: its leaf guards, by source and kind.

It reads torch's C++ guard tree, so it lives in the hook layer; it hooks nothing.

Dict guard managers keep their key and value managers apart from their other
children, so a walk over ``get_child_managers`` alone misses every guard
under a dict (the optimizer state's, for one).  The root also keeps epilogue
guards apart from its leaves; their kind is prefixed ``EPILOGUE_``.
"""

from __future__ import annotations

import collections
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Leaf:
    """One leaf guard: the source its manager guards, its kind, its code, and the type of
    the value its manager was built for."""

    source: str
    kind: str
    parts: tuple[str, ...]
    guarded_type: Any


def managers(root: Any) -> Iterator[Any]:
    """Every guard manager under ``root`` (a guard manager), ``root`` first."""
    import torch._C._dynamo.guards as guards

    stack = [root]
    while stack:
        manager = stack.pop()
        yield manager
        stack += manager.get_child_managers()
        if isinstance(manager, guards.DictGuardManager):
            for pair in manager.get_key_value_managers().values():
                stack += [m for m in pair if m is not None]


def leaves(root: Any) -> Iterator[Leaf]:
    """Every leaf guard under ``root`` (a RootGuardManager), epilogue guards included."""
    for manager in managers(root):
        source = manager.get_source()
        guarded = manager.get_type_of_guarded_value()
        for leaf in manager.get_leaf_guards():
            yield Leaf(source, type(leaf).__name__, tuple(leaf.verbose_code_parts()), guarded)
    for leaf in root.get_epilogue_lambda_guards():
        # Epilogue lambdas run after every other guard; torch compiles them from their code.
        yield Leaf(root.get_source(), f"EPILOGUE_{type(leaf).__name__}", tuple(leaf.verbose_code_parts()), None)


def leaf_guard_kinds(root: Any) -> collections.Counter[str]:
    """Leaf guards under ``root`` (a guard manager), counted by their type's name."""
    return collections.Counter(leaf.kind for leaf in leaves(root))
