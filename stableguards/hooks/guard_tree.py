"""Count a compiled frame's C++ leaf guards by kind (for benchmarks and tests).

It reads torch's C++ guard tree, so it lives in the hook layer; it hooks nothing.

Dict guard managers keep their key and value managers apart from their other
children, so a walk over ``get_child_managers`` alone misses every guard
under a dict (the optimizer state's, for one).
"""

from __future__ import annotations

import collections
from typing import Any


def leaf_guard_kinds(root: Any) -> collections.Counter[str]:
    """Leaf guards under ``root`` (a guard manager), counted by their type's name."""
    import torch._C._dynamo.guards as guards

    kinds: collections.Counter[str] = collections.Counter()
    stack = [root]
    while stack:
        manager = stack.pop()
        for leaf in manager.get_leaf_guards():
            kinds[type(leaf).__name__] += 1
        stack += manager.get_child_managers()
        if isinstance(manager, guards.DictGuardManager):
            for pair in manager.get_key_value_managers().values():
                stack += [m for m in pair if m is not None]
    return kinds
