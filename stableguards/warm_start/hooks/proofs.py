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
import ast
import contextlib
import os
import sys
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from stableguards.autograd_cache.reads import reads_identity
from stableguards.codes import resolve
from stableguards.hooks.guard_tree import Leaf, leaves
from stableguards.warm_start.facts import (
    CONSTANT_RESULT,
    ENVIRONMENT,
    GLOBAL_MODULE_HOOKS,
    MODULE_HOOKS,
    UNSHADOWED_BUILTINS,
    UNTRACED_READS,
    builtins_read,
    constant_result,
    environment,
    global_module_hooks,
    module_hooks,
    unshadowed_builtins,
    untraced_reads,
)
from stableguards.warm_start.guard_rules import (
    FIRST_CALL,
    FIRST_CALLS_OBJECT,
    Check,
    Fact,
    Unprovable,
    code_of,
    fact,
    one_object,
    rule_for,
)
from stableguards.warm_start.identity import Identities, by_state, module_of_globals
from stableguards.warm_start.proof import Proof, Recheck, check
from stableguards.warm_start.state import STATE

_NN_MODULE = "torch.nn.modules.module"


@dataclass
class ConstantCall:
    """An ``assume_constant_result`` call made while tracing (recorded, never repeated there),
    or a call Dynamo folded without a guard (``guards._record_folded``)."""

    fn: Any
    args: tuple
    kwargs: dict
    result: Any


@dataclass
class Traced:
    """What tracing a frame for a saved entry read that its guards do not say: the functions
    it inlined with their globals, ``assume_constant_result`` calls, the environment
    variables it read (None: the whole environment, which cannot be checked); the resume
    functions torch installed for it, which a package restores; and the functions its graphs
    run without Dynamo tracing them."""

    inlined: list[tuple[Any, dict]] = field(default_factory=list)
    constants: list[ConstantCall] = field(default_factory=list)
    environ: set[str] | None = field(default_factory=set)
    resumes: set[str] = field(default_factory=set)
    untraced: list[tuple[str, Any]] = field(default_factory=list)  # (label, function): bundling.runs_untraced
    untraced_sources: list[Any] = field(default_factory=list)  # where such functions came from (Sources)

    def inline(self, code: Any, scope: dict, arguments: dict[str, Any]) -> None:
        """A function inlined, with its globals and its arguments (VariableTrackers)."""
        self.inlined.append((code, scope))
        environ = type(os.environ)
        if code is environ.__getitem__.__code__:  # os.getenv, environ.get and `in` all come here
            key = arguments.get("key")
            try:
                name = key.as_python_constant()
            except Exception:  # noqa: BLE001 - a key Dynamo does not know as a constant
                self.environ = None
                return
            if self.environ is not None and isinstance(name, str):
                self.environ.add(name)
        elif any(code is getattr(environ, m).__code__ for m in ("__iter__", "__len__", "copy")):
            self.environ = None  # the whole environment


def live_proof(guard_manager: Any, builder: Any, sorted_guards: list, output_graph: Any, traced: Traced) -> Proof:
    """What the compile's live guard tree and its unguarded state prove (raises Unprovable)."""
    identities = Identities()
    value = _Scope(output_graph.local_scope, output_graph.global_scope).values(
        _sources(g.originating_source for g in sorted_guards))
    tree = list(leaves(guard_manager.root))
    state = _TracedState(output_graph.torch_function_mode_stack)
    facts = tuple(one_object(tuple(_fact(leaf, value, identities, state, cold=True) for leaf in tree), value,
                             by_state))
    rechecks = [Recheck(global_module_hooks(sys.modules[_NN_MODULE], identities))]
    rechecks += [Recheck(module_hooks(value(source), source, identities))
                 for source in _module_sources(tree)]
    for module, names in _builtins_read([(builder.f_code, output_graph.global_scope), *traced.inlined]):
        rechecks.append(Recheck(unshadowed_builtins(module, vars(sys.modules[module]), names), tuple(sorted(names))))
    if traced.environ is None:
        raise Unprovable("the traced code read the whole environment (os.environ), which cannot be checked")
    rechecks += [Recheck(environment(key, os.environ), key) for key in sorted(traced.environ)]
    for call in traced.constants:
        payload = (call.fn.__module__, call.fn.__qualname__, call.args, tuple(sorted(call.kwargs.items())))
        rechecks.append(Recheck(constant_result(call.fn, call.args, call.kwargs, call.result, identities), payload))
    for label, fn in traced.untraced:
        rechecks.append(Recheck(_untraced_fact(fn, label, traced.untraced_sources, value), label))
    return Proof(facts, tuple(dict.fromkeys(rechecks)))


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
    return _check(proof, loaded, guards_state, _Scope(output_graph.local_scope, output_graph.global_scope),
                  rewrite=False)


def verify(proof: Proof | None, loaded: Any, guards_state: Any, f_locals: dict, f_globals: dict) -> str | None:
    """Why a loaded entry may not serve this call (its guards passed on it), or None."""
    if proof is None:
        return "it has no proof of what its guards proved in the cold process"
    return _check(proof, loaded, guards_state, _Scope(f_locals, f_globals), rewrite=True)


def _check(proof: Proof, loaded: Any, guards_state: Any, frame: _Scope, rewrite: bool) -> str | None:
    identities = Identities()
    value = frame.values(_sources(g.originating_source for g in guards_state.output_graph.guards))
    state = _TracedState(guards_state.output_graph.torch_function_mode_stack)
    warm = one_object(tuple(_warm_facts(leaves(loaded.root), value, identities, state)), value, by_state)
    return check(proof, warm, (lambda item: _recheck(item, value, identities)) if rewrite else (lambda item: item.fact))


def _warm_facts(tree: Iterable[Leaf], value: Callable[[str], Any], identities: Identities,
                state: _TracedState) -> Iterator[Fact]:
    """The facts of a loaded tree; a leaf with no fact proves nothing (a cold fact on it is
    then unproven, and named)."""
    for leaf in tree:
        with contextlib.suppress(Unprovable):
            yield _fact(leaf, value, identities, state, cold=False)


def _fact(leaf: Leaf, value: Callable[[str], Any], identities: Identities, state: _TracedState,
          cold: bool) -> Fact:
    code = code_of(leaf.parts)
    rule = rule_for(leaf.kind, code)
    ambient = _ambient(leaf.kind, code) if rule.check is Check.AMBIENT else None
    if cold and ambient is not None and ambient != code:
        # The live guard checks what the process's state says: anything else is not understood.
        raise Unprovable(f"{leaf.kind} on {leaf.source}: checks {code!r}, the process holds {ambient!r}")
    if leaf.kind == "TORCH_FUNCTION_MODE_STACK":
        return fact(leaf.source, leaf.kind, leaf.parts, value=state.mode_types, identity=identities)
    if leaf.kind == "LAMBDA_GUARD" and (text := _first_call_text(code)) is not None:
        return _first_call_fact(leaf.source, text, value, identities)
    return fact(leaf.source, leaf.kind, leaf.parts, value=lambda: value(leaf.source), identity=identities,
                ambient=ambient)


def _first_call_text(code: str) -> str | None:
    """The text of an id check bound on its entry's first call (a string literal), or None."""
    if not code.startswith(("'", '"')):
        return None
    with contextlib.suppress(ValueError, SyntaxError):
        text = ast.literal_eval(code)
        if isinstance(text, str) and text.startswith(FIRST_CALL):
            return text
    return None


def _first_call_fact(source: str, text: str, value: Callable[[str], Any], identities: Identities) -> Fact:
    """A loaded id check bound on its entry's first call (``guards.ID_ON_FIRST_CALL``):
    bound here to the object at its source on this call, whose proof is being checked,
    and written as the ID_MATCH it stands for.  The proof then compares that object's
    identity with the cold one's; if it differs, the entry never serves."""
    token, _, template = text.removeprefix(FIRST_CALL).partition(": ")
    binding = STATE.bindings.get(int(token))
    obj = value(source)
    try:
        bound = binding is not None and binding.bind(obj)
    except TypeError:  # no weak reference to it
        bound = False
    if not bound:
        raise Unprovable(f"{source}: its id check is bound to another object")
    return fact(source, "ID_MATCH", [template.replace(FIRST_CALLS_OBJECT, str(id(obj)))], value=lambda: obj,
                identity=identities)


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


def _builtins_read(functions: list[tuple[Any, dict]]) -> list[tuple[str, set[str]]]:
    """(module, builtins read) for the compiled frame and every function it inlined, each
    (code, globals) read against its own module's globals."""
    by_module: dict[str, set[str]] = {}
    for code, scope in functions:
        module = module_of_globals(scope)
        if module is None:
            raise Unprovable(f"{code.co_qualname} ({code.co_filename}) reads globals that are no module's: the "
                             f"builtins it reads cannot be checked in another process")
        names = builtins_read(code, scope)
        if names:
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
        if module is None:
            raise Unprovable(f"module {source} is not imported")
        return unshadowed_builtins(source, vars(module), item.payload)
    if kind == ENVIRONMENT:
        return environment(item.payload, os.environ)
    if kind == UNTRACED_READS:
        return untraced_reads(value(source), source, reads_identity)
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
