"""Optimizer steps: fewer, cheaper guards, no O(N^2) write-back, entries that die with the optimizer.

The reasoning (why a dict's version proves what its tensors' identities did,
why a rebuilt optimizer is not served the old step) is in
``stableguards.optimizer_guards``; here is where Dynamo is told.
"""

from __future__ import annotations

import inspect
import sys
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from stableguards.hooks.core import Hook, registered_name
from stableguards.hooks.state import STATE
from stableguards.hyperparams import hyperparameter_source, lerp_without_pinning, rewrite
from stableguards.optimizer_guards import OptimizerLives

_OPTIMIZER = "torch._dynamo.variables.optimizer"
_CONVERT_FRAME = "torch._dynamo.convert_frame"

# Dict version tags: PEP 509, deprecated in 3.12 and gone in 3.14, where torch
# checks dicts otherwise.  Where the tags are not there, upstream's guards stay.
DICT_VERSIONS_SOUND = sys.version_info < (3, 14)
# Backends that run the traced ops as they are, so their code does not depend on
# a grad's strides.
_STRIDE_AGNOSTIC_BACKENDS = frozenset({"eager", "aot_eager"})


@dataclass
class _Trace:
    """What one trace (one TracingContext) saw of optimizers."""

    # Per optimizer step: (weak optimizer, [(source of opt.state[p], that dict)]).
    steps: list[tuple[weakref.ref[Any], list[tuple[Any, dict]]]] = field(default_factory=list)
    # Every optimizer the frame saw, by identity.
    seen: dict[int, weakref.ref[Any]] = field(default_factory=dict)


def _convert_frame(call: Any, self: Any, frame: Any, cache_entry: Any, *args: Any, **kwargs: Any) -> Any:
    """Remember which compiler the frame is compiled for (grads' guards depend on it).

    Also a safe point for releasing the entries of collected optimizers."""
    STATE.release_pending()
    token = STATE.compiler_name.set(_compiler_name(self))
    try:
        return call(self, frame, cache_entry, *args, **kwargs)
    finally:
        STATE.compiler_name.reset(token)


def _compiler_name(convert: Any) -> str | None:
    """The innermost ``compiler_name`` along the backend chain, else the registered name."""
    obj, name = convert, None
    for _ in range(16):  # the chain is short; a loop here would be a bug elsewhere
        if isinstance(candidate := getattr(obj, "compiler_name", None), str):
            name = candidate
        following = getattr(obj, "_torchdynamo_orig_backend", None)
        if following is None:
            break
        obj = following
    return name or registered_name(obj)


def _note_seen(call: Any, self: Any, value: Any, *args: Any, **kwargs: Any) -> None:
    """Every frame that sees an optimizer, not only its step, is compiled for that object."""
    from torch._guards import TracingContext

    call(self, value, *args, **kwargs)
    context = TracingContext.try_get()
    if context is not None:
        # By identity: a user's optimizer class may define __eq__ and __hash__.
        STATE.optimizer_traces.get(context, _Trace).seen.setdefault(id(value), weakref.ref(value))


def _map_sources_and_install_guards(call: Any, self: Any, tx: Any) -> None:
    """Note each per-parameter state dict an optimizer step reads, with the source Dynamo gave it."""
    call(self, tx)
    if not DICT_VERSIONS_SOUND:
        return
    from torch._dynamo.source import AttrSource, ConstDictKeySource, DictGetItemSource

    state = AttrSource(self.source, "state")
    dicts = [(DictGetItemSource(state, ConstDictKeySource(state, i)), d)
             for i, d in enumerate(self.value.state.values()) if type(d) is dict]
    optimizer = weakref.ref(self.value)
    STATE.optimizer_traces.get(tx.output.tracing_context, _Trace).steps.append((optimizer, dicts))
    tx.output.add_graph_finalizer(_state_leaves_with(optimizer))


def _state_leaves_with(optimizer: weakref.ref[Any]) -> Callable[[Any], None]:
    """A graph finalizer: the graph drops the optimizer's state tensors when the optimizer dies.

    The graph holds them as buffers.  Upstream's finalizer pops them by the
    names of their sources, but Dynamo registers them under the names of other
    sources for the same tensors (``...state___1___exp_avg`` for
    ``...state[list(dict.keys(...))[1]]``), so a graph something else holds
    keeps every state tensor alive.  Found by identity instead, they go.
    """

    def init(gm: Any) -> None:
        opt = optimizer()
        if opt is None:
            return
        owned = {id(t) for state in opt.state.values() for t in state.values()}
        names = [n for n, t in gm._buffers.items() if id(t) in owned]
        graph = weakref.ref(gm)

        def drop() -> None:
            if (g := graph()) is not None:
                for name in names:
                    g._buffers.pop(name, None)

        weakref.finalize(opt, drop)

    return init


def _build_guards(call: Any, self: Any, code: Any, *args: Any, **kwargs: Any) -> Any:
    """Optimizer guards before the frame's guards are built; tie the entry to its optimizers after."""
    output = self.tracer_output.output_graph
    # torch asserts the output graph exists; this hook must not fail before it does.
    trace = STATE.optimizer_traces.peek(output.tracing_context) if output is not None else None
    if trace is None:
        return call(self, code, *args, **kwargs)
    if trace.steps:
        _guard_state_dicts_by_version(output, trace.steps)
    check_fn = call(self, code, *args, **kwargs)
    for optimizer in (ref() for ref in trace.seen.values()):
        if optimizer is not None:
            STATE.optimizer_lives.depend(optimizer, check_fn)  # type: ignore[union-attr]
    return check_fn


def _guard_state_dicts_by_version(output: Any, steps: list) -> None:
    """Replace identity guards on state tensors by one DICT_VERSION per state dict.

    A dict is covered only if this frame does not put a new object into it (its
    first step, say): the compiled code would change its version right away,
    and the next call would recompile for nothing.  Every new guard is made
    before any is dropped, so a failure here leaves torch's guards whole.
    """
    from torch._dynamo.guards import GuardBuilder

    side_effects = output.side_effects
    covered = {}
    for _, dicts in steps:
        for source, d in dicts:
            var = side_effects.id_to_variable.get(id(d))
            if var is not None and side_effects.is_modified(var) and var.has_new_items():
                continue
            covered[source] = d
    if not covered:
        return
    guards = output.guards
    # The dict's own guards (type, length, keys) and its values' identities: a
    # DICT_VERSION proves them all (stableguards/optimizer_guards.py says why).
    dropped = [g for g in guards if g.originating_source in covered
               or (g.create_fn_name() == "ID_MATCH"
                   and getattr(g.originating_source, "base", None) in covered)]
    versions = [source.make_guard(GuardBuilder.DICT_VERSION) for source in covered]
    for guard in dropped:
        guards.inner.discard(guard)
        guards.source_to_guards[guard.originating_source].remove(guard)
    for source, guard in zip(covered, versions, strict=True):
        output.guard_on_key_order.discard(source)
        guards.add(guard, collect_debug_stack=False)
    STATE.manager.note_optimizer_guards(len(covered), len(dropped))


def _is_from_optimizer_source(call: Any, source: Any) -> bool:
    """Grads reached through an optimizer get TENSOR_MATCH, as other inputs do.

    Upstream checks only that they are not None, so a grad whose strides changed
    reaches code compiled for the old strides: inductor's asserts fail where
    eager works.  Backends that do not specialize on strides keep the cheap
    check; an unknown backend gets the full one.  (TENSOR_MATCH proves more
    than NOT_NONE: nothing is given up.)
    """
    if STATE.compiler_name.get() in _STRIDE_AGNOSTIC_BACKENDS:
        return call(source)
    return False


def _has_new_items(call: Any, self: Any) -> bool:
    """A dict value read from the very slot it is written back to is not a new item.

    SGD stores each momentum buffer back into ``opt.state[p]`` every step.
    Upstream sees a new VariableTracker and writes the dict back after the graph,
    locating ``opt.state[p]`` by position in a walk over ``opt.state``'s keys:
    N walks per step, O(N^2).  Writing a slot's own value back is a no-op, so
    nothing needs writing.
    """
    if not call(self) or self.should_reconstruct_all:
        return call.result
    return any(_is_new(self, key, value) for key, value in self.items.items())


def _is_new(dict_var: Any, key: Any, value: Any) -> bool:
    from torch._dynamo.source import ConstDictKeySource, DictGetItemSource

    if not dict_var.is_new_item(dict_var.original_items.get(key.vt), value):
        return False
    source = value.source if value.is_realized() else None
    if not isinstance(source, DictGetItemSource) or source.base != dict_var.source:
        return True
    index = source.index
    if isinstance(index, ConstDictKeySource):
        originals = tuple(dict_var.original_items)
        if index.base != dict_var.source or index.index >= len(originals):
            return True
        slot = originals[index.index]
        return not (slot.is_python_constant() and key.vt.is_python_constant()
                    and slot.as_python_constant() == key.vt.as_python_constant())
    return not (key.vt.is_python_constant() and key.vt.as_python_constant() == index)


def _optimizer_died(description: str, check_fns: list[Any]) -> None:
    """An optimizer was collected: release the cache entries compiled for it.

    Through the CheckFunctionManager's own ``invalidate``, which also drops its
    guard manager: torch keeps some CheckFunctionManagers alive for good (its
    finalizer on ``type(G['holder'])``, an immortal ``dict``, say), and the
    guard manager must not stay with them.
    """
    from torch._dynamo.guards import DeletedGuardManagerWrapper

    def release() -> None:
        live = [c for c in check_fns if not isinstance(c.guard_manager, DeletedGuardManagerWrapper)]
        for check_fn in live:
            check_fn.invalidate(obj_str=f"optimizer {description}")
        _forget_shape_envs()
        STATE.manager.note_optimizer_released(description, len(live))

    STATE.release_soon(release)


def _forget_shape_envs() -> None:
    """Empty the caches of ShapeEnv's methods, which key on the ShapeEnv itself.

    Some are unbounded (``functools.lru_cache(None)``, or cleared only when a
    version counter moves), so every dead compile's ShapeEnv stayed reachable
    from the class: one per rebuilt optimizer, with a scheduled float symbol.
    Run at a release, when no thread compiles; live ShapeEnvs only lose cached
    answers, which they compute again.
    """
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    for attr in vars(ShapeEnv).values():
        cache_clear = getattr(attr, "cache_clear", None)
        if callable(cache_clear):
            cache_clear()


def _compute_cache_size(call: Any, frame: Any, cache_entries: Any, *args: Any) -> Any:
    """Invalidated entries (their optimizer was collected) can never run again, so they do
    not count towards the recompile limit: rebuilding an optimizer must not use up the frame's room."""
    return call(frame, [e for e in cache_entries if e.code is not None], *args)


def _aot_starts(call: Any, *args: Any, **kwargs: Any) -> Any:
    """Remember where AOTAutograd's guards on this ShapeEnv begin (see _guarded_in_aot)."""
    shape_env = inspect.signature(call.fn).bind(*args, **kwargs).arguments["shape_env"]
    if shape_env is not None:
        STATE.aot_guards_from[shape_env] = len(shape_env.guards)
    return call(*args, **kwargs)


def _tensorify(call: Any, module: Any) -> None:
    """Before AOTAutograd lifts SymFloats into tensor math, rewrite the uses of scheduled
    hyperparameters it cannot lift (``alpha=-lr``, ``beta1 ** step``), so a learning-rate
    change reuses the graph instead of recompiling (stableguards.hyperparams)."""
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
        STATE.manager.note_hyperparameters_lifted(lifted)
    call(module)
    # After the pass: torch 2.13 specializes a float it cannot lift with a local guard.
    guarded = _guarded_in_aot(shape_env, scheduled)
    if pinned := {s for expr in guarded if _pins(expr) for s in expr.free_symbols & scheduled}:
        STATE.manager.note_hyperparameter_specialized(
            sorted(src.name for s in pinned for src in shape_env.var_to_sources.get(s, ())[:1]))
        _specialize(pinned)
    if guarded:
        STATE.aot_not_cached.add(shape_env)


def _decomp_table(call: Any) -> dict:
    """inductor's decomposition table, with ``_foreach_lerp.Scalar`` decomposed so that a
    scheduled weight (Adam's ``1 - beta1``) stays an input (hyperparams.lerp_without_pinning)."""
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
        STATE.manager.note_hyperparameter_graph_not_cached()
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


def _clear_compile_context(call: Any, tracer_output: Any, compiler_fn: Any) -> None:
    """Also drop the output graph's tracked fakes where torch clears the compile context.

    They close a cycle that runs through C++: a fake parameter holds its fake grad
    in its autograd metadata, the grad holds the FakeTensorMode, the mode its
    ShapeEnv, and the ShapeEnv (``tracked_fakes``, the output graph's list) the
    fake parameter.  gc cannot see the C++ edge, so each optimizer-step compile
    kept its fakes and ShapeEnv: 50 tensors per rebuild of Adam over 10 params
    (torch 2.13, 2.14).  torch 2.15 clears the list here itself; for the
    backends it leaves alone (unregistered ones), so does this.
    """
    call(tracer_output, compiler_fn)
    names = call.fn.__globals__
    should_clear = names["config"].invalidate_compile_context_weakrefs
    if should_clear is None:
        should_clear = names["_is_registered_backend"](names["innermost_backend"](compiler_fn))
    output_graph = getattr(tracer_output, "output_graph_for_cleanup", None) if should_clear else None
    if output_graph is not None:
        output_graph.tracked_fakes.clear()


STATE.optimizer_lives = OptimizerLives(_optimizer_died)

HOOKS = [
    Hook(_CONVERT_FRAME, "ConvertFrameAssert.__call__", "optimizer", _convert_frame,
         params=("frame", "cache_entry")),
    Hook(_OPTIMIZER, "OptimizerVariable.__init__", "optimizer", _note_seen, params=("value",)),
    Hook(_OPTIMIZER, "OptimizerVariable.map_sources_and_install_guards", "optimizer",
         _map_sources_and_install_guards, params=("tx",)),
    # builder imported is_from_optimizer_source by name: patch its copy.
    Hook("torch._dynamo.variables.builder", "is_from_optimizer_source", "optimizer",
         _is_from_optimizer_source, params=("source",)),
    Hook("torch._dynamo.variables.dicts", "ConstDictVariable.has_new_items", "optimizer", _has_new_items),
    Hook(_CONVERT_FRAME, "DynamoOutput.build_guards", "optimizer", _build_guards, params=("code",)),
    Hook(_CONVERT_FRAME, "compute_cache_size", "optimizer", _compute_cache_size,
         params=("frame", "cache_entries")),
    Hook(_CONVERT_FRAME, "clear_compile_context_weakrefs", "optimizer", _clear_compile_context,
         params=("tracer_output", "compiler_fn")),
    # Lazy: graph_compile imports inductor.
    Hook("torch._functorch._aot_autograd.graph_compile", "_apply_tensorify_python_scalars", "optimizer",
         _tensorify, params=("module",), lazy=True),
    Hook("torch._functorch._aot_autograd.autograd_cache", "AOTAutogradCache.save", "optimizer", _save_aot,
         lazy=True),
    # The table select_decomp_table returns unless config.fallback_random (then the float
    # is pinned and specialized, as without this hook).
    Hook("torch._inductor.decomposition", "fast_random_decomps", "optimizer", _decomp_table, lazy=True),
    Hook("torch._functorch.aot_autograd", "create_aot_state", "optimizer", _aot_starts, params=("shape_env",),
         lazy=True),
]
