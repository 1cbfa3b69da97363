"""Optimizer steps: fewer, cheaper guards, no O(N^2) write-back, entries that die with the optimizer.

The reasoning (why a dict's version proves what its tensors' identities did,
why a rebuilt optimizer is not served the old step) is in
``stableguards.optimizers.lives``; here is where Dynamo is told.  Three steps
run at shared seams (``hooks.seams``): ``note_state_dicts``, ``before_guards``
and ``after_guards``, ``live_entries``.
"""

from __future__ import annotations

import sys
import weakref
from collections.abc import Callable
from typing import Any

from stableguards.hooks import seams
from stableguards.hooks.seams import fills
from stableguards.hooks.core import Hook
from stableguards.hooks.entries import release_check_functions
from stableguards.hooks.state import STATE as HOOK_STATE
from stableguards.optimizers import messages
from stableguards.optimizers.lives import OptimizerLives
from stableguards.optimizers.state import STATE, Trace

_OPTIMIZER = "torch._dynamo.variables.optimizer"
_CONVERT_FRAME = "torch._dynamo.convert_frame"

# Dict version tags: PEP 509, deprecated in 3.12 and gone in 3.14, where torch
# checks dicts otherwise.  Where the tags are not there, upstream's guards stay.
DICT_VERSIONS_SOUND = sys.version_info < (3, 14)
# Backends that run the traced ops as they are, so their code does not depend on
# a grad's strides.
_STRIDE_AGNOSTIC_BACKENDS = frozenset({"eager", "aot_eager"})


def _note_seen(call: Any, self: Any, value: Any, *args: Any, **kwargs: Any) -> None:
    """Every frame that sees an optimizer, not only its step, is compiled for that object."""
    from torch._guards import TracingContext

    call(self, value, *args, **kwargs)
    context = TracingContext.try_get()
    if context is not None:
        # By identity: a user's optimizer class may define __eq__ and __hash__.
        STATE.traces.get(context, Trace).seen.setdefault(id(value), weakref.ref(value))


@fills("optimizer_sources.after", "optimizers")
def note_state_dicts(self: Any, tx: Any) -> None:
    """Dynamo mapped an optimizer's sources (``hooks.seams``): note each per-parameter state
    dict the step reads, with the source Dynamo gave it."""
    if not DICT_VERSIONS_SOUND:
        return
    from torch._dynamo.source import AttrSource, ConstDictKeySource, DictGetItemSource

    state = AttrSource(self.source, "state")
    dicts = [(DictGetItemSource(state, ConstDictKeySource(state, i)), d)
             for i, d in enumerate(self.value.state.values()) if type(d) is dict]
    optimizer = weakref.ref(self.value)
    STATE.traces.get(tx.output.tracing_context, Trace).steps.append((optimizer, dicts))
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


@fills("build_guards.before", "optimizers")
def before_guards(dynamo_output: Any) -> None:
    """Before a frame's guards are built (``hooks.seams``): one version guard per state dict
    its optimizer steps read, instead of identity guards on the state tensors."""
    output = dynamo_output.tracer_output.output_graph
    # torch asserts the output graph exists; this must not fail before it does.
    trace = STATE.traces.peek(output.tracing_context) if output is not None else None
    if trace is not None and trace.steps:
        _guard_state_dicts_by_version(output, trace.steps)


@fills("build_guards.after", "optimizers")
def after_guards(dynamo_output: Any, code: Any, check_fn: Any) -> None:
    """A frame's guards are built (``hooks.seams``): its entry lives as long as the optimizers
    the frame saw."""
    output = dynamo_output.tracer_output.output_graph
    trace = STATE.traces.peek(output.tracing_context) if output is not None else None
    for optimizer in (ref() for ref in trace.seen.values()) if trace is not None else ():
        if optimizer is not None:
            STATE.lives.depend(optimizer, check_fn)


@fills("entry.lives_with", "optimizers")
def lives_with(optimizers: list[Any], token: Any) -> None:
    """An entry installed without a trace (warm start's, bound to ``optimizers`` on its first
    call) lives as long as they do, as ``after_guards`` makes a traced one: released when
    one is collected, so it no longer counts towards its frame's recompile limit."""
    for optimizer in optimizers:
        STATE.lives.depend(optimizer, token)


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
    messages.state_guards_versioned(len(covered), len(dropped))


def _is_from_optimizer_source(call: Any, source: Any) -> bool:
    """Grads reached through an optimizer get TENSOR_MATCH, as other inputs do.

    Upstream checks only that they are not None, so a grad whose strides changed
    reaches code compiled for the old strides: inductor's asserts fail where
    eager works.  Backends that do not specialize on strides keep the cheap
    check; an unknown backend gets the full one.  (TENSOR_MATCH proves more
    than NOT_NONE: nothing is given up.)
    """
    compile = seams.current()
    if compile is not None and compile.compiler_name in _STRIDE_AGNOSTIC_BACKENDS:
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
    """An optimizer was collected: release the cache entries compiled for it."""

    def release() -> None:
        released = release_check_functions(check_fns, f"optimizer {description}")
        _forget_shape_envs()
        messages.released(description, released)

    HOOK_STATE.release_soon(release)


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


@fills("cache_size.count", "optimizers")
def live_entries(cache_entries: list, compile: seams.Compile | None) -> list:
    """Which entries count towards the recompile limit (``hooks.seams``): invalidated ones
    (their optimizer was collected) can never run again, so rebuilding an optimizer must not
    use up the frame's room."""
    return [e for e in cache_entries if e.code is not None]


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


STATE.lives = OptimizerLives(_optimizer_died)

HOOKS = [
    Hook(_OPTIMIZER, "OptimizerVariable.__init__", "optimizers", _note_seen, params=("value",)),
    # builder imported is_from_optimizer_source by name: patch its copy.
    Hook("torch._dynamo.variables.builder", "is_from_optimizer_source", "optimizers",
         _is_from_optimizer_source, params=("source",)),
    Hook("torch._dynamo.variables.dicts", "ConstDictVariable.has_new_items", "optimizers", _has_new_items),
    Hook(_CONVERT_FRAME, "clear_compile_context_weakrefs", "optimizers", _clear_compile_context,
         params=("tracer_output", "compiler_fn")),
]
