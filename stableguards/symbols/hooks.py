"""Stable symbol ids: where the ShapeEnv asks stableguards for each new symbol's id."""

from __future__ import annotations

from typing import Any

from stableguards.hooks.core import Hook
from stableguards.symbols.state import STATE

_SYMBOLIC_SHAPES = "torch.fx.experimental.symbolic_shapes"


def _generate_unique_id(call: Any, shape_env: Any, source_name: str) -> int:
    """A new symbol's id from a hash of its source's name (``symbols.ids``), not creation order."""
    return STATE.symbol_id(shape_env, source_name, shape_env.unique_ids)


HOOKS = [
    # Upstream: sha256(source) % 100 with probing, so ids follow creation order.
    Hook(_SYMBOLIC_SHAPES, "ShapeEnv._generate_unique_id", "symbols", _generate_unique_id,
         params=("source_name",)),
]
