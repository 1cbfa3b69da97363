"""Scheduled hyperparameters stay graph inputs: where AOTAutograd and inductor are told.

The rewrites are plain FX graph surgery in ``stableguards.hyperparams.rewrite``;
here they run before AOTAutograd lifts float symbols into tensor math, inductor's
foreach-lerp decomposition keeps a scheduled weight symbolic, and a graph whose
scheduled floats AOTAutograd guarded is specialized or kept out of its cache.
"""

from __future__ import annotations

import inspect
from typing import Any

from stableguards.hooks import seams
from stableguards.hooks.core import Hook
from stableguards.hyperparams import messages
from stableguards.hyperparams.rewrite import hyperparameter_source, lerp_without_pinning, rewrite
from stableguards.hyperparams.state import STATE


def _aot_starts(call: Any, *args: Any, **kwargs: Any) -> Any:
    """Remember where AOTAutograd's guards on this ShapeEnv begin (see _guarded_in_aot)."""
    shape_env = inspect.signature(call.fn).bind(*args, **kwargs).arguments["shape_env"]
    if shape_env is not None:
        STATE.aot_guards_from[shape_env] = len(shape_env.guards)
    return call(*args, **kwargs)


def _tensorify(call: Any, module: Any) -> None:
    """Before AOTAutograd lifts SymFloats into tensor math, rewrite the uses of scheduled
    hyperparameters it cannot lift (``alpha=-lr``, ``beta1 ** step``), so a learning-rate
    change reuses the graph instead of recompiling (stableguards.hyperparams.rewrite)."""
    from torch._guards import detect_fake_mode

    fake_mode = detect_fake_mode()
    shape_env = getattr(fake_mode, "shape_env", None)
    if shape_env is None:
        return call(module)

    scheduled = {s for s in shape_env.var_to_sources if _is_hyperparameter(shape_env, s)}
    if not scheduled:
        return call(module)
    lifted = rewrite(module.graph, lambda value: bool(value.node.expr.free_symbols)
                     and value.node.expr.free_symbols <= scheduled, fake_mode)
    if lifted:
        module.recompile()
        messages.lifted(lifted)
    call(module)
    # After the pass: torch 2.13 specializes a float it cannot lift with a local guard.
    guarded = _guarded_in_aot(shape_env, scheduled)
    if pinned := {s for expr in guarded if _pins(expr) for s in expr.free_symbols & scheduled}:
        messages.specialized(
            sorted(src.name for s in pinned for src in shape_env.var_to_sources.get(s, ())[:1]))
        _specialize(pinned)
    if guarded:
        STATE.aot_not_cached.add(shape_env)


def _decomp_table(call: Any) -> dict:
    """inductor's decomposition table, with ``_foreach_lerp.Scalar`` decomposed so that a
    scheduled weight (Adam's ``1 - beta1``) stays an input (hyperparams.rewrite.lerp_without_pinning)."""
    import torch

    table = call()
    op = torch.ops.aten._foreach_lerp.Scalar
    if op not in table:
        return table
    cached = STATE.decomp_tables.get(id(table))
    if cached is None or cached[0] is not table:
        copy = dict(table)
        copy[op] = lerp_without_pinning(table[op], _weight_is_scheduled)
        cached = STATE.decomp_tables[id(table)] = (table, copy)
    return cached[1]


def _weight_is_scheduled(value: Any) -> bool:
    symbols = value.node.expr.free_symbols
    return bool(symbols) and all(_is_hyperparameter(value.node.shape_env, s) for s in symbols)


def _is_hyperparameter(shape_env: Any, symbol: Any) -> bool:
    """A float symbol Dynamo made for a value in an optimizer's param group."""
    from torch.utils._sympy.symbol import SymT, symbol_is_type

    return symbol_is_type(symbol, SymT.FLOAT) and any(
        hyperparameter_source(source.name) for source in shape_env.var_to_sources.get(symbol, ()))


def _guarded_in_aot(shape_env: Any, scheduled: set) -> list:
    """Guards on scheduled symbols that AOTAutograd or inductor added while tracing.

    Such a guard lives only in this ShapeEnv: AOTAutograd's cache keeps guards
    on integer inputs only, so a later compile that hit this graph's entry
    would run it for any value of the float, without the guard.  (torch
    restarts for its own float specializations for the same reason, #194976.)
    One that pins a value (inductor's own foreach-lerp decomposition, under
    ``fallback_random``, reads the weight with ``torch.tensor(w).item()``; torch
    2.13's tensorify guards a float it cannot lift) specializes the float; others
    (``lerp`` choosing its formula by ``|w| < 0.5``) keep it an input, and this
    graph is not put in AOTAutograd's cache (``_save_aot``), so every compile
    of it traces and guards again.
    """
    start = STATE.aot_guards_from.get(shape_env, 0)
    return [guard.expr for guard in shape_env.guards[start:] if guard.expr.free_symbols & scheduled]


def _pins(expr: Any) -> bool:
    import sympy

    return isinstance(expr, sympy.Eq)


def _save_aot(call: Any, *args: Any, **kwargs: Any) -> None:
    """Leave out of AOTAutograd's cache a graph whose scheduled floats it guarded (see
    _guarded_in_aot): the cache would drop those guards."""
    if not STATE.aot_not_cached:
        return call(*args, **kwargs)  # the usual case: no ShapeEnv to look for
    from torch._guards import detect_fake_mode

    shape_env = getattr(detect_fake_mode(), "shape_env", None)
    if shape_env is not None and shape_env in STATE.aot_not_cached:
        messages.graph_not_cached()
        seams.signal("graph.declined", "its graph guards a scheduled hyperparameter, which AOTAutograd's cache "
                                       "entry would not check (stableguards.hyperparams)")
        return None
    return call(*args, **kwargs)


def _specialize(symbols: set) -> None:
    """Trace the frame again with these floats as constants, as torch's tensorify does
    for a float it cannot lift: Dynamo then guards their values itself."""
    from torch._dynamo.exc import TensorifyScalarRestartAnalysis
    from torch._dynamo.symbolic_convert import TensorifyState

    for symbol in symbols:
        TensorifyState.specialize(str(symbol))
    raise TensorifyScalarRestartAnalysis


HOOKS = [
    # Lazy: graph_compile imports inductor.
    Hook("torch._functorch._aot_autograd.graph_compile", "_apply_tensorify_python_scalars", "hyperparams",
         _tensorify, params=("module",), lazy=True),
    Hook("torch._functorch._aot_autograd.autograd_cache", "AOTAutogradCache.save", "hyperparams", _save_aot,
         lazy=True),
    # The table select_decomp_table returns unless config.fallback_random (then the float
    # is pinned and specialized, as without this hook).
    Hook("torch._inductor.decomposition", "fast_random_decomps", "hyperparams", _decomp_table, lazy=True),
    Hook("torch._functorch.aot_autograd", "create_aot_state", "hyperparams", _aot_starts, params=("shape_env",),
         lazy=True),
]
