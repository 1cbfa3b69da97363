"""An entry's guards: saved with their proof and checked on the real trees; built again in a
restarted process from the cold process's ambient state.  Which check a guard is saved as is
``warm_start.saving``'s rule, the checks are ``rebuilt_checks``', and how the guard state
is pickled is ``warm_start.pickling``'s."""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator
from typing import Any

from stableguards.events import EVENTS
from stableguards.hooks.core import Hook, TorchError
from stableguards.identity import fx_home
from stableguards.warm_start import pickling, saving
from stableguards.warm_start.guard_rules import Unprovable
from stableguards.warm_start.hooks import graph_params, proofs, rebuilt_checks
from stableguards.warm_start.hooks.rebuilt_checks import ID_ON_FIRST_CALL
from stableguards.warm_start.state import STATE, Binding
from stableguards.warm_start.traced import Traced

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
    if STATE.compiling.get().frame is None:
        return call(self, builder, sorted_guards, output_graph)
    with EVENTS.timed("warm start guards"):
        return _serialized(call, self, builder, sorted_guards, output_graph)


def _serialized(call: Any, self: Any, builder: Any, sorted_guards: list, output_graph: Any) -> Any:
    from torch._dynamo.exc import PackageError

    traced = STATE.compiling.get().traced or Traced()
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
    with STATE.compiling_as(proof=proof):
        saved_state = call(self, builder, saved, output_graph)
    why = _round_trip(proof, saved_state, builder.f_code, output_graph)
    if why is not None:
        raise TorchError(PackageError(f"stableguards: the saved guards do not prove what the live ones do: {why}"))
    return saved_state


def _round_trip(proof: Any, saved_state: bytes, code: Any, output_graph: Any) -> str | None:
    """Load the saved guards back, as a restarted process will, and compare (same process)."""
    from torch._dynamo.package import load_guard_manager, load_guards_state

    with STATE.loading_as(checking=True):
        try:
            state = load_guards_state(saved_state)
            loaded = load_guard_manager(state, code, output_graph.global_scope)
        except Exception as error:  # noqa: BLE001 - saved so that it cannot load: a restarted process could not
            return f"they do not load back ({error!r:.200})"
    return proofs.round_trip(proof, loaded, state, output_graph)


def _pickle_guards_state(call: Any, state: Any, builder: Any) -> bytes:
    """The entry's proof goes into the saved guard state (``_serialize_guards``), with the
    thread's dispatch keys the live guards were built under (``_cold_ambient_state``) and the
    optimizer state its trace filled (``optimizer_init``)."""
    proof = STATE.compiling.get().proof
    if proof is not None:
        import torch

        state.stableguards_proof = proof.to_state()
        state.stableguards_dispatch_keys = (torch._C._dispatch_tls_local_include_set().raw_repr(),
                                            torch._C._dispatch_tls_local_exclude_set().raw_repr())
        traced = STATE.compiling.get().traced
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
    if STATE.loading.get().package is None and not STATE.loading.get().checking:
        return call(guards_state, target_code, runtime_global_scope)
    from stableguards.warm_start.proof import Proof

    bindings: dict[str, Binding] = {}
    with STATE.loading_as(bindings=bindings), _cold_ambient_state(
            guards_state.output_graph.current_device, getattr(guards_state, "stableguards_dispatch_keys", None)):
        guard_manager = call(guards_state, target_code, runtime_global_scope)
    proof = Proof.from_state(getattr(guards_state, "stableguards_proof", None))
    # A tensor a graph takes that no id check binds sits in a dict whose version check is
    # bound: it is bound when the proof holds, to the tensor at its source (_serve_loaded).
    unguarded = {source: Binding() for source in (proof.bound_tensors() if proof is not None else ())
                 if source not in bindings}
    guard_manager.stableguards = LoadedProof(proof, guards_state, runtime_global_scope, unguarded)
    if proof is not None and STATE.loading.get().package is not None:
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


def _graph_tensors(traced: Traced, guards: list) -> tuple[frozenset[str], frozenset[str]]:
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
    proof says of it (``first_call.state_dict_fact``: it held nothing) is checked there."""
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
    traced = STATE.compiling.get().traced
    restored = {*(entry.import_sources if entry is not None else ()), *(entry.backend_ids if entry is not None else ()),
                output_graph.name_of_builtins_dict_key_in_fglobals, *(traced.resumes if traced is not None else ())}
    return sorted(set(output_graph.installed_globals) - restored - set(alive))


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
    """The rebuilt check for a guard (``saving.replacement`` chooses by name), or None: saved as
    torch saves it.  Whether it proves what the guard did is checked on the trees
    (``_serialize_guards``), not assumed."""
    name = saving.replacement(guard.create_fn_name(), frozenset(guard.guard_types or ()), guard.name,
                              lambda: builder.get(guard), bound, versioned, held)
    return None if name is None else getattr(rebuilt_checks, name)


def _reduce_code(call: Any, self: Any, obj: Any) -> Any:
    """The guard pickler saves an entry of ours by warm start's rules (``pickling.reduce``);
    other packages' guards are pickled as torch pickles them."""
    if STATE.compiling.get().frame is None:
        return call(self, obj)
    return pickling.reduce(obj, lambda: call(self, obj), self)


HOOKS = [
    Hook("torch._dynamo.guards", "CheckFunctionManager.serialize_guards", "warm_start", _serialize_guards,
         params=("builder", "sorted_guards", "output_graph")),
    Hook("torch._dynamo.guards", "GuardsStatePickler.reducer_override", "warm_start", _reduce_code,
         params=("obj",)),
    Hook("torch._dynamo.guards", "pickle_guards_state", "warm_start", _pickle_guards_state,
         params=("state", "builder")),
    Hook(_PACKAGE, "load_guard_manager", "warm_start", _load_guard_manager,
         params=("guards_state", "target_code", "runtime_global_scope")),
]
