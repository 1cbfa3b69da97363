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

import contextlib
import types
import weakref
from typing import Any

from stableguards.codes import descriptor_source, frame_label
from stableguards.components import Components
from stableguards.events import EVENTS
from stableguards.hooks.core import Hook, Needs, registered_name
from stableguards.identity import fx_home
from stableguards.identity.names import module_of_globals
from stableguards.storage import messages as store_messages
from stableguards.storage.artifacts import cpu_isa
from stableguards.warm_start import entries, messages
from stableguards.warm_start.hooks import (bundling, compiles, ddp, folds, guards, kernels, loaded, optimizer_init,
                                          tracing)
from stableguards.warm_start.key import entry_key
from stableguards.warm_start.state import STATE, Ours

_PACKAGE = "torch._dynamo.package"
_AUTOGRAD_CACHE = "torch._functorch._aot_autograd.autograd_cache"
# Bumped when what an entry holds changes meaning: older entries are then never found (5: the
# proof holds custom operators' kernels and the hash seed, which an older entry never checked;
# 6: an older entry may have folded an id() read as a number behind an id check by name;
# 7: a fact's code no longer holds torch's recompile hint; 8: the functions a saved entry names
# to rebuild objects moved to other modules).
_ENTRY_FORMAT = "8"


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
    with EVENTS.timed("warm start key"):
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
    with EVENTS.timed("warm start load"):
        entry = _load(key, code) if key.digest not in STATE.saved_here else None
    with EVENTS.timed("warm start install"):
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
    one warning).  Waits for an entry another process is compiling; on a miss, holds the
    entry's lease until this process saves it (``_save``) or gives up on it
    (``warm_start.entries``)."""
    try:
        where = entries.store().describe()
        data = entries.LEASES.fetch_or_claim(key.digest, lambda by: messages.waiting(frame_label(code), where, by),
                                             lambda by: messages.waiting_long(frame_label(code), where, by),
                                             lambda why: messages.not_coming(frame_label(code), why))
        if data is None:
            if differences := entries.changed(key, code):
                messages.missed(frame_label(code), differences)
            return None
        EVENTS.count("warm_start_loaded_bytes", len(data))
        return _read_entry(data)
    except Exception as error:  # noqa: BLE001 - a corrupt, foreign, unsigned entry or an unreachable store
        store_messages.warn("a saved compiled entry could not be read", entries.store().describe(), error)
        messages.not_used(frame_label(code), f"unreadable: {error!s:.200}")
        return None


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
    with STATE.loading_as(package=package):
        try:
            package.install(backends)
        except Exception as error:
            EVENTS.warn_once("warm start install", f"stableguards: a saved compiled entry could not be installed "
                                                  f"({error!r}); compiling as usual")
            raise


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


# torch's per-compile bypass (see the module docstring): found, not hooked.
NEEDS = (Needs(_PACKAGE, "CompilePackage.bypass_current_compile"),)
HOOKS = [
    Hook("torch._dynamo.eval_frame", "_optimize", "warm_start", _optimize, params=("backend", "package")),
    Hook("torch._dynamo.eval_frame", "_TorchDynamoContext.__call__", "warm_start", _context_call,
         params=("fn",)),
    Hook(_PACKAGE, "_get_code_source", "warm_start", _code_source),
]
HOOKS += compiles.HOOKS + loaded.HOOKS + bundling.HOOKS + guards.HOOKS + tracing.HOOKS + folds.HOOKS
HOOKS += optimizer_init.HOOKS + kernels.HOOKS + ddp.HOOKS
