"""Why a compile happened: FX-graph cache misses and recompiles, told to the manager.

A miss is explained by diffing inductor's key components against the closest
key recorded before (``stableguards.key_diff``); a recompile by the guards
torch reports as failed.
"""

from __future__ import annotations

import os
from typing import Any

from stableguards.hooks.core import Hook, cache_subdir
from stableguards.hooks.state import STATE
from stableguards.key_diff import KeyLedger, KeyRecord, differences, nearest


def _compiled_fx_graph_hash(call: Any, *args: Any, **kwargs: Any) -> Any:
    key, debug_lines = call(*args, **kwargs)
    _explain_fx_key(key, debug_lines)
    return key, debug_lines


def _explain_fx_key(key: str, debug_lines: list[str]) -> None:
    """On a local miss, diff the key against the closest one recorded; then record it."""
    from torch._inductor.codecache import FxGraphCache

    ledger = KeyLedger(cache_subdir("fxkeys"))
    record = KeyRecord.from_debug_lines(key, debug_lines)
    if not os.path.exists(FxGraphCache._get_tmp_dir_for_key(key)):
        closest = nearest(record, ledger.recent())
        STATE.manager.note_cache_miss(key, closest.key if closest else None,
                                      differences(record, closest) if closest else [])
    ledger.record(record)


def _recompilation_reasons(call: Any, cache_entry: Any, frame: Any, *args: Any, **kwargs: Any) -> Any:
    reasons = call(cache_entry, frame, *args, **kwargs)
    if reasons:
        code = frame.f_code
        STATE.manager.note_recompile(f"{code.co_name} ({code.co_filename}:{code.co_firstlineno})",
                                     [str(r) for r in reasons])
    return reasons


HOOKS = [
    # FxGraphCache.prepare_key calls compiled_fx_graph_hash by its module-global name.
    Hook("torch._inductor.codecache", "compiled_fx_graph_hash", "keys", _compiled_fx_graph_hash,
         lazy=True),
    # convert_frame imported it by name: its copy is the one called.
    Hook("torch._dynamo.convert_frame", "get_and_maybe_log_recompilation_reasons", "keys",
         _recompilation_reasons, params=("frame",)),
]
