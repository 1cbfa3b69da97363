"""Warm start's proofs on torch's objects: write a guard tree's facts, check a loaded one.

The plain logic is beside it (``guard_rules``, ``facts``, ``proof``); this
module reads what it needs from torch: the C++ guard trees, the values at
guard sources, the process's ambient state.  It hooks nothing;
``warm_start.hooks`` calls it where an entry is saved, loaded and admitted.

* ``live_proof``: when an entry is saved, the facts of the compile's live
  guard tree, evaluated on the compiled frame, and the unguarded facts;
* ``round_trip``: the saved guards loaded back in the same process must prove
  every one of those facts, and serve the call they were compiled for;
* ``verify``: in a restarted process, before a loaded entry serves its first
  call, the facts of the tree it loaded, written on that call, and the
  unguarded facts written again, must include every saved one.
"""

from __future__ import annotations

import builtins
import contextlib
import os
import sys
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from stableguards.identity.reads import reads_identity
from stableguards.codes import resolve
from stableguards.hooks import operators
from stableguards.hooks.guard_tree import Leaf, leaves
from stableguards.warm_start.facts import (
    ADDRESS,
    CONSTANT_RESULT,
    ENVIRONMENT,
    GLOBAL_MODULE_HOOKS,
    GRAPH_TENSORS,
    HASH_SEED,
    MODULE_HOOKS,
    OPERATOR_KERNELS,
    SEED,
    UNSHADOWED_BUILTINS,
    UNTRACED_READS,
    builtins_read,
    constant_result,
    environment,
    global_module_hooks,
    hash_seed,
    module_hooks,
    operator_kernels,
    unshadowed_builtins,
    untraced_reads,
)
from stableguards.warm_start.guard_rules import (
    Check,
    Fact,
    Unprovable,
    code_of,
    fact,
    one_object,
    rule_for,
)
from stableguards.identity.names import module_copy, module_of_globals
from stableguards.identity.objects import Identities
from stableguards.warm_start.proof import Proof, Recheck, check
from stableguards.warm_start.hooks.first_call import (Bound, bind, first_call_fact, first_call_source, first_call_text,
                                                     graph_tensors_fact, state_dict_fact)
from stableguards.warm_start.state import Binding
from stableguards.warm_start.traced import Traced

_NN_MODULE = "torch.nn.modules.module"


def live_proof(guard_manager: Any, builder: Any, sorted_guards: list, output_graph: Any, traced: Traced,
               first_call: frozenset[str] = frozenset(), versioned: frozenset[str] = frozenset(),
               unsaved: frozenset[str] = frozenset()) -> Proof:
    """What the compile's live guard tree and its unguarded state prove (raises Unprovable).
    ``first_call``: sources whose id checks are bound on the entry's first call;
    ``versioned``: dicts whose version checks are, as they hold tensors a graph takes;
    ``unsaved``: sources whose guards are not saved, as another saved guard proves what they
    do (``guards._alive_by_binding``)."""
    identities = Identities()
    value = _Scope(output_graph.local_scope, output_graph.global_scope).values(
        _sources(g.originating_source for g in sorted_guards))
    tree = [leaf for leaf in leaves(guard_manager.root) if leaf.source not in unsaved]
    state = _TracedState(output_graph.torch_function_mode_stack)
    graph_params = tuple((backend, tuple(source.name for source in sources))
                         for backend, sources in traced.graph_params.items() if sources is not None)
    bound = Bound(graph_params, value, tree, first_call, versioned)
    facts = tuple(one_object(tuple(_fact(leaf, value, identities, state, bound, cold=True) for leaf in tree),
                             value, bound.bound_here))
    rechecks = [Recheck(global_module_hooks(sys.modules[_NN_MODULE], identities))]
    rechecks += [Recheck(module_hooks(value(source), source, identities))
                 for source in _module_sources(tree) if not _hooks_run_outside(source, value, builder.f_code, traced)]
    copies = {id(vars(obj)): leaf.source for leaf in tree if module_copy(obj := _value_or_none(value, leaf.source))}
    for module, names in _builtins_read([(builder.f_code, output_graph.global_scope), *traced.inlined], copies):
        scope = vars(sys.modules[module]) if module in sys.modules else vars(value(module))
        rechecks.append(Recheck(unshadowed_builtins(module, scope, names), tuple(sorted(names))))
    if traced.environ is None:
        raise Unprovable("the traced code read the whole environment (os.environ), which cannot be checked")
    rechecks += [Recheck(environment(key, os.environ), key) for key in sorted(traced.environ)]
    for call in traced.constants:
        payload = (call.fn.__module__, call.fn.__qualname__, call.args, tuple(sorted(call.kwargs.items())))
        rechecks.append(Recheck(constant_result(call.fn, call.args, call.kwargs, call.result, identities), payload))
    for label, fn in traced.untraced:
        rechecks.append(Recheck(_untraced_fact(fn, label, traced.untraced_sources, value), label))
    rechecks += [Recheck(graph_tensors_fact(backend, sources, value), sources) for backend, sources in graph_params]
    if ADDRESS in traced.per_process:
        raise Unprovable(f"the trace folded {traced.per_process[ADDRESS]}, which differs in every process")
    if SEED in traced.per_process:
        rechecks.append(Recheck(hash_seed()))
    called = {**traced.operators, **{str(op): op for op in operators.custom_operators(output_graph.graph)}}
    rechecks += [Recheck(_operator_fact(op), operators.path_of(op)) for _, op in sorted(called.items())]
    return Proof(facts, tuple(dict.fromkeys(rechecks)), graph_params)


def _operator_fact(op: Any) -> Fact:
    """What a custom operator the trace called computes; Unprovable where it cannot be told."""
    try:
        return operator_kernels(str(op), operators.kernels(op))
    except operators.Opaque as why:
        raise Unprovable(str(why)) from None


def _operator_at(path: tuple[str, str, str | None]) -> Any:
    try:
        return operators.operator_at(*path)
    except (AttributeError, RuntimeError) as error:
        raise Unprovable(f"operator {path[0]}::{path[1]} is not defined here ({error!r:.100})") from None


def _untraced_fact(fn: Any, label: str, sources: list[Any], value: Callable[[str], Any]) -> Fact:
    """What the function a graph runs untraced reads, at the source the frame took it from.

    Dynamo takes a ``context_fn`` from a source (``G['policy_fn']``, ``L['self'].ctx_fn``)
    without guarding it; the frame's other guards make a restarted process reach the same
    source, so the function there is the one it would trace with, and the fact checks what
    it runs and reads (code, defaults, closure, and every global it reads, recursively).
    The object at the source must be equivalent to the one the graph ran (torch builds a
    ``functools.partial`` again from its parts)."""
    try:
        ran = untraced_reads(fn, label, reads_identity)
    except Unprovable:
        raise Unprovable(f"its graph runs {label} without Dynamo tracing it, and what that reads has no identity "
                         f"that holds in another process") from None
    for source in sources:
        with contextlib.suppress(Unprovable):
            fact = untraced_reads(value(source.name), source.name, reads_identity)
            if fact.claim == ran.claim:
                return fact
    raise Unprovable(f"its graph runs {label} without Dynamo tracing it, from no source the frame names: what "
                     f"it reads cannot be checked in another process")


def round_trip(proof: Proof, loaded: Any, guards_state: Any, output_graph: Any) -> str | None:
    """Why the guards loaded back from what was saved do not prove what the live ones did
    (in this process, on the compiled frame), or None."""
    if not loaded.check(output_graph.local_scope):
        failed = loaded.check_verbose(output_graph.local_scope).verbose_code_parts
        return f"the saved guards, loaded back, fail on the call they were compiled for ({'; '.join(failed)[:300]})"
    # The unguarded facts were written a moment ago in this process: nothing to write again.
    return _check(proof, loaded, guards_state,
                  _values(_Scope(output_graph.local_scope, output_graph.global_scope), guards_state), rewrite=False)


def verify(proof: Proof | None, loaded: Any, guards_state: Any, f_locals: dict, f_globals: dict,
           unguarded: dict[str, Any], made: list[Binding]) -> str | None:
    """Why a loaded entry may not serve this call (its guards passed on it), or None.  Once
    it may, ``unguarded`` (source -> Binding: tensors a graph takes that sit in a dict whose
    version check is bound) is bound to the objects at those sources on this call, and
    ``made`` holds every check this call bound.

    A refusal binds nothing: the checks bound while the proof was written (``first_call_fact``)
    are unbound again, so the entry's guards pass for the object the cold one stood for when it
    comes, and its proof is checked on that call as on this one."""
    if proof is None:
        return "it has no proof of what its guards proved in the cold process"
    why: str | None = "its proof could not be checked"  # until it is: an error binds nothing either
    try:
        value = _values(_Scope(f_locals, f_globals), guards_state)
        why = _check(proof, loaded, guards_state, value, rewrite=True, made=made)
        if why is None and unguarded:
            try:
                if not all(bind(binding, value(source), made) for source, binding in unguarded.items()):
                    why = "a tensor its graph takes is bound to another object"
            except (Unprovable, TypeError) as error:
                why = f"a tensor its graph takes cannot be bound here ({error})"
        return why
    finally:
        if why is not None:
            for binding in made:
                binding.unbind()
            made.clear()


def _values(frame: _Scope, guards_state: Any) -> Callable[[str], Any]:
    """The value at a source of a loaded tree's guards, on ``frame``."""
    return frame.values(_sources(g.originating_source for g in guards_state.output_graph.guards))


def _check(proof: Proof, loaded: Any, guards_state: Any, value: Callable[[str], Any], rewrite: bool,
           made: list[Binding] | None = None) -> str | None:
    identities = Identities()
    state = _TracedState(guards_state.output_graph.torch_function_mode_stack)
    tree = list(leaves(loaded.root))
    first_call = frozenset(at for leaf in tree if (at := first_call_source(leaf)) is not None)
    bound = Bound(proof.graph_params, value, tree, first_call, made=made)
    warm = one_object(tuple(_warm_facts(tree, value, identities, state, bound)), value, bound.bound_here)
    return check(proof, warm, (lambda item: _recheck(item, value, identities)) if rewrite else (lambda item: item.fact))


def _warm_facts(tree: Iterable[Leaf], value: Callable[[str], Any], identities: Identities,
                state: _TracedState, bound: Bound) -> Iterator[Fact]:
    """The facts of a loaded tree; a leaf with no fact proves nothing (a cold fact on it is
    then unproven, and named)."""
    for leaf in tree:
        with contextlib.suppress(Unprovable):
            yield _fact(leaf, value, identities, state, bound, cold=False)


def _fact(leaf: Leaf, value: Callable[[str], Any], identities: Identities, state: _TracedState,
          bound: Bound, cold: bool) -> Fact:
    code = code_of(leaf.parts)
    rule = rule_for(leaf.kind, code)
    ambient = _ambient(leaf.kind, code) if rule.check is Check.AMBIENT else None
    if cold and ambient is not None and ambient != code:
        # The live guard checks what the process's state says: anything else is not understood.
        raise Unprovable(f"{leaf.kind} on {leaf.source}: checks {code!r}, the process holds {ambient!r}")
    if leaf.kind == "TORCH_FUNCTION_MODE_STACK":
        return fact(leaf.source, leaf.kind, leaf.parts, value=state.mode_types, identity=identities)
    # A tensor a graph takes is described by what its compiled code sees of it: that graph is
    # given the tensor found there (hooks.graph_params).
    if leaf.kind == "LAMBDA_GUARD" and (text := first_call_text(code)) is not None:
        return first_call_fact(leaf.source, text, value, bound.identity(leaf.source, identities, True), bound,
                                identities)
    described = bound.identity(leaf.source, identities, cold and leaf.source in bound.first_call)
    if cold and leaf.kind == "DICT_VERSION" and leaf.source in bound.versioned:
        return state_dict_fact(leaf.source, value(leaf.source), bound, identities)
    return fact(leaf.source, leaf.kind, leaf.parts, value=lambda: value(leaf.source),
                identity=described if leaf.kind == "ID_MATCH" else identities, ambient=ambient)


def _ambient(kind: str, code: str) -> str | None:
    """The process's state, written as the guard of ``kind`` writes what it checks."""
    if kind == "DEFAULT_DEVICE":
        import torch.utils._device

        return f"utils_device.CURRENT_DEVICE == {torch.utils._device.CURRENT_DEVICE!r}"
    if kind == "LAMBDA_GUARD":  # saved-tensor hooks (guard_rules.LAMBDA_RULES)
        from torch._functorch._aot_autograd import utils

        hooks = utils.top_saved_tensors_hooks()
        if utils.saved_tensors_hooks_are_inlineable(hooks):
            # By id: nothing that holds in another process.
            raise Unprovable(f"inlineable saved-tensor hooks are active ({code!r}): checked by id")
        return "torch._functorch.aot_autograd.utils.top_saved_tensors_hooks ids == None"
    return None


class _TracedState:
    """What the saved state says of the ambient state when tracing began."""

    def __init__(self, mode_stack: list) -> None:
        self._modes = mode_stack

    def mode_types(self) -> list[type]:
        return [type(mode) for mode in self._modes]


class _Scope:
    """A frame's locals and globals, as guard sources are evaluated against them."""

    def __init__(self, f_locals: dict, f_globals: dict) -> None:
        self.scope = {"L": f_locals, "G": f_globals, "__builtins__": builtins.__dict__}

    def values(self, sources: dict[str, Any]) -> Callable[[str], Any]:
        """The value at a source: through the Source a guard names, or, for one the guard
        builder made on its own (``G['f'].__code__`` under a CLOSURE_MATCH), its name,
        which is the Python expression Dynamo evaluates."""
        from torch._dynamo.guards import _get_closure_vars

        closure_vars, cache = _get_closure_vars(), {}
        namespace = {**closure_vars, **self.scope}

        def value(name: str) -> Any:
            source = sources.get(name)
            try:
                if source is not None:
                    return source.get_value(self.scope, closure_vars, cache)
                return eval(name, namespace)  # noqa: S307 - a guard's source, as Dynamo evaluates it
            except Exception as error:  # noqa: BLE001 - a source that does not resolve proves nothing
                raise Unprovable(f"{name} cannot be evaluated here ({error!r:.100})") from None
        return value


def _sources(roots: Iterable[Any]) -> dict[str, Any]:
    """Every source a guard names, and the sources it is built on, by name."""
    found: dict[str, Any] = {}
    for source in roots:
        while source is not None and source.name not in found:
            found[source.name] = source
            source = getattr(source, "base", None)
    return found


def _module_sources(tree: list[Leaf]) -> list[str]:
    import torch

    return list(dict.fromkeys(leaf.source for leaf in tree if isinstance(leaf.guarded_type, type)
                              and issubclass(leaf.guarded_type, torch.nn.Module)))


def _hooks_run_outside(source: str, value: Callable[[str], Any], code: Any, traced: Traced) -> bool:
    """Whether the frame is the ``forward`` of the module at ``source`` (``L['self']``), which
    the compiled code never calls again: its hooks ran around the frame, in the caller's
    ``__call__``, never in the compiled code (the blocks ``fully_shard`` wraps, whose hooks
    are FSDP's state's bound methods).  A forward that calls its own module (or any module
    without a source), or runs its own forward again, keeps the check; one that runs another
    class's forward on it (``super().forward``, as under activation checkpointing) runs no hook."""
    if (source != "L['self']" or source in traced.called_modules or None in traced.called_modules
            or code in traced.own_forwards):
        return False
    forward = getattr(type(_value_or_none(value, source)), "forward", None)
    return getattr(forward, "__code__", None) is code


def _value_or_none(value: Callable[[str], Any], source: str) -> Any:
    with contextlib.suppress(Unprovable):
        return value(source)
    return None


def _builtins_read(functions: list[tuple[Any, dict]], copies: dict[int, str]) -> list[tuple[str, set[str]]]:
    """(module, builtins read) for the compiled frame and every function it inlined, each
    (code, globals) read against its own module's globals: a module's name, or for a module
    copy (``identity.module_copy``: ``copies``, by the id of its globals) the guard source
    where the tree checks it, which is where a restarted process finds it."""
    by_module: dict[str, set[str]] = {}
    for code, scope in {(code, id(scope)): (code, scope) for code, scope in functions}.values():
        names = builtins_read(code, scope)
        if not names:  # namedtuple's __new__ reads only what its own namespace holds
            continue
        module = module_of_globals(scope) or copies.get(id(scope))
        if module is None:
            raise Unprovable(f"{code.co_qualname} ({code.co_filename}) reads globals that are no module's: the "
                             f"builtins it reads ({', '.join(sorted(names))}) cannot be checked in another process")
        by_module.setdefault(module, set()).update(names)
    return sorted(by_module.items())


def _recheck(item: Recheck, value: Callable[[str], Any], identities: Identities) -> Fact:
    """An unguarded fact, written again from what this process holds (``value``: the call's
    value at a source)."""
    kind, source = item.fact.kind, item.fact.source
    if kind == GLOBAL_MODULE_HOOKS:
        return global_module_hooks(sys.modules[_NN_MODULE], identities)
    if kind == MODULE_HOOKS:
        return module_hooks(value(source), source, identities)
    if kind == UNSHADOWED_BUILTINS:
        module = sys.modules.get(source)
        if module is None and source.startswith(("G[", "L[")):  # a module copy, where the tree checks it
            module = value(source)
            if not module_copy(module):
                raise Unprovable(f"{source} is not a copy of a module")
        if module is None:
            raise Unprovable(f"module {source} is not imported")
        return unshadowed_builtins(source, vars(module), item.payload)
    if kind == ENVIRONMENT:
        return environment(item.payload, os.environ)
    if kind == UNTRACED_READS:
        return untraced_reads(value(source), source, reads_identity)
    if kind == GRAPH_TENSORS:
        return graph_tensors_fact(source, tuple(item.payload), value)
    if kind == HASH_SEED:
        return hash_seed()
    if kind == OPERATOR_KERNELS:
        return _operator_fact(_operator_at(item.payload))
    if kind == CONSTANT_RESULT:
        module_name, qualname, args, kwargs = item.payload
        kwargs = dict(kwargs)
        try:
            fn = resolve(module_name, qualname)
            result = fn(*args, **kwargs)
        except Exception as error:  # noqa: BLE001 - the user's function: any failure means "not the same"
            raise Unprovable(f"calling {module_name}.{qualname} failed ({error!r:.100})") from None
        return constant_result(fn, args, kwargs, result, identities)
    raise Unprovable(f"unknown kind {kind}")
