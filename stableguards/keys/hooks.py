"""Why a compile happened: FX-graph cache misses and recompiles, told to the event log.

A miss is explained by diffing inductor's key components against the closest
key recorded before (``stableguards.keys.ledger``); a recompile by the guards
torch reports as failed.  Both keys carry what the custom operators a graph
calls compute, not only their names.
"""

from __future__ import annotations

import os
from typing import Any

from stableguards.codes import frame_label
from stableguards.hooks.core import Hook, TorchError, cache_subdir
from stableguards.hooks.operators import Opaque, custom_operators, kernels
from stableguards.keys import messages
from stableguards.keys.ledger import KeyLedger, KeyRecord, SharedKeyLedger, differences, nearest
from stableguards.storage import STORE_ENV, Unavailable, Unusable, configured
from stableguards.storage.artifacts import holds_fx_graph


def _compiled_fx_graph_hash(call: Any, *args: Any, **kwargs: Any) -> Any:
    """An FX-graph cache key with its components: a miss is diffed against the closest one."""
    key, debug_lines = call(*args, **kwargs)
    _explain_fx_key(key, debug_lines)
    return key, debug_lines


def _explain_fx_key(key: str, debug_lines: list[str]) -> None:
    """On a miss (local, and in the shared store if one serves), diff the key against the
    closest one recorded; then record it."""
    from torch._inductor.codecache import FxGraphCache

    record = KeyRecord.from_debug_lines(key, debug_lines)
    local_miss = not os.path.exists(FxGraphCache._get_tmp_dir_for_key(key))
    if not os.environ.get(STORE_ENV):
        _explain(record, KeyLedger(cache_subdir("fxkeys")), local_miss)
        return
    try:
        _explain(record, SharedKeyLedger(configured(None).unsigned()), local_miss and not holds_fx_graph(key))
    except (Unavailable, Unusable):
        pass  # warned about where artifacts are read; this only explains


def _explain(record: KeyRecord, ledger: KeyLedger | SharedKeyLedger, missed: bool) -> None:
    if missed:
        closest = nearest(record, ledger.recent())
        messages.fx_cache_miss(record.key, closest.key if closest else None,
                               differences(record, closest) if closest else [])
    ledger.record(record)


def _with_operator_kernels(call: Any, self: Any, gm: Any, *args: Any, **kwargs: Any) -> None:
    """An FX-graph or AOTAutograd cache key (AOTAutograd's details are FX-graph details too)
    also carries what the custom operators its graph calls compute (``hooks.operators``):
    torch's key names an operator, and a library upgraded between two processes keeps the
    name while the graph holds its new decomposition, fake kernel or backward.  A graph
    calling one whose kernels cannot all be described bypasses the cache, named."""
    call(self, gm, *args, **kwargs)
    found = custom_operators(gm) if gm is not None else []
    if not found:
        return  # torch's key, unchanged
    try:
        self.stableguards_operators = tuple(kernels(op) for op in found)
    except Opaque as why:
        from torch._inductor.codecache import BypassFxGraphCache

        messages.operator_bypass(str(why))
        raise TorchError(BypassFxGraphCache(f"stableguards: {why}")) from None


def _recompilation_reasons(call: Any, cache_entry: Any, frame: Any, *args: Any, **kwargs: Any) -> Any:
    """Why a frame recompiled: the guards that failed, in the event log."""
    reasons = call(cache_entry, frame, *args, **kwargs)
    if reasons:
        messages.recompiled(frame_label(frame.f_code), [str(r) for r in reasons])
    return reasons


HOOKS = [
    # FxGraphCache.prepare_key calls compiled_fx_graph_hash by its module-global name.
    Hook("torch._inductor.codecache", "compiled_fx_graph_hash", "keys", _compiled_fx_graph_hash,
         lazy=True),
    Hook("torch._inductor.codecache", "FxGraphHashDetails.__init__", "keys", _with_operator_kernels,
         params=("gm",), lazy=True),
    # convert_frame imported it by name: its copy is the one called.
    Hook("torch._dynamo.convert_frame", "get_and_maybe_log_recompilation_reasons", "keys",
         _recompilation_reasons, params=("frame",)),
]
