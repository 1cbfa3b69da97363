"""What the hyperparameter feature keeps between the hooks of one compile."""

from __future__ import annotations

import weakref
from typing import Any


class Hyperparams:
    def __init__(self) -> None:
        # ShapeEnv -> how many guards it had when AOTAutograd started tracing with it.
        self.aot_guards_from: weakref.WeakKeyDictionary[Any, int] = weakref.WeakKeyDictionary()
        # id(inductor's decomposition table) -> (it, its copy with the foreach lerp that keeps a
        # scheduled weight symbolic).
        self.decomp_tables: dict[int, tuple[dict, dict]] = {}
        # ShapeEnvs whose graph must not go into AOTAutograd's cache (hooks._save_aot).
        self.aot_not_cached: weakref.WeakSet[Any] = weakref.WeakSet()


STATE = Hyperparams()
