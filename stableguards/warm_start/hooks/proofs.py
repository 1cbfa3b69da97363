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
    graph_tensors,
    hash_seed,
    module_hooks,
    operator_kernels,
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
from stableguards.identity.names import by_state, graph_tensor, module_copy, module_of_globals
from stableguards.identity.objects import Identities
from stableguards.warm_start.proof import Proof, Recheck, check
from stableguards.warm_start.state import STATE, Binding

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
    # Graphs whose attributes are tensors checked by id (graph_params): backend id -> the
    # sources (Sources) of the tensors its compiled code takes first (None: one has no source).
    graph_params: dict[str, tuple[Any, ...] | None] = field(default_factory=dict)
    graph_tensors: set[int] = field(default_factory=set)  # ids of those tensors
    state_inits: list[Any] = field(default_factory=list)  # optimizer_init.StateInit: state the trace filled
    operators: dict[str, Any] = field(default_factory=dict)  # custom operators the trace called, by name
    # What values the trace folded depend on (facts.SEED, facts.ADDRESS) -> the first such value.
    per_process: dict[str, str] = field(default_factory=dict)
    hash_ordered: dict[str, str] = field(default_factory=dict)  # set constants in hash order, likewise
    # Sources whose object's id the trace folded and used only as a key (folds.memo_key): their id
    # checks are bound on the entry's first call.
    memo_keys: set[str] = field(default_factory=set)

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
    bound = _Bound(graph_params, value, tree, first_call, versioned)
    facts = tuple(one_object(tuple(_fact(leaf, value, identities, state, bound, cold=True) for leaf in tree),
                             value, bound.bound_here))
    rechecks = [Recheck(global_module_hooks(sys.modules[_NN_MODULE], identities))]
    rechecks += [Recheck(module_hooks(value(source), source, identities))
                 for source in _module_sources(tree)]
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
    rechecks += [Recheck(_graph_tensors_fact(backend, sources, value), sources) for backend, sources in graph_params]
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

    A refusal binds nothing: the checks bound while the proof was written (``_first_call_fact``)
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
                if not all(_bind(binding, value(source), made) for source, binding in unguarded.items()):
                    why = "a tensor its graph takes is bound to another object"
            except (Unprovable, TypeError) as error:
                why = f"a tensor its graph takes cannot be bound here ({error})"
        return why
    finally:
        if why is not None:
            for binding in made:
                binding.unbind()
            made.clear()


def _bind(binding: Binding, obj: Any, made: list[Binding]) -> bool:
    """Bind ``binding`` to ``obj`` unless bound (recorded in ``made`` if this bound it);
    whether it now checks ``obj``."""
    fresh = not binding.bound
    holds = binding.bind(obj)
    if fresh:
        made.append(binding)
    return holds


def _values(frame: _Scope, guards_state: Any) -> Callable[[str], Any]:
    """The value at a source of a loaded tree's guards, on ``frame``."""
    return frame.values(_sources(g.originating_source for g in guards_state.output_graph.guards))


def _check(proof: Proof, loaded: Any, guards_state: Any, value: Callable[[str], Any], rewrite: bool,
           made: list[Binding] | None = None) -> str | None:
    identities = Identities()
    state = _TracedState(guards_state.output_graph.torch_function_mode_stack)
    tree = list(leaves(loaded.root))
    first_call = frozenset(at for leaf in tree if (at := _first_call_source(leaf)) is not None)
    bound = _Bound(proof.graph_params, value, tree, first_call, made=made)
    warm = one_object(tuple(_warm_facts(tree, value, identities, state, bound)), value, bound.bound_here)
    return check(proof, warm, (lambda item: _recheck(item, value, identities)) if rewrite else (lambda item: item.fact))


def _warm_facts(tree: Iterable[Leaf], value: Callable[[str], Any], identities: Identities,
                state: _TracedState, bound: _Bound) -> Iterator[Fact]:
    """The facts of a loaded tree; a leaf with no fact proves nothing (a cold fact on it is
    then unproven, and named)."""
    for leaf in tree:
        with contextlib.suppress(Unprovable):
            yield _fact(leaf, value, identities, state, bound, cold=False)


def _bound_on_first_call(obj: Any) -> bool:
    """Whether an id check on ``obj`` is one bound on its entry's first call, each on its own
    (``one_object``): an optimizer's, a tensor's, a module copy's."""
    import torch

    return by_state(obj) or isinstance(obj, torch.Tensor) or module_copy(obj)


class _Bound:
    """What an entry binds on its first call, and what its tree checks: the tensors its
    graphs take in front of their inputs (``graph_params``: their sources, the objects there
    on this call), the dicts whose version checks are bound because they hold some of them
    (cold: given; warm: told by the loaded checks), and every source the tree checks."""

    def __init__(self, graph_params: Iterable[tuple[str, tuple[str, ...]]], value: Callable[[str], Any],
                 tree: list[Leaf], first_call: frozenset[str] = frozenset(),
                 versioned: frozenset[str] = frozenset(), made: list[Binding] | None = None) -> None:
        self.made: list[Binding] = [] if made is None else made  # the checks this call's proof bound
        self.sources = frozenset(source for _, sources in graph_params for source in sources)
        self.first_call = first_call
        self.versioned = versioned
        self.checked = frozenset(leaf.source for leaf in tree)
        self._value = value
        self._ids: set[int] | None = None

    def identity(self, source: str, identities: Identities, first_call: bool) -> Callable[[Any], str | None]:
        """How the object an id check at ``source`` checks is described: a tensor, where the
        check is bound on the first call, by what compiled code sees of it; an optimizer
        without the hyperparameters the tree checks at their own sources
        (``Identities.optimizer``); anything else by ``identities``."""
        def guarded(group: int, key: str) -> bool:
            return f"{source}.param_groups[{group}][{key!r}]" in self.checked

        def describe(obj: Any) -> str | None:
            if first_call and (tensor := graph_tensor(obj)) is not None:
                return tensor
            if by_state(obj):
                return identities.optimizer(obj, guarded)
            # Bound on the first call, an object with no identity of its own (its id a memo key:
            # folds.memo_key) is described by its class and what it holds.
            return identities(obj) or (identities.contents(obj) if first_call else None)
        return describe

    def bound_here(self, source: str, obj: Any) -> bool:
        """Whether the id check at ``source`` is bound on the entry's first call (``one_object``)."""
        return source in self.first_call or _bound_on_first_call(obj)

    def holds(self, obj: Any) -> bool:
        """Whether ``obj`` is a tensor some graph of the entry takes, on this call."""
        if self._ids is None:
            self._ids = {id(self._value(source)) for source in self.sources}
        return id(obj) in self._ids


def _graph_tensors_fact(graph: str, sources: tuple[str, ...], value: Callable[[str], Any]) -> Fact:
    return graph_tensors(graph, [(source, value(source)) for source in sources], graph_tensor,
                         lambda tensor: tensor.untyped_storage()._cdata)


def _state_dict_fact(source: str, obj: Any, bound: _Bound, identities: Identities) -> Fact:
    """A dict whose version check is bound on the entry's first call (``guards.
    VERSION_ON_FIRST_CALL``): its keys in order and its values, a tensor only as one a graph
    of the entry takes (by what its compiled code sees of it; ``GRAPH_TENSORS`` says more).
    A version proves nothing of what a dict held in another process: this does."""
    import torch

    if type(obj) is not dict:
        raise Unprovable(f"{source} is a {type(obj).__name__}, not a dict")
    items = []
    for key, item in obj.items():
        if isinstance(item, torch.Tensor) and not bound.holds(item):
            raise Unprovable(f"{source}[{key!r}] is a tensor no graph of the entry takes")
        described = graph_tensor(item) if isinstance(item, torch.Tensor) else identities(item)
        if type(key) is not str or described is None:
            raise Unprovable(f"{source}[{key!r}] has no identity that holds in another process")
        items.append(f"{key!r}: {described}")
    return Fact(source, "DICT_VERSION",
                f"unchanged from its entry's first call, on which it held {{{', '.join(items)}}}")


def _fact(leaf: Leaf, value: Callable[[str], Any], identities: Identities, state: _TracedState,
          bound: _Bound, cold: bool) -> Fact:
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
    if leaf.kind == "LAMBDA_GUARD" and (text := _first_call_text(code)) is not None:
        return _first_call_fact(leaf.source, text, value, bound.identity(leaf.source, identities, True), bound,
                                identities)
    described = bound.identity(leaf.source, identities, cold and leaf.source in bound.first_call)
    if cold and leaf.kind == "DICT_VERSION" and leaf.source in bound.versioned:
        return _state_dict_fact(leaf.source, value(leaf.source), bound, identities)
    return fact(leaf.source, leaf.kind, leaf.parts, value=lambda: value(leaf.source),
                identity=described if leaf.kind == "ID_MATCH" else identities, ambient=ambient)


def _first_call_text(code: str) -> str | None:
    """The text of an id check bound on its entry's first call (a string literal), or None."""
    if not code.startswith(("'", '"')):
        return None
    with contextlib.suppress(ValueError, SyntaxError):
        text = ast.literal_eval(code)
        if isinstance(text, str) and text.startswith(FIRST_CALL):
            return text
    return None


def _first_call_source(leaf: Leaf) -> str | None:
    """The source a loaded check bound on its entry's first call checks, or None."""
    if leaf.kind != "LAMBDA_GUARD" or (text := _first_call_text(code_of(leaf.parts))) is None:
        return None
    return _bound_check(text, leaf.source)[1]


def _bound_check(text: str, source: str) -> tuple[Binding | None, str, str]:
    """A bound check's binding (None: not made in this process), the source it checks (its
    guard's, unless it sits on an ancestor's manager: ``Binding.at``) and its code template."""
    token, _, template = text.removeprefix(FIRST_CALL).partition(": ")
    binding = STATE.bindings.get(int(token))
    return binding, (binding.at if binding is not None else None) or source, template


def _first_call_fact(source: str, text: str, value: Callable[[str], Any], described: Callable[[Any], str | None],
                     bound: _Bound, identities: Identities) -> Fact:
    """A loaded check bound on its entry's first call (``rebuilt_checks.ID_ON_FIRST_CALL``,
    ``VERSION_ON_FIRST_CALL``): bound here to the object at its source on this call, whose
    proof is being checked, and written as the check it stands for.  The proof then
    compares what that object is with the cold one; if it differs, the entry never serves."""
    binding, source, template = _bound_check(text, source)
    obj = value(source)
    try:
        bound_here = binding is not None and _bind(binding, obj, bound.made)
    except TypeError:  # no version
        bound_here = False
    if not bound_here:
        raise Unprovable(f"{source}: its check is bound to another object")
    if template.startswith("___dict_version("):
        return _state_dict_fact(source, obj, bound, identities)
    from torch._dynamo.guards import _safe_type_repr

    # The type torch's id check prints is the checked object's: the bound one's (where the guards
    # were built, a tensor is the saved state's fake one).
    code = f"{template.rpartition(', type=')[0]}, type={_safe_type_repr(type(obj))}"
    if template.startswith("___check_type_id("):  # TYPE_ON_FIRST_CALL: what the object's class is
        return fact(source, "TYPE_MATCH", [code.replace(FIRST_CALLS_OBJECT, str(id(type(obj))))],
                    value=lambda: obj, identity=identities)
    return fact(source, "ID_MATCH", [code.replace(FIRST_CALLS_OBJECT, str(id(obj)))], value=lambda: obj,
                identity=described)


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
    for code, scope in functions:
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
        return _graph_tensors_fact(source, tuple(item.payload), value)
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
