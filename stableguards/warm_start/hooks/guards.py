"""An entry's guards: saved with their proof and checked on the real trees; built again in a
restarted process from the cold process's ambient state.  The by-name builders
(``MODULE_BY_NAME`` ...) are referred to by name from saved entries."""

from __future__ import annotations

import ast
import contextlib
import copyreg
import dataclasses
import functools
import inspect
import pickle
import sys
import types
from collections.abc import Callable, Iterator
from typing import Any

from stableguards.codes import code_at, code_path
from stableguards.hooks import operators
from stableguards.hooks.core import Hook, TorchError
from stableguards.warm_start.guard_rules import FIRST_CALL, FIRST_CALLS_OBJECT, FIRST_CALLS_VERSION, Unprovable
from stableguards.identity import fx_home
from stableguards.warm_start.hooks import graph_params, proofs
from stableguards.identity.names import by_state, module_copy, parametrized
from stableguards.warm_start.state import STATE, Binding, TypeBinding, VersionBinding

_PACKAGE = "torch._dynamo.package"


@dataclasses.dataclass(frozen=True, eq=False)
class LoadedProof:
    """Kept on a loaded entry's guard manager (``_load_guard_manager``): what it must prove,
    the guard state it was built from, and the globals it checks."""

    proof: Any
    guards_state: Any
    f_globals: dict
    unguarded: dict = dataclasses.field(default_factory=dict)  # source -> Binding, bound once the proof holds


def _serialize_guards(call: Any, self: Any, builder: Any, sorted_guards: list, output_graph: Any) -> Any:
    """Save the entry's guards with its proof, and check them on the real trees.

    torch refuses to save an identity guard (``ID_MATCH``, ``CLASS_MATCH``,
    ``MODULE_MATCH``, ``CLOSURE_MATCH``: ids differ between processes), so every
    nn.Module call and every inlined function reached through a global would
    leave the entry out.  Here such a guard is saved under another name for the
    same builder method (``*_BY_NAME``): torch pickles the scope with modules,
    classes and importable functions by reference (a local function's code by
    its path, ``_reduce_code``), so a restarted process rebuilds an identity
    check against the object of that name *there*.  That alone proves nothing
    about the object the cold compile saw; what does is the entry's proof:

    * the live tree's facts (``proofs.live_proof``): each leaf guard in
      words that mean the same in every process, identities included, and the
      facts Dynamo left unguarded.  A guard with no such words (no rule, an
      object with no identity) leaves the entry out, named;
    * the saved guards are loaded back here and must prove every fact and
      pass on the compiled call (``proofs.round_trip``), or the entry is
      left out, naming the guard;
    * the proof is saved with the guards; a restarted process checks the tree
      it loaded against it before the entry serves a call (``_serve_loaded``).

    Refusals are torch's PackageError: torch leaves this compile out of the
    package (``bypass_package``), and explain() says why.  Other packages'
    guards are torch's.
    """
    if STATE.frame.get() is None:
        return call(self, builder, sorted_guards, output_graph)
    import dataclasses

    from torch._dynamo.exc import PackageError

    traced = STATE.traced.get() or proofs.Traced()
    bound, versioned = _graph_tensors(traced, sorted_guards)
    versioned |= _empty_dicts(builder, sorted_guards)
    # An object whose id the trace used only as a key is bound on the first call, as a graph's tensor is.
    replacements = {id(guard): _replacement(guard, builder, bound | traced.memo_keys, versioned, traced.graph_tensors)
                    for guard in sorted_guards}
    alive = _alive_by_binding(sorted_guards, builder, replacements, output_graph)
    if unrestored := _unrestored(output_graph, alive.values()):
        raise TorchError(PackageError(f"its compiled code reads {', '.join(unrestored)}: globals torch made in this "
                                      f"process for it, which a restarted process would not have"))
    saved = []
    for guard in sorted_guards:
        if id(guard) in alive:
            continue
        replacement = replacements[id(guard)]
        if guard._unserializable is not None and fx_home.home_of_class(guard._unserializable):
            guard = dataclasses.replace(guard, _unserializable=None)  # saved by its home's name (_reduce_code)
        if replacement is not None:
            _keep_builtin(self, guard, output_graph)
            guard = dataclasses.replace(guard, create_fn=replacement, guard_types=None)
        saved.append(guard)
    try:
        first_call = frozenset(guard.name for guard in sorted_guards if replacements[id(guard)] is ID_ON_FIRST_CALL)
        proof = proofs.live_proof(self.guard_manager, builder, sorted_guards, output_graph, traced, first_call,
                                  versioned, frozenset(guard.name for guard in sorted_guards if id(guard) in alive))
    except Unprovable as why:
        raise TorchError(PackageError(f"stableguards cannot prove it in another process: {why}")) from None
    token = STATE.proof.set(proof)
    try:
        saved_state = call(self, builder, saved, output_graph)
    finally:
        STATE.proof.reset(token)
    why = _round_trip(proof, saved_state, builder.f_code, output_graph)
    if why is not None:
        raise TorchError(PackageError(f"stableguards: the saved guards do not prove what the live ones do: {why}"))
    return saved_state


def _round_trip(proof: Any, saved_state: bytes, code: Any, output_graph: Any) -> str | None:
    """Load the saved guards back, as a restarted process will, and compare (same process)."""
    from torch._dynamo.package import load_guard_manager, load_guards_state

    token = STATE.checking.set(True)
    try:
        state = load_guards_state(saved_state)
        loaded = load_guard_manager(state, code, output_graph.global_scope)
    except Exception as error:  # noqa: BLE001 - saved so that it cannot load: a restarted process could not either
        return f"they do not load back ({error!r:.200})"
    finally:
        STATE.checking.reset(token)
    return proofs.round_trip(proof, loaded, state, output_graph)


def _pickle_guards_state(call: Any, state: Any, builder: Any) -> bytes:
    """The entry's proof goes into the saved guard state (``_serialize_guards``), with the
    thread's dispatch keys the live guards were built under (``_cold_ambient_state``) and the
    optimizer state its trace filled (``optimizer_init``)."""
    proof = STATE.proof.get()
    if proof is not None:
        import torch

        state.stableguards_proof = proof.to_state()
        state.stableguards_dispatch_keys = (torch._C._dispatch_tls_local_include_set().raw_repr(),
                                            torch._C._dispatch_tls_local_exclude_set().raw_repr())
        traced = STATE.traced.get()
        if traced is not None and traced.state_inits:
            state.stableguards_state_inits = tuple(traced.state_inits)
    return call(state, builder)


def _load_guard_manager(call: Any, guards_state: Any, target_code: Any, runtime_global_scope: Any) -> Any:
    """Build a saved entry's guards from the cold process's ambient state, not this one's,
    and keep its proof beside them for ``_serve_loaded``.

    Some guards read the process's state when they are built rather than the
    saved state they print: the default device, the saved-tensor hooks, and the
    thread's dispatch keys a tensor check applies.  The cold process proved "the
    default device was D", "no inlineable hooks were active" and "the tensor
    dispatches to these keys"; built under the same state, the loaded guards
    check each call for that (a warm ``torch.compile`` inside a
    ``saved_tensors_hooks`` context would otherwise build "these hooks", by id).
    Only our own entries are touched."""
    if STATE.installing.get() is None and not STATE.checking.get():
        return call(guards_state, target_code, runtime_global_scope)
    from stableguards.warm_start.proof import Proof

    bindings: dict[str, Binding] = {}
    token = STATE.building.set(bindings)
    try:
        with _cold_ambient_state(guards_state.output_graph.current_device,
                                 getattr(guards_state, "stableguards_dispatch_keys", None)):
            guard_manager = call(guards_state, target_code, runtime_global_scope)
    finally:
        STATE.building.reset(token)
    proof = Proof.from_state(getattr(guards_state, "stableguards_proof", None))
    # A tensor a graph takes that no id check binds sits in a dict whose version check is
    # bound: it is bound when the proof holds, to the tensor at its source (_serve_loaded).
    unguarded = {source: Binding() for source in (proof.bound_tensors() if proof is not None else ())
                 if source not in bindings}
    guard_manager.stableguards = LoadedProof(proof, guards_state, runtime_global_scope, unguarded)
    if proof is not None and STATE.installing.get() is not None:
        bindings.update(unguarded)
        for backend_id, sources in proof.graph_params:
            graph_params.serve_bound(runtime_global_scope, backend_id, [bindings[s].get for s in sources])
    return guard_manager


@contextlib.contextmanager
def _cold_ambient_state(device: Any, dispatch_keys: tuple[int, int] | None) -> Iterator[None]:
    """The default device the cold compile saw, no inlineable saved-tensor hooks (the only
    hooks an entry is saved under), and the thread's dispatch keys the cold guards were built
    under, while guards are built.

    A tensor check records the keys a tensor dispatches to under the thread's included and
    excluded keys when it is built, and compares that with what each call's tensors have
    under the keys then: an entry compiled inside ``torch.autocast`` expects AutocastCPU.  A
    warm ``torch.compile`` outside the autocast region the calls run in would otherwise
    build "no AutocastCPU", which no call passes (and which the proof refuses)."""
    import torch
    import torch.utils._device as device_state
    from torch._functorch._aot_autograd import utils

    popped = []
    while utils.saved_tensors_hooks_are_inlineable(utils.top_saved_tensors_hooks()):
        popped.append(utils.top_saved_tensors_hooks())
        torch._C._autograd._pop_saved_tensors_default_hooks()
    prior, device_state.CURRENT_DEVICE = device_state.CURRENT_DEVICE, device
    keys = contextlib.nullcontext()
    if dispatch_keys is not None:
        include, exclude = (torch._C.DispatchKeySet.from_raw_repr(raw) for raw in dispatch_keys)
        keys = torch._C._ForceDispatchKeyGuard(include, exclude)
    try:
        with keys:
            yield
    finally:
        device_state.CURRENT_DEVICE = prior
        for pack, unpack in reversed(popped):
            torch._C._autograd._push_saved_tensors_default_hooks(pack, unpack)


def _graph_tensors(traced: proofs.Traced, guards: list) -> tuple[frozenset[str], frozenset[str]]:
    """The sources of the tensors the compile's graphs take in front of their inputs
    (``graph_params``), and the dicts holding those of them that are checked through their
    dict's version: each is checked by id, or sits in a dict checked by its version (an
    optimizer's per-parameter state, ``optimizers.hooks``).  Raises PackageError where one
    has no source or no such check (then nothing binds it in another process)."""
    from torch._dynamo.exc import PackageError
    from torch._dynamo.source import DictGetItemSource

    if any(sources is None for sources in traced.graph_params.values()):
        raise TorchError(PackageError("its graph takes a tensor held as its attribute with no source Dynamo names"))
    checked = {guard.name for guard in guards if guard.create_fn_name() == "ID_MATCH"}
    versions = {guard.name for guard in guards if guard.create_fn_name() == "DICT_VERSION"}
    bound, versioned, unchecked = set(), set(), []
    for source in (source for sources in traced.graph_params.values() for source in sources):
        bound.add(source.name)
        if source.name in checked:
            continue
        if isinstance(source, DictGetItemSource) and source.base.name in versions:
            versioned.add(source.base.name)
        else:
            unchecked.append(source.name)
    if unchecked:
        raise TorchError(PackageError(f"its graph takes the tensors at {', '.join(sorted(unchecked))}, which Dynamo "
                                      f"checks neither by id nor by their dict's version"))
    return frozenset(bound), frozenset(versioned)


def _empty_dicts(builder: Any, guards: list) -> frozenset[str]:
    """The dicts whose version is checked that were empty when the guards were built: an
    optimizer's per-parameter state, made by its first step's ``_init_group`` and filled by
    its graph.  Bound on the entry's first call like a dict holding graph tensors: what the
    proof says of it (``proofs._state_dict_fact``: it held nothing) is checked there."""
    return frozenset(guard.name for guard in guards if guard.create_fn_name() == "DICT_VERSION"
                     and type(value := builder.get(guard)) is dict and not value)


def _alive_by_binding(guards: list, builder: Any, replacements: dict[int, Any], output_graph: Any) -> dict[int, str]:
    """Guards that an object is alive, through a weak reference torch stored in a global of
    this process (``__optimizer_<id>``, for the optimizer whose step is traced), on an object
    whose id check is bound on the entry's first call: (id of the guard) -> the global.

    They are not saved: the binding holds the object weakly and fails once it is gone, and
    it checks the object at its source on every call, which is alive there; so it proves
    what the weak reference did.  Where the compiled code itself reads the global, the
    compile stays out (``_unrestored``)."""
    from torch._dynamo.source import GlobalWeakRefSource

    held = {id(builder.get(guard)) for guard in guards if replacements[id(guard)] is ID_ON_FIRST_CALL}
    read = {instruction.argval for instruction in output_graph.output_instructions}
    return {id(guard): guard.originating_source.global_name for guard in guards
            if guard.create_fn_name() == "WEAKREF_ALIVE" and isinstance(guard.originating_source, GlobalWeakRefSource)
            and guard.originating_source.global_name not in read and id(builder.get(guard)) in held}


def _unrestored(output_graph: Any, alive: Any = ()) -> list[str]:
    """Globals this compile installed for its code or guards that a restarted process will
    not have.

    A package installs the import aliases, compiled graphs and resume functions it
    records, and the builtins dict; torch also installs globals named after an object's
    id in this process (a weakref, a tensor subclass, ``__gen_rand_values`` for
    ``random.random()``).  Code that reads one after a restart raises NameError, so such
    a compile is left out of its entry.  What torch installed is its own record
    (``installed_globals``); only resume functions are told by a hook
    (``_record_resume``), so a hook that failed leaves more out, never less.  ``alive``:
    weak references only guards read, whose guards are not saved (``_alive_by_binding``)."""
    entry = output_graph.package.current_entry if output_graph.package is not None else None
    traced = STATE.traced.get()
    restored = {*(entry.import_sources if entry is not None else ()), *(entry.backend_ids if entry is not None else ()),
                output_graph.name_of_builtins_dict_key_in_fglobals, *(traced.resumes if traced is not None else ())}
    return sorted(set(output_graph.installed_globals) - restored - set(alive))


def _record_resume(call: Any, self: Any, name: str, *args: Any, **kwargs: Any) -> None:
    """A resume function installed for a compile of ours: the package records and restores it."""
    call(self, name, *args, **kwargs)
    traced = STATE.traced.get()
    if traced is not None:
        traced.resumes.add(name)


def _module_by_alias(call: Any, self: Any, prefix: str, value: Any) -> str:
    """A module a compile of ours loads by a global named after its id in this process (to
    build an ``OrderedDict`` again after the graph, ``torch`` for ``type(t)``): through
    torch's import alias instead, which the package saves and a restarted process installs."""
    if STATE.traced.get() is None or self.package is None or not isinstance(value, types.ModuleType) \
            or sys.modules.get(value.__name__) is not value:
        return call(self, prefix, value)
    return self.root_tx.import_source(value.__name__).global_name


def _globals_through_function(call: Any, self: Any, name: str) -> Any:
    """A global an inlined function reads from a namespace that is no module's (namedtuple's
    ``__new__``, code exec'd into a fresh dict): torch reaches that namespace through a global
    it installs under the dict's id in this process, which a restarted process lacks.  For a
    compile of ours, where the function was reached along a source, the namespace is reached
    along that function's ``__globals__`` instead: the guards check the same dict, at a source
    a restarted process has."""
    from torch._dynamo import symbolic_convert
    from torch._dynamo.source import AttrSource, DictGetItemSource

    source = getattr(getattr(self, "funcvar", None), "source", None)
    if STATE.traced.get() is None or source is None \
            or symbolic_convert._registered_module_for_globals(self.f_globals.get("__name__"), self.f_globals):
        return call(self, name)
    globals_source = AttrSource(source, "__globals__")
    fglobals_vt = symbolic_convert.VariableBuilder(self, globals_source)(self.f_globals)
    return self.f_globals, fglobals_vt, DictGetItemSource(globals_source, name)  # no module: never stdlib's


def _record_constant(call: Any, tx: Any, fn: Any, name: str, args: Any, kwargs: Any) -> Any:
    """An ``assume_constant_result`` function called while tracing for a saved entry: its
    result is a fact of the entry (``warm_start.facts.CONSTANT_RESULT``)."""
    traced = STATE.traced.get()
    if traced is None:
        return call(tx, fn, name, args, kwargs)

    def recorded(*a: Any, **k: Any) -> Any:
        result = fn(*a, **k)
        traced.constants.append(proofs.ConstantCall(fn, a, k, result))
        return result

    return call(tx, recorded, name, args, kwargs)


def _record_folded(call: Any, self: Any, tx: Any, args: Any, kwargs: Any) -> Any:
    """A call Dynamo folds into the graph without a guard, whose result is this process's
    place in its job (a rank, a world size, a process group's ranks, whether a device is
    there): a fact of the entry (``CONSTANT_RESULT``), called again in the process that
    loads it.  Rank 1 is never served what was traced on rank 0.  A call whose arguments
    are not plain values (a ``ProcessGroup`` object) leaves the entry out."""
    traced = STATE.traced.get()
    result = call(self, tx, args, kwargs)
    if traced is not None and operators.is_custom(self.value):
        traced.operators[str(self.value)] = self.value  # what it computes is a fact (proofs)
    if traced is not None and folds_process_state(self.value):
        traced.constants.append(proofs.ConstantCall(self.value, tuple(map(_plain, args)),
                                                    {k: _plain(v) for k, v in kwargs.items()}, _plain(result)))
    return result


def _record_context_fn(call: Any, self: Any, tx: Any, args: Any, kwargs: Any) -> Any:
    """Where a checkpointing ``context_fn`` came from (its source), for a saved entry: Dynamo
    passes it to the graph untraced and unguarded, and the entry's proof checks what the
    function found there reads (``proofs.live_proof``)."""
    traced = STATE.traced.get()
    source = getattr(kwargs.get("context_fn"), "source", None)
    if traced is not None and source is not None:
        traced.untraced_sources.append(source)
    return call(self, tx, args, kwargs)


class _NotPlain:
    """A value Dynamo does not know as a Python constant: no fact can be written about it."""

    def __repr__(self) -> str:
        return "<not a constant>"


def _plain(variable: Any) -> Any:
    try:
        return variable.as_python_constant()
    except Exception:  # noqa: BLE001 - NotImplementedError, or a tracker's own refusal
        return _NotPlain()


@functools.cache
def _process_state_functions() -> frozenset[Any]:
    """What Dynamo folds without a guard that differs between the processes of one job
    (torch/_dynamo/variables/torch.py: ``constant_fold_functions`` and the process-group
    handlers).  Functions of their arguments alone (``torch.is_complex``) and state
    Dynamo guards otherwise (autocast, the default dtype: ``GLOBAL_STATE``) are not here."""
    import torch

    functions = {torch.cuda.is_available, torch.cuda.get_device_properties, torch.accelerator.is_available,
                 torch.backends.mps.is_built}
    if torch.distributed.is_available():
        from torch.distributed import distributed_c10d as c10d

        functions |= {c10d.is_initialized, c10d.get_rank, c10d.get_world_size, c10d.get_process_group_ranks}
        functions |= {getattr(c10d, name) for name in ("_get_group_size_by_name", "_get_group_tag",
                                                       "_rank_not_in_group", "_resolve_group_name_by_ranks_and_tag")
                      if hasattr(c10d, name)}
    return frozenset(functions)


def folds_process_state(fn: Any) -> bool:
    try:
        return fn in _process_state_functions()
    except TypeError:  # unhashable
        return False


def _record_inlined(call: Any, self: Any, *args: Any, **kwargs: Any) -> None:
    """A function inlined while tracing for a saved entry, with the globals it reads (the
    builtins it reads must not be shadowed there in a restarted process)."""
    traced = STATE.traced.get()
    if traced is not None:
        bound = _signature(call.fn).bind(self, *args, **kwargs).arguments
        traced.inline(bound["code"], bound["funcvar"].get_globals(), bound["symbolic_locals"])
    return call(self, *args, **kwargs)


@functools.cache
def _signature(fn: Any) -> inspect.Signature:
    return inspect.signature(fn)


def _reduce_code(call: Any, self: Any, obj: Any) -> Any:
    """The guard pickler saves a local function's code object by its path from an
    importable function (``warm_start.code_path``), so a restarted process gets
    the code object its live functions share, and an identity check on
    ``fn.__code__`` (``CLOSURE_BY_NAME``) can pass there; and an optimizer as
    the attributes it holds.  Where torch would leave an object to pickle: a dict
    subclass that rewrites its keys by its items, and a value no guard reads that
    pickle cannot save as torch's sentinel.  Other objects, and code without such
    a path, are pickled as torch pickles them (code by value, a fresh code object
    that no live function runs: that check never passes).  Other packages'
    guards are pickled as torch pickles them."""
    if isinstance(obj, types.CodeType) and STATE.frame.get() is not None:
        path = code_path(obj)
        if path is not None:
            return code_at, path
    if STATE.frame.get() is not None and isinstance(obj, type) and (home := fx_home.home_of_class(obj)):
        # A graph module's class (torch.fx makes one per graph, local to its __new__): by its
        # home's name, rebuilt against the class registered there in a restarted process.
        return fx_home.class_at, (home,)
    if STATE.frame.get() is not None and fx_home.home_of_class(type(obj)):
        # A graph module, as its nn.Module state: what guards on it read (its buffers,
        # parameters, submodules, hooks), without its graph, whose nodes call objects
        # only its home's name stands for.  Its class is checked by identity in the proof.
        import torch

        state = vars(torch.nn.Module())
        return _bare_object, (type(obj),), {k: v for k, v in vars(obj).items() if k in state}, None, None, \
            _set_attributes
    if STATE.frame.get() is not None and by_state(obj):
        # An optimizer, as what it holds, without its own __setstate__: Adam's reads each
        # parameter's step count, which torch's pickler prunes where no guard reads it.
        # The rebuilt guards read it along their sources; its id check is bound on the
        # first call (ID_ON_FIRST_CALL).
        return _new_object, (type(obj),), vars(obj), None, None, _set_attributes
    reduced = call(self, obj)
    if STATE.frame.get() is not None and isinstance(reduced, tuple) \
            and getattr(reduced[0], "__name__", None) == "_unpickle_tensor":
        # torch saves a tensor as ``empty_like`` on meta, which drops a view's storage offset (and
        # a non-dense tensor's strides): a guard rebuilt on it (``L['y'].storage_offset() == 2``)
        # would check 0 in every process.  The saved tensor keeps the live one's layout.
        unpickle, (meta, *rest) = reduced
        return _strided_tensor, (unpickle, meta, tuple(obj.stride()), obj.storage_offset(), *rest)
    if reduced is not NotImplemented or STATE.frame.get() is None:
        return reduced  # torch's own reduction, a pruned value's included
    if isinstance(obj, type) and parametrized(obj):
        # A class register_parametrization made for one module, which no name finds: made again
        # by torch, for a bare module of the class it extends.  Its check is bound on the first
        # call (TYPE_ON_FIRST_CALL); what it is, the proof compares (identity._parametrized).
        return _parametrized_class, (obj.__bases__[0], _parametrized_names(obj))
    if parametrized(type(obj)):
        # A parametrized module refuses pickling (its class's __getstate__): its nn.Module state,
        # pruned by torch as any module's, on a module of a class torch makes again alike.
        cls = type(obj)
        return _parametrized_module, (cls.__bases__[0], _parametrized_names(cls)), dict(vars(obj)), None, None, \
            _set_attributes
    if _rebuilt_through_its_setitem(obj):
        # Pickle rebuilds a dict subclass by calling its __setitem__ with each saved item,
        # which may change the key again (transformers' output-capture registry stores
        # str(key.__class__): every saved key became "<class 'str'>").  It is rebuilt with
        # the items its storage holds, as dict's own copy would.
        return _new_object, (type(obj),), (list(dict.items(obj)), getattr(obj, "__dict__", {})), None, None, \
            _set_items_and_attributes
    if _unpicklable_bystander(self, obj):
        from torch._dynamo.package import _Missing

        return _Missing, ("cannot be pickled, and no guard reads it",)
    return reduced


# What pickle saves itself when the reducer declines, before any __reduce_ex__.
_PICKLED_BY_PICKLE = (dict, set, frozenset, list, tuple, bytearray, types.FunctionType)


def _unpicklable_bystander(pickler: Any, obj: Any) -> bool:
    """A value the saved scope holds that pickle cannot save and no guard reads: a ContextVar
    in a global object's ``__dict__`` (transformers' output collector, whose type and
    methods a checkpointed layer's frame guards) would leave the entry out.

    It is saved as torch's ``_Missing``, as torch saves the unsupported types it lists
    (streams, weakrefs, process groups) where no guard reads them.  Sound for the same
    reason: the saved scope only builds the guards (the compiled code runs on the live
    objects), and no guard reads this value; the round trip (``_round_trip``) then checks
    that the guards built from the saved scope prove what the live ones did.  A value
    that a guard reads, or that a container carried whole holds, is left to pickle: it
    fails, and the entry is left out."""
    if id(obj) in pickler.guard_tree_values or id(obj) in getattr(pickler, "_verbatim_elements", ()):
        return False
    kind = type(obj)
    if kind in _PICKLED_BY_PICKLE or isinstance(obj, type) or kind in getattr(pickler, "dispatch_table",
                                                                             copyreg.dispatch_table):
        return False
    try:
        obj.__reduce_ex__(pickle.DEFAULT_PROTOCOL)  # what pickle calls next
    except Exception:  # noqa: BLE001 - TypeError, or pybind11's RuntimeError for a C++ function record
        return True
    return False


def _rebuilt_through_its_setitem(obj: Any) -> bool:
    """A dict subclass with its own ``__setitem__`` that pickle would save as any object
    (no reduce, state or slots of its own): rebuilt through that ``__setitem__``."""
    kind = type(obj)
    return (isinstance(obj, dict) and kind.__setitem__ is not dict.__setitem__
            and kind.__reduce_ex__ is object.__reduce_ex__ and kind.__reduce__ is object.__reduce__
            and getattr(kind, "__getstate__", None) is getattr(object, "__getstate__", None)
            and not hasattr(kind, "__setstate__") and not copyreg._slotnames(kind))


def _set_items_and_attributes(obj: dict, state: tuple[list, dict]) -> None:
    items, attributes = state
    dict.update(obj, items)
    if attributes:
        obj.__dict__.update(attributes)


def _strided_tensor(unpickle: Any, meta: Any, stride: tuple[int, ...], offset: int, *rest: Any) -> Any:
    """torch's saved tensor (``_reduce_code``), on a meta tensor with the saved strides and offset."""
    import torch

    extent = 1 + sum((size - 1) * step for size, step in zip(meta.shape, stride)) if meta.numel() else 0
    base = torch.empty(offset + extent, dtype=meta.dtype, device="meta", requires_grad=False)
    laid_out = base.as_strided(meta.shape, stride, offset).detach().requires_grad_(meta.requires_grad)
    return unpickle(laid_out, *rest)


def _reader(path: str) -> Callable[[Any], Any]:
    """What ``obj<path>`` reads (``.__dict__['id2label']``): attribute and constant-key item
    accesses only, else NotImplementedError (the saved guards then do not load back, and the
    entry is left out)."""
    node = ast.parse(f"obj{path}", mode="eval").body
    steps: list[tuple[bool, Any]] = []
    while not isinstance(node, ast.Name):
        if isinstance(node, ast.Attribute):
            steps.append((True, node.attr))
            node = node.value
        elif isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant):
            steps.append((False, node.slice.value))
            node = node.value
        else:
            raise NotImplementedError(f"cannot read obj{path} without evaluating it")
    steps.reverse()

    def read(obj: Any) -> Any:
        for attribute, key in steps:
            obj = getattr(obj, key) if attribute else obj[key]
        return obj
    return read


def _parametrized_names(cls: type) -> tuple[str, ...]:
    return tuple(name for name, value in vars(cls).items() if isinstance(value, property))


def _parametrized_module(base: type, names: tuple[str, ...]) -> Any:
    """A bare module of ``base`` whose class torch's parametrize made, with a property for each
    of ``names`` (its state is set next, as pickle does)."""
    from torch.nn.utils import parametrize

    module = base.__new__(base)
    parametrize._inject_new_class(module)
    for name in names:
        parametrize._inject_property(module, name)
    return module


def _parametrized_class(base: type, names: tuple[str, ...]) -> type:
    return type(_parametrized_module(base, names))


def _new_object(cls: type) -> Any:
    return cls.__new__(cls)


def _bare_object(cls: type) -> Any:
    """An instance of ``cls`` made without its ``__new__``: ``GraphModule.__new__`` makes a new
    class for every instance."""
    return object.__new__(cls)


def _set_attributes(obj: Any, attributes: dict) -> None:
    obj.__dict__.update(attributes)


def _keep_builtin(manager: Any, guard: Any, output_graph: Any) -> None:
    """A guard on ``__builtins_dict__['all']`` needs ``all`` in the saved builtins, which
    torch prunes to the names its own BUILTIN_MATCH guards recorded."""
    from torch._dynamo.source import DictGetItemSource, GlobalSource

    source = guard.originating_source
    if (isinstance(source, DictGetItemSource) and isinstance(source.index, str)
            and isinstance(source.base, GlobalSource)
            and source.base.global_name == output_graph.name_of_builtins_dict_key_in_fglobals):
        manager.used_builtin_vars.add(source.index)


def _replacement(guard: Any, builder: Any, bound: frozenset[str], versioned: frozenset[str],
                 held: set[int]) -> Any:
    """The by-name builder method for an identity guard; whether the rebuilt check proves
    what this one did is checked on the trees (``_serialize_guards``), not assumed.

    An id check is bound on the entry's first call (``ID_ON_FIRST_CALL``) on an object
    whose identity is its state (``identity.by_state``: an optimizer), on a tensor a graph
    takes and an object whose id the trace used only as a key (at a source in ``bound``:
    ``graph_params``, given the bound tensor; ``folds.memo_key``), and on a
    tensor no graph of the compile holds (ids ``held``): a parameter whose grad an
    optimizer hook reads.  Compiled code sees no more of such a tensor than its metadata
    (its values are read when it runs).  A tensor a graph holds under another source stays
    out.  The version check on a dict that holds tensors a graph takes (at a source in
    ``versioned``) is bound likewise (``VERSION_ON_FIRST_CALL``)."""
    import torch

    kind = guard.create_fn_name()
    if kind == "ID_MATCH" and set(guard.guard_types or ()) <= {kind}:
        obj = builder.get(guard)
        if guard.name in bound or by_state(obj) or module_copy(obj) \
                or (isinstance(obj, torch.Tensor) and id(obj) not in held):
            return ID_ON_FIRST_CALL
    if kind == "DICT_VERSION" and guard.name in versioned:
        return VERSION_ON_FIRST_CALL
    if kind == "TYPE_MATCH" and parametrized(type(builder.get(guard))):
        return TYPE_ON_FIRST_CALL
    # An id check is what MODULE_MATCH and CLASS_MATCH run; CLOSURE_MATCH must not fall back to one.
    if kind not in _REPLACEMENTS or not set(guard.guard_types or ()) <= {kind, *_ID_CHECKS.get(kind, ())}:
        return None
    return _REPLACEMENTS[kind]


def _same_check_as(kind: str) -> Any:
    def check(builder: Any, guard: Any) -> None:
        getattr(type(builder), kind)(builder, guard)

    check.__name__ = check.__qualname__ = kind.replace("_MATCH", "_BY_NAME")
    return check


# torch's own check, under a name torch saves; module-level so the saved entry
# refers to it by name.
MODULE_BY_NAME = _same_check_as("MODULE_MATCH")
CLASS_BY_NAME = _same_check_as("CLASS_MATCH")
CLOSURE_BY_NAME = _same_check_as("CLOSURE_MATCH")
CONSTANT_BY_NAME = _same_check_as("CONSTANT_MATCH")
ID_BY_NAME = _same_check_as("ID_MATCH")
FUNCTION_BY_NAME = _same_check_as("FUNCTION_MATCH")


def ID_ON_FIRST_CALL(builder: Any, guard: Any) -> None:  # noqa: N802 - named as torch's builder methods
    """An id check, in another process, on an object that no name finds there (an
    optimizer, a tensor, a module copy: ``_replacement``): bound to the object at its
    source on the call the entry first serves, when the entry's proof shows that object's
    identity is the cold one's (``proofs`` binds it, ``identity`` describes it).  Until
    then it passes, and nothing is served before the proof: a loaded entry serves only
    once its proof holds.  From then on it checks that object, as the cold compile's id
    check did; what the cold compile saw of it, the proof compared."""
    from torch._dynamo.guards import _safe_type_repr

    binding = Binding()
    if (building := STATE.building.get()) is not None:
        building[guard.name] = binding
    type_repr = _safe_type_repr(type(builder.get(guard)))
    _add_bound_check(builder, guard, binding,
                     f"___check_obj_id({builder.arg_ref(guard)}, {FIRST_CALLS_OBJECT}), type={type_repr}")


def TYPE_ON_FIRST_CALL(builder: Any, guard: Any) -> None:  # noqa: N802 - named as torch's builder methods
    """A type check, in another process, on an object of a class torch makes for one object
    (``identity.parametrized``), which no name finds there: bound to the class of the object
    at its source on the call the entry first serves, when the entry's proof shows that class
    is what the cold one was (``identity._parametrized``).  Until then it passes, and nothing
    is served before the proof holds; from then on it checks that class, as the cold
    compile's type check did."""
    from torch._dynamo.guards import _safe_type_repr

    type_repr = _safe_type_repr(type(builder.get(guard)))
    _add_bound_check(builder, guard, TypeBinding(),
                     f"___check_type_id({builder.arg_ref(guard)}, {FIRST_CALLS_OBJECT}), type={type_repr}")


def VERSION_ON_FIRST_CALL(builder: Any, guard: Any) -> None:  # noqa: N802 - named as torch's builder methods
    """A dict's version check, in another process, on an optimizer's per-parameter state
    dict whose tensors a graph takes (``graph_params``): bound to the version the dict has
    on the call the entry first serves, when the entry's proof shows the dict holds what
    the cold one did (its keys, and its tensors by what the compiled code sees of them:
    ``proofs._state_dict_fact``).  A version belongs to one dict in one state (PEP 509), so
    from then on it checks what the cold compile's version check did: the same dict,
    unchanged, holding the tensors the graph is given."""
    from torch._C._dynamo.guards import dict_version

    _add_bound_check(builder, guard, VersionBinding(dict_version),
                     f"___dict_version({builder.arg_ref(guard)}) == {FIRST_CALLS_VERSION}")


def _add_bound_check(builder: Any, guard: Any, binding: Binding, code: str) -> None:
    """A check bound on the entry's first call: one string literal (torch evaluates a failed
    guard's code parts to name it), found again by its token when the proof binds it.

    A dict's guard manager takes no lambda guard: the check on a dict sits on its nearest
    ancestor that is not one, reading the dict along the source's attribute and item
    accesses from there (``binding.at`` names the dict's source for the proof)."""
    STATE.bindings[binding.token] = binding
    text = f"{FIRST_CALL}{binding.token}: {code}"
    manager, source, check = builder.get_guard_manager(guard), guard.originating_source, binding.passes
    if type(manager).__name__ == "DictGuardManager":
        base = source
        while type(manager).__name__ == "DictGuardManager":
            base = getattr(base, "base", None)
            if base is None or not source.name.startswith(base.name):
                raise NotImplementedError(f"no guard manager above {source.name} takes a check")
            manager = builder.get_guard_manager_from_source(base)
        read = _reader(source.name[len(base.name):])
        binding.at = source.name
        check = lambda obj: binding.passes(read(obj))  # noqa: E731
    manager.add_lambda_guard(check, [repr(text)], guard.user_stack)


_REPLACEMENTS = {"MODULE_MATCH": MODULE_BY_NAME, "CLASS_MATCH": CLASS_BY_NAME, "CLOSURE_MATCH": CLOSURE_BY_NAME,
                 "FUNCTION_MATCH": FUNCTION_BY_NAME, "ID_MATCH": ID_BY_NAME, "CONSTANT_MATCH": CONSTANT_BY_NAME}
# A CONSTANT_MATCH is an id check only for a code object (a traced read of ``f.__code__``);
# on any other constant it is an EQUALS_MATCH, which torch saves as it is.
_ID_CHECKS = {"MODULE_MATCH": ("ID_MATCH",), "CLASS_MATCH": ("ID_MATCH",), "FUNCTION_MATCH": ("ID_MATCH",),
              "CONSTANT_MATCH": ("ID_MATCH",)}


HOOKS = [
    Hook("torch._dynamo.guards", "CheckFunctionManager.serialize_guards", "warm_start", _serialize_guards,
         params=("builder", "sorted_guards", "output_graph")),
    Hook("torch._dynamo.guards", "GuardsStatePickler.reducer_override", "warm_start", _reduce_code,
         params=("obj",)),
    Hook("torch._dynamo.guards", "pickle_guards_state", "warm_start", _pickle_guards_state,
         params=("state", "builder")),
    Hook(_PACKAGE, "load_guard_manager", "warm_start", _load_guard_manager,
         params=("guards_state", "target_code", "runtime_global_scope")),
    Hook("torch._dynamo.output_graph", "OutputGraph.install_global_by_id", "warm_start", _module_by_alias,
         params=("prefix", "value")),
    Hook("torch._dynamo.symbolic_convert", "InliningInstructionTranslator.get_globals_source_and_value", "warm_start",
         _globals_through_function, params=("name",)),
    Hook("torch._dynamo.output_graph", "OutputGraph.install_resume_function_global", "warm_start",
         _record_resume, params=("name",)),
    # assume_constant_result calls (builtin.py imports it from here when called).  nn_module's
    # by-name copy runs only for a specialized module, whose NN_MODULE guard is never saved.
    Hook("torch._dynamo.variables.functions", "invoke_and_store_as_constant", "warm_start", _record_constant,
         params=("tx", "fn", "name", "args", "kwargs")),
    Hook("torch._dynamo.variables.torch", "TorchInGraphFunctionVariable.call_function", "warm_start",
         _record_folded, params=("tx", "args", "kwargs")),
    Hook("torch._dynamo.variables.higher_order_ops", "CheckpointHigherOrderVariable._call_function", "warm_start",
         _record_context_fn, params=("tx", "args", "kwargs")),
    Hook("torch._dynamo.symbolic_convert", "InliningInstructionTranslator.__init__", "warm_start", _record_inlined,
         params=("parent", "code", "symbolic_locals", "funcvar")),
]
