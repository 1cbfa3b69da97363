"""Warm start's hook layer: save each compiled frame's entry, install it in a restarted process.

torch's package machinery (``torch._dynamo.package.CompilePackage``) saves a
compiled frame (guards, transformed bytecode, graph artifacts) and installs it
in another process.  Here it serves a store of stableguards' own, beside
torch's, and only compiles stableguards set up; a user's ``caching_precompile``,
``CompilePackage`` or ``strict_precompile`` get torch's behaviour, untouched.
With the flag on:

* a compile for a backend whose code torch can serialize (inductor) gets a
  package of ours (``_optimize``); other compiles are torch's;
* ``torch.compile(fn)`` looks the entry up under stableguards' key
  (``warm_start.key.entry_key``: module, file, code hash, receiver class, backend
  fingerprint, ``dynamic``, the Dynamo, inductor and functorch configurations)
  and installs it (``_context_call``); entries are saved when compiled
  (``compile_frame``, run by ``hooks.seams`` when a frame starts compiling);
* nothing is trusted that is not checked: an entry's guards are saved with
  its proof (``guards``, ``proofs``), checked by loading
  them back before the entry is saved, and again in the restarted process on
  the call the entry would serve first (``loaded``);
* a load or install that fails falls back to a normal compile, with one warning;
* a restarted process pays what a traced cache costs, no more: a loaded entry
  joins Dynamo's cache on its first call (``loaded``),
  where the entry that passed moves to the front and only its own backend is
  served, and loading a cached graph skips inductor's precompiled-header step
  (``bundling``);
* every switch is scoped to our compiles: AOTAutograd bundling and its key
  without the package's backend id (``bundling``), the guard pickler's
  by-path code objects (``guards``).

This module is a package's life: made, keyed, loaded, installed, compiled,
saved.  ``loaded``: loaded entries joining Dynamo's cache; ``bundling``:
AOTAutograd entries of ours; ``guards``: guards saved with their proof and
built again in a restarted process; ``proofs``: the proofs on torch's trees.

Needs torch's per-compile bypass (``CompilePackage.bypass_current_compile``,
torch 2.15): with a per-function bypass one unsaveable compile drops the
function's whole entry, and 2.13's install breaks a later in-process recompile.
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import types
import weakref
from typing import Any

from stableguards.codes import descriptor_source, frame_label
from stableguards.components import Components
from stableguards.events import EVENTS
from stableguards.hooks.core import Hook, Needs, cache_subdir, registered_name
from stableguards.hooks.seams import fills
from stableguards.storage import ContentStore, configured
from stableguards.storage import messages as store_messages
from stableguards.storage.artifacts import cpu_isa
from stableguards.storage.content import lease_seconds
from stableguards.identity import fx_home
from stableguards.warm_start import messages, variants
from stableguards.warm_start.hooks import bundling, folds, graph_params, guards, loaded, optimizer_init, proofs, tracing
from stableguards.identity.names import module_of_globals
from stableguards.warm_start.index import changed_components, write_index
from stableguards.warm_start.key import entry_key
from stableguards.warm_start.state import STATE

_PACKAGE = "torch._dynamo.package"
_AUTOGRAD_CACHE = "torch._functorch._aot_autograd.autograd_cache"
# Bumped when what an entry holds changes meaning: older entries are then never found (5: the
# proof holds custom operators' kernels and the hash seed, which an older entry never checked;
# 6: an older entry may have folded an id() read as a number behind an id check by name;
# 7: a fact's code no longer holds torch's recompile hint; 8: the functions a saved entry names
# to rebuild objects moved to other modules).
_ENTRY_FORMAT = "8"


@dataclasses.dataclass
class Ours:
    """A package stableguards made: what its key needs besides the function; once
    torch.compile(fn) ran, the key and the function's code."""

    backend: str
    dynamic: Any
    key: Components | None = None
    code: Any = None
    # Calls its compiles folded about this process (a rank): its entry is kept per answer.
    folded: set[variants.Call] = dataclasses.field(default_factory=set)


def _serializable(backend: Any) -> bool:
    """Backends whose compiled graphs torch saves in a package: inductor's."""
    import torch

    wrapper = getattr(torch, "_TorchCompileInductorWrapper", None)
    return (isinstance(wrapper, type) and type(backend) is wrapper) or registered_name(backend) == "inductor" \
        or backend == "inductor"


def _optimize(call: Any, rebuild_ctx: Any, backend: Any = "inductor", *args: Any, **kwargs: Any) -> Any:
    """Give a compile for a serializable backend a package of ours.  A user who set torch's
    caching_precompile, or passed a package, gets torch's own."""
    import torch._dynamo.config as dynamo_config

    if kwargs.get("package") is not None or kwargs.get("disable") or dynamo_config.caching_precompile \
            or not _serializable(backend):
        return call(rebuild_ctx, backend, *args, **kwargs)
    from torch._dynamo.package import CompilePackage

    from stableguards.hooks.fingerprints import backend_fingerprint

    fingerprint = backend_fingerprint(backend)
    if not fingerprint.stable:
        return call(rebuild_ctx, backend, *args, **kwargs)
    package = CompilePackage(fn=None, dynamo=None, ignore_inlined_sources=False)
    STATE.ours[package] = Ours(f"{fingerprint.description} #{fingerprint.digest}", kwargs.get("dynamic"))
    return call(rebuild_ctx, backend, *args, **{**kwargs, "package": package})


def _context_call(call: Any, self: Any, fn: Any) -> Any:
    """torch.compile(fn): initialize our package for ``fn``, with the saved entry under
    stableguards' key if there is one, installed.

    Installed entries live on the code object and serve every compiled context
    that runs it, whatever its backend, so one code object gets entries from
    one key only: a second context for it with another key (another backend,
    options, receiver class) uninstalls them, and a context created after
    another one loads nothing.  Both then compile as usual.  A callable with no
    code of its own (a ``functools.partial``, a callable object) compiles
    without a package, as it would with the flag off.
    """
    package = getattr(self, "_package", None)
    ours = STATE.ours.get(package) if package is not None else None
    if ours is None or package.is_initialized():
        return call(self, fn)
    target = _target(fn)
    code = getattr(getattr(target, "__func__", target), "__code__", None)
    home, unnamed = _home(target) if code is not None else (None, "")
    if code is not None and home is None:
        messages.left_out(frame_label(code), "its globals are no module's: a restarted process could not find "
                                             "where to install its entry" + unnamed)
        self._package = None
        return call(self, fn)
    # Keyed as the package records it: by the module its code runs in (for torch.fx's code,
    # the home that names its globals; for a functools.wraps wrapper, its own module).
    installed = _installed_as(target, home) if code is not None else None
    key = _key_for(ours, installed) if code is not None else None
    if code is None or not _claim(code, key.digest if key is not None else None) or key is None:
        self._package = None  # torch's compile, without a package
        return call(self, fn)
    ours.key, ours.code = key, code
    # Warm start is for a restarted process.  An entry this process saved itself
    # is not loaded back (after torch._dynamo.reset(), say): torch's own caches
    # serve that compile, as without the flag.
    import torch._dynamo

    # Never traced by Dynamo: compiled autograd asks for its graph's compile while the
    # frame that ran backward() is still under Dynamo's callback, which would trace the
    # loading code's frames (a dataclass's generated __init__).
    torch._dynamo.disable(_load_and_initialize)(package, installed, code, key)
    return call(self, fn)


def _load_and_initialize(package: Any, installed: Any, code: Any, key: Components) -> None:
    entry = _load(key, code) if key.digest not in STATE.saved_here else None
    _initialize(package, installed, entry, code, key)


def _home(target: Any) -> tuple[str | None, str]:
    """The module whose globals ``target``'s code runs in, or None and why.  A graph module's
    ``forward`` runs in torch.fx's own globals: its home is named by its code and the
    identities of those globals (``identity.fx_home``)."""
    function = getattr(target, "__func__", target)
    scope = getattr(function, "__globals__", {})
    found = module_of_globals(scope)
    if found is not None or not _fx_forward(target):
        return found, ""
    from stableguards.identity.compiled_autograd import compiled_autograd_identity
    from stableguards.identity.objects import Identities

    identities = Identities()
    name, unnamed = fx_home.home_name(function.__code__, scope,
                                      lambda v: identities.describe(v) or compiled_autograd_identity(v))
    if name is None:
        return None, f" (torch.fx's globals of a graph module, where {unnamed!r} has no identity)"
    return fx_home.register(scope, name, type(target.__self__)), ""


def _fx_forward(target: Any) -> bool:
    """Whether ``target`` is a graph module's ``forward`` as torch.fx generated it."""
    import torch.fx

    owner = getattr(target, "__self__", None)
    function = getattr(target, "__func__", None)
    return isinstance(owner, torch.fx.GraphModule) and function is vars(type(owner)).get("forward") \
        and function.__code__.co_filename.startswith(fx_home.FILE_PREFIX) and function.__closure__ is None


def _installed_as(target: Any, home: str) -> Any:
    """``target`` as the package records it: torch installs a package's compiled graphs and
    builds its guards in the module ``fn.__module__`` names, and a wrapper made with
    ``functools.wraps`` in another module (transformers' ``can_return_tuple``) names the
    wrapped function's module while its code runs in its own globals.  Such a wrapper is
    recorded as a copy that names the module it runs in: the same code, qualname and
    first line (what the package keys and checks by), the right globals."""
    function = getattr(target, "__func__", target)
    if function.__module__ == home:
        return target
    import types

    copy = types.FunctionType(function.__code__, function.__globals__, function.__name__, function.__defaults__,
                              function.__closure__)
    copy.__qualname__, copy.__module__, copy.__kwdefaults__ = function.__qualname__, home, function.__kwdefaults__
    return types.MethodType(copy, target.__self__) if hasattr(target, "__func__") else copy


def _code_source(call: Any, code: Any) -> tuple[str, str]:
    """Where a restarted process finds a frame's code: torch's answer, or for the getter or
    setter of a property (transformers' ``loss_function``, reached after a graph break) the
    property's name and ``fget.__code__``, which torch's lookup follows."""
    from torch._dynamo.package import PackageError

    try:
        return call(code)
    except PackageError:
        found = descriptor_source(code)
        if found is None:
            raise
        return found


def _load(key: Components, code: Any) -> Any:
    """The saved entry under ``key`` for this process, or None (nothing saved, or unusable:
    one warning).

    While another process holds the entry's lease (it is compiling the same entry from
    the same store), wait for it instead of compiling the same graphs; else take the
    lease, held until this process saves the entry (``_save``) or gives up on it."""
    store = _entries()
    try:
        data = _fetch(store, key.digest)
        # Never wait for a lease this process holds itself (a compile of the same key under
        # way or unsaved here, e.g. before torch._dynamo.reset()).
        if data is None and key.digest not in STATE.leases and store.held(_NAMESPACE, key.digest):
            messages.waiting(frame_label(code), store.describe())
            if store.wait_released(_NAMESPACE, key.digest, lease_seconds()):
                data = _fetch(store, key.digest)
        if data is None:
            if store.claim(_NAMESPACE, key.digest, lease_seconds()):
                if not STATE.leases:
                    atexit.register(_release_leases)  # an entry still waiting for its backward
                STATE.leases[key.digest] = store
            _explain_miss(code, key)
            return None
        return _read_entry(data)
    except Exception as error:  # noqa: BLE001 - a corrupt, foreign, unsigned entry or an unreachable store
        store_messages.warn_unreadable("a saved compiled entry", store.describe(), error)
        messages.not_used(frame_label(code), f"unreadable: {error!s:.200}")
        return None


def _fetch(store: ContentStore, digest: str) -> bytes | None:
    """The entry under ``digest``, or its variant for this process when its compiles folded
    calls about their process (``warm_start.variants``)."""
    calls = store.fetch(_CALLS, digest)
    if calls is None:
        return store.fetch(_NAMESPACE, digest)
    return store.fetch(_NAMESPACE, f"{digest}.{variants.variant(calls)}")


def _read_entry(data: bytes) -> Any:
    """A saved entry's backends recorded where torch's loader finds them, as
    ``DynamoStore.load_cache_entry`` does."""
    import pickle

    from torch._dynamo.precompile_context import BackendCacheArtifact, PrecompileContext

    entry = pickle.loads(data)  # noqa: S301 - verified (digest, and the HMAC with a key) by the store
    for backend in entry.backends.values():
        inner = backend.content if isinstance(backend, bundling.FlatInputsArtifact) else backend
        if not isinstance(inner, BackendCacheArtifact):
            raise TypeError(f"a saved backend is a {type(backend).__name__}, not a BackendCacheArtifact")
        PrecompileContext.record_artifact(backend)
    return entry


def _shorten_lease(digest: str) -> None:
    """An entry that waits for its backward (compiled on first use, which may never come: a
    forward run with grad and no backward) keeps its lease for a tenth of the lease period
    only: others wait that long for it at most, then compile it themselves."""
    store = STATE.leases.get(digest)
    if store is None:
        return
    with contextlib.suppress(Exception):  # an unreachable store: the lease expires by itself
        store.release(_NAMESPACE, digest)
        if store.claim(_NAMESPACE, digest, lease_seconds() / 10):
            return
    STATE.leases.pop(digest, None)


def _release_leases() -> None:
    for digest in list(STATE.leases):
        _release_lease(digest)


def _release_lease(digest: str) -> None:
    store = STATE.leases.pop(digest, None)
    if store is not None:
        with contextlib.suppress(Exception):  # an unreachable store: the lease expires by itself
            store.release(_NAMESPACE, digest)


def _initialize(package: Any, target: Any, entry: Any, code: Any, key: Components) -> None:
    """Initialize ``package`` for ``target`` with the saved entry installed; on any failure,
    fresh (torch's own constructor resets a package that half-installed)."""
    if entry is not None:
        try:
            package.initialize(target, entry.dynamo, ignore_inlined_sources=False)
            _install(package, entry.backends)
        except Exception as error:  # noqa: BLE001 - changed sources, versions, a failed install
            with contextlib.suppress(Exception):
                package.uninstall()
            STATE.drop_loaded(package)
            package.__init__(fn=None, dynamo=None, ignore_inlined_sources=False)
            messages.not_used(frame_label(code), f"{error!r:.200}")
        else:
            STATE.installed[STATE.by_code(code)] = (key.digest, weakref.ref(package))
            messages.loaded(frame_label(code))
            return
    package.initialize(target, None, ignore_inlined_sources=False)


def _install(package: Any, backends: Any) -> None:
    """Install a package's entries (``_keep_loaded`` receives each).  A failure warns once."""
    _drop_unfound(package)
    token = STATE.installing.set(package)
    try:
        package.install(backends)
    except Exception as error:
        EVENTS.warn_once("warm start install", f"stableguards: a saved compiled entry could not be installed "
                                              f"({error!r}); compiling as usual")
        raise
    finally:
        STATE.installing.reset(token)


def _drop_unfound(package: Any) -> None:
    """Find the code of frames where it is now, or leave their entries out.

    torch finds a frame's code again by the path it took in the cold process,
    which can lead elsewhere here: ``SGD.step`` is reached through the wrapper
    ``Optimizer`` puts on the class when the first optimizer is made.  Before
    one is made (``torch.compile(step)`` first), that path is not there and
    torch fails the whole install; or it names another function's code
    (``step.__code__`` is the unwrapped step's, where the cold process found
    the wrapper's), on which torch would install the entry's guards and code.
    So the code found must be the very code the cold process compiled (the
    entry holds it: equal code objects).  Where it is not, it is looked for by
    unwrapping the function of that name (``functools.wraps``'
    ``__wrapped__``); where it is not there either, the entry is left out, and
    the frame compiles as usual when it runs."""
    from torch._dynamo.package import PackageError, SerializedCode, _lookup_code

    main = package._innermost_fn.__code__
    for code, entry in list(package._codes.items()):
        if code is main or not entry.code_source:
            continue
        compiled = SerializedCode.to_code_object(entry.python_code)
        try:
            if _lookup_code(entry) == compiled:
                continue
        except PackageError:
            pass
        path = _unwrapped_path(entry, compiled)
        if path is not None:
            entry.code_source = path
            continue
        del package._codes[code]
        messages.not_used(frame_label(code), f"its code is not at {entry.code_source!r} here yet")


def _unwrapped_path(entry: Any, code: Any) -> str | None:
    """A path to ``code`` from the function the entry names, through ``__wrapped__`` only;
    None where unwrapping it does not reach that code."""
    from stableguards.codes import resolve

    if len(entry.function_names) != 1 or not entry.code_source.endswith("__code__"):
        return None
    try:
        fn = resolve(entry.python_module, entry.function_names[0])
    except (KeyError, AttributeError):
        return None
    path: list[str] = []
    while fn is not None and len(path) < 16:  # inspect.unwrap's walk, with its path
        if isinstance(getattr(fn, "__code__", None), types.CodeType) and fn.__code__ == code:
            return ".".join([*path, "__code__"])
        fn = getattr(fn, "__wrapped__", None)
        path.append("__wrapped__")
    return None


def _claim(code: Any, digest: str | None) -> bool:
    """Record a compiled context for ``code``; whether it may load and save entries."""
    mine = digest or "other"
    row = STATE.by_code(code)
    installed = STATE.installed.get(row)
    if installed is not None and installed[0] != mine:
        package = installed[1]()
        if package is not None:
            package.uninstall()
        del STATE.installed[row]
        messages.left_out(
            frame_label(code), "its installed entry was removed: another compiled context (backend, options "
                               "or receiver class) runs the same code in this process")
    seen = STATE.contexts.setdefault(row, set())
    others = seen - {mine}
    seen.add(mine)
    return digest is not None and not others


def _target(fn: Any) -> Any:
    """What torch.compile(fn) compiles and keys by: a module's forward, unwrapped."""
    import torch
    from torch._dynamo.eval_frame import innermost_fn

    return innermost_fn(fn.forward if isinstance(fn, torch.nn.Module) else fn)


def _key_for(ours: Ours, target: Any) -> Components:
    from torch._dynamo.package import CompilePackage

    key = entry_key(torch_key=CompilePackage.source_id_from_fn(target), fn=target, backend=ours.backend,
                    options={"dynamic": ours.dynamic}, configs=_configs())
    # The entry holds inductor's C++ source, written for this machine's vector ISA (cpu_isa).
    return Components((("format", _ENTRY_FORMAT), *key.items, ("cpu_isa", cpu_isa())))


def _configs() -> dict[str, dict[str, Any]]:
    import torch._dynamo.config as dynamo_config
    import torch._functorch.config as functorch_config
    import torch._inductor.config as inductor_config

    from stableguards.hooks.core import FLAG

    # Copies: a custom pass is written by its uuid(), an object with an address in its repr
    # as one this process alone knows (key.stable_repr).
    dynamo = {k: v for k, v in dynamo_config.get_config_copy().items() if k != FLAG}
    return {"dynamo": dynamo, "inductor": inductor_config.get_config_copy(),
            "functorch": functorch_config.get_config_copy()}


_NAMESPACE = "warm_start"
_CALLS = "warm_start_calls"  # the calls an entry's variants are chosen by (warm_start.variants)


def _entries() -> ContentStore:
    """Our entries' store: ``STABLEGUARDS_STORE``, or a directory of ours in the cache dir."""
    return configured(cache_subdir("store"))


@fills("convert_frame.compile", "warm_start")
def compile_frame(call: Any, self: Any, frame: Any, *args: Any, **kwargs: Any) -> Any:
    """A frame starts compiling (``hooks.seams``): compile it for our package, then save its
    entry: every compile, not only on request.

    A compile that fails with our package in the way (bundling, guard saving)
    is compiled again without it, once; the function goes on without a package.
    Only inductor compiles get a package, so a user's backend is never called
    twice; a failure torch raises on purpose (a strict cache's bypass) or
    Dynamo's control flow is not retried."""
    package = getattr(self, "_package", None)
    ours = STATE.ours.get(package) if package is not None else None
    if ours is None or ours.key is None or not package.is_initialized():
        if ours is not None:
            # Never initialized by torch.compile(fn) (a context used as a decorator or
            # a `with` block): torch would fail on it, so this compile goes without.
            self._package = None
        return call(self, frame, *args, **kwargs)
    frame_name = frame_label(frame.f_code)
    traced = proofs.Traced()
    before = _contents(package)
    tokens = [(STATE.frame, STATE.frame.set(frame_name)), (STATE.bundling, STATE.bundling.set(True)),
              (STATE.traced, STATE.traced.set(traced))]
    try:
        result = call(self, frame, *args, **kwargs)
    except Exception as error:
        if not _retry_without_package(error):
            if package not in STATE.pending:
                _release_lease(ours.key.digest)  # a graph break, a skipped frame: nothing saved now
            raise
        failure = error
    else:
        failure = None
    finally:
        for var, token in reversed(tokens):
            var.reset(token)
    if failure is not None:
        from torch._dynamo.exc import PackageError

        self._package = None
        if not isinstance(failure, PackageError):
            # Our machinery in the way: worth a warning.  A PackageError is torch saying what
            # its package cannot hold (a frame whose code it cannot name, a property's
            # getter): named in explain() only.
            EVENTS.fell_back("warm start compile", failure)
        messages.left_out(frame_name, f"compiling it for a saved entry failed ({failure!r:.200}); compiled "
                                      f"again without")
        _release_lease(ours.key.digest)
        return call.fn(self, frame, *args, **kwargs)
    ours.folded |= {(c.fn.__module__, c.fn.__qualname__, c.args, tuple(sorted(c.kwargs.items())))
                    for c in traced.constants if tracing.folds_process_state(c.fn)
                    and variants.jsonable([c.args, list(c.kwargs.values())])}
    if _contents(package) != before:
        _save(package, ours, frame_name)
    if package not in STATE.pending:
        _release_lease(ours.key.digest)  # saved, or nothing to save: nobody need wait
    return result


def _contents(package: Any) -> tuple[int, int, int, int]:
    """What a compile can add to a package: code objects, guarded codes, backends, bypasses.

    A compile that added none (a skipped frame: every frame a backward run
    from a compiled region shows Dynamo under compiled autograd, hundreds per
    step) leaves the entry as it was saved, so it is not written again."""
    codes = package._codes.values()
    return (len(codes), sum(len(c.guarded_codes) for c in codes), sum(len(c.backend_ids) for c in codes),
            sum(bool(getattr(c, "bypassed", False)) for c in codes))


def _retry_without_package(error: Exception) -> bool:
    """A failure that compiling without our package might not have: a backend failure, a
    package error, an internal error or any exception outside Dynamo's own; not Dynamo's
    control flow (a graph break, a skipped frame, a restart), not torch's deliberate
    refusal to cache under ``strict_autograd_cache``."""
    from torch._dynamo import exc
    from torch._functorch._aot_autograd.autograd_cache import BypassAOTAutogradCache

    cause: BaseException | None = error
    while cause is not None:
        if isinstance(cause, (BypassAOTAutogradCache, exc.FailOnRecompileLimitHit)):
            return False
        cause = getattr(cause, "inner_exception", None) or cause.__cause__
    if isinstance(error, exc.TorchDynamoException):
        return isinstance(error, (exc.BackendCompilerFailed, exc.InternalTorchDynamoError, exc.PackageError))
    return True


@dataclasses.dataclass(eq=False)
class _Pending:
    """A package's entry waiting for a graph compiled later (a backward, on first use)."""

    frame: str
    ours: Ours
    entry: Any  # the package's entry when it last compiled: its codes are the package's own
    orphan: Any = None  # weakref.finalize: keeps this record once the package is gone


def _save(package: Any, ours: Ours, frame: str) -> None:
    """Save a package's entry, or keep it waiting for a graph compiled later.

    A waiting entry outlives its package: ``torch.compile(fn)(x).backward()``
    drops the compiled function, and with it the package, before the backward
    compiles.  Its last entry (plain data: codes, serialized guards) is kept
    and saved when the artifact arrives (``_record_artifact``)."""
    entry = package.cache_entry()
    if _written(entry, ours, frame) is not None:
        if (record := STATE.pending.pop(package, None)) is not None:
            record.orphan.detach()
        return
    record = STATE.pending.get(package)
    if record is None:
        messages.pending(frame)
        _shorten_lease(ours.key.digest)
        record = STATE.pending[package] = _Pending(frame, ours, entry)
        record.orphan = weakref.finalize(package, STATE.orphans.append, record)
        record.orphan.atexit = False
    record.entry, record.frame = entry, frame


def _written(entry: Any, ours: Ours, frame: str) -> bool | None:
    """Write ``entry`` to the store: whether it was written (False: nothing to save, or it
    cannot be); None while a graph's artifact is still to come."""
    from torch._dynamo.precompile_context import PrecompileContext

    if not any(code.guarded_codes for code in entry.codes):
        return False
    if unsaveable := [STATE.unsaveable[bid] for bid in entry.backend_ids if bid in STATE.unsaveable]:
        messages.left_out(frame, f"a backward compiled on first use cannot be saved: {unsaveable[0]}")
        return False
    if any(PrecompileContext.serialize_artifact_by_key(bid) is None for bid in entry.backend_ids):
        # A training graph's AOTAutograd entry exists once its backward has
        # compiled, on first use: saved then (_record_artifact).
        return None
    try:
        data = _entry_bytes(entry)
        store, name = _entries(), ours.key.digest
        if ours.folded:
            calls = variants.dumps(ours.folded)
            name = f"{name}.{variants.variant(calls)}"
            store.publish(_CALLS, ours.key.digest, calls)
        store.publish(_NAMESPACE, name, data)
    except Exception as error:  # noqa: BLE001 - an entry torch cannot pickle, or an unreachable store
        if not isinstance(error, RuntimeError):
            store_messages.warn_unwritable("a compiled entry", _entries().describe(), error)
        messages.left_out(frame, f"not saved ({error!s:.200})")
        _release_lease(ours.key.digest)
        return False
    _release_lease(ours.key.digest)
    messages.saved()
    STATE.saved_here.add(ours.key.digest)
    write_index(cache_subdir("warm_start"), ours.key, ours.code)
    return True


def _entry_bytes(entry: Any) -> bytes:
    """A package's entry with its backends, pickled as ``DynamoStore.save_cache_entry``
    would write it.  Our store only: torch's mega-cache (``save_cache_artifacts``)
    records what the user's settings make torch save, and these entries are ours."""
    import pickle

    from torch._dynamo.package import PrecompileCacheEntry
    from torch._dynamo.precompile_context import PrecompileContext
    from torch.compiler._cache import CacheArtifactManager

    with CacheArtifactManager.with_fresh_cache():
        backends = {bid: PrecompileContext.serialize_artifact_by_key(bid) for bid in entry.backend_ids}
        try:
            return pickle.dumps(PrecompileCacheEntry(entry, backends))
        except Exception as error:
            raise RuntimeError(f"Failed to pickle the entry: {error}") from error


def _record_artifact(call: Any, cls: Any, artifact: Any) -> None:
    """A graph's compiled artifact arrived (a backward, compiled on first use): save the
    packages that waited for one.  One compiled with flat inputs is recorded with what
    flattens them (``bundling.flat_inputs``)."""
    call(cls, bundling.flat_inputs(artifact))
    for package, record in list(STATE.pending.items()):
        if package.current_entry is None:  # one being compiled is saved when its compile ends
            _save(package, record.ours, record.frame)
    for record in list(STATE.orphans):  # their packages are gone: their last entries
        if _written(record.entry, record.ours, record.frame) is not None:
            STATE.orphans.remove(record)


def _bypass_package(call: Any, self: Any, reason: str = "", **kwargs: Any) -> None:
    """A compile left out of one of our packages: named in explain() rather than in torch's
    warning, and never an error (``strict_precompile`` is about the user's packages)."""
    frame = STATE.frame.get()
    if frame is None or self.package is None or self.package not in STATE.ours:
        return call(self, reason, **kwargs)
    traced = STATE.traced.get()
    if reason == graph_params.STATIC_ADDRESSES and traced is not None and graph_params.rebindable(self):
        return None  # kept: its tensors are bound in another process (graph_params.record)
    messages.left_out(frame, reason)
    self.package.bypass_current_compile()
    self.package = None


def _explain_miss(code: Any, key: Components) -> None:
    differences = changed_components(cache_subdir("warm_start"), key, code)
    if differences:
        messages.missed(frame_label(code), differences)


# torch's per-compile bypass (see the module docstring): found, not hooked.
NEEDS = (Needs(_PACKAGE, "CompilePackage.bypass_current_compile"),)
HOOKS = [
    Hook("torch._dynamo.eval_frame", "_optimize", "warm_start", _optimize, params=("backend", "package")),
    Hook("torch._dynamo.eval_frame", "_TorchDynamoContext.__call__", "warm_start", _context_call,
         params=("fn",)),
    Hook(_PACKAGE, "_get_code_source", "warm_start", _code_source),
    Hook("torch._dynamo.output_graph", "OutputGraph.bypass_package", "warm_start", _bypass_package,
         params=("reason",)),
    Hook("torch._dynamo.precompile_context", "PrecompileContext.record_artifact", "warm_start", _record_artifact,
         params=("artifact",)),
]
HOOKS += loaded.HOOKS + bundling.HOOKS + guards.HOOKS + tracing.HOOKS + folds.HOOKS + optimizer_init.HOOKS
