"""Warm start: save each compiled frame's entry, install it in a restarted process.

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
  its proof (``_serialize_guards``, ``warm_start.torch_guards``), checked by loading
  them back before the entry is saved, and again in the restarted process on
  the call the entry would serve first (``_serve_loaded``);
* a load or install that fails falls back to a normal compile, with one warning;
* a restarted process pays what a traced cache costs, no more: a loaded entry
  joins Dynamo's cache on its first call (``_keep_loaded``, ``_serve_loaded``),
  where the entry that passed moves to the front and only its own backend is
  served, and loading a cached graph skips inductor's precompiled-header step
  (``_precompile_header``);
* every switch is scoped to our compiles: AOTAutograd bundling, the guard
  pickler's by-path code objects, the AOTAutograd key without the package's
  backend id.

Needs torch's per-compile bypass (``CompilePackage.bypass_current_compile``,
torch 2.15): with a per-function bypass one unsaveable compile drops the
function's whole entry, and 2.13's install breaks a later in-process recompile.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import inspect
import weakref
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from stableguards.codes import code_at, code_path, frame_label
from stableguards.components import Components
from stableguards.events import EVENTS
from stableguards.hooks.core import Hook, TorchError, cache_subdir, registered_name
from stableguards.warm_start import messages, torch_guards
from stableguards.warm_start.guard_rules import Unprovable
from stableguards.warm_start.index import changed_components, write_index
from stableguards.warm_start.key import entry_key
from stableguards.warm_start.state import STATE

_PACKAGE = "torch._dynamo.package"
_AUTOGRAD_CACHE = "torch._functorch._aot_autograd.autograd_cache"
# Bumped when what an entry holds changes meaning: older entries are then never found.
_ENTRY_FORMAT = "3"


@dataclasses.dataclass
class Ours:
    """A package stableguards made: what its key needs besides the function; once
    torch.compile(fn) ran, the key and the function's code."""

    backend: str
    dynamic: Any
    key: Components | None = None
    code: Any = None


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

    from stableguards.backends.hooks import backend_fingerprint

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
    key = _key_for(ours, target) if code is not None else None
    if code is None or not _claim(code, key.digest if key is not None else None) or key is None:
        self._package = None  # torch's compile, without a package
        return call(self, fn)
    ours.key, ours.code = key, code
    # Warm start is for a restarted process.  An entry this process saved itself
    # is not loaded back (after torch._dynamo.reset(), say): torch's own caches
    # serve that compile, as without the flag.
    entry = _load(key, code) if key.digest not in STATE.saved_here else None
    _initialize(package, target, entry, code, key)
    return call(self, fn)


def _load(key: Components, code: Any) -> Any:
    """The saved entry under ``key``, or None (nothing saved, or unreadable: one warning)."""
    path = _store_path(key.digest)
    if not path.exists():
        _explain_miss(code, key)
        return None
    try:
        return _store().load_cache_entry(key.digest)
    except Exception as error:  # noqa: BLE001 - a corrupt or foreign entry: compile as usual
        EVENTS.warn_once("warm start load", f"stableguards: a saved compiled entry could not be read ({error!r:.200}); "
                                           f"compiling as usual")
        messages.not_used(frame_label(code), f"unreadable: {error!r:.200}")
        return None


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
    token = STATE.installing.set(package)
    try:
        package.install(backends)
    except Exception as error:
        EVENTS.warn_once("warm start install", f"stableguards: a saved compiled entry could not be installed "
                                              f"({error!r}); compiling as usual")
        raise
    finally:
        STATE.installing.reset(token)


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
    return Components((("format", _ENTRY_FORMAT), *key.items))


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


def _store() -> Any:
    """Our entries' store: torch's disk store, in a directory of ours."""
    from torch._dynamo.package import DiskDynamoStore

    return DiskDynamoStore(str(cache_subdir("warm_start") / "entries"))


def _store_path(digest: str) -> Path:
    return cache_subdir("warm_start") / "entries" / digest / "entry"


@dataclasses.dataclass(frozen=True, eq=False)
class LoadedEntry:
    """A saved entry, loaded and waiting for its first call: its guards and code."""

    package: weakref.ref
    guard_manager: Any
    code: Any
    compile_id: Any


@dataclasses.dataclass(frozen=True, eq=False)
class LoadedProof:
    """Kept on a loaded entry's guard manager (``_load_guard_manager``): what it must prove,
    the guard state it was built from, and the globals it checks."""

    proof: Any
    guards_state: Any
    f_globals: dict


def _refusal(guard_manager: Any, f_locals: dict) -> str | None:
    """Why a loaded entry whose guards passed on this call may not serve it: its tree, written
    on this call, does not prove what the cold one did (``hooks.torch_guards.verify``)."""
    loaded = getattr(guard_manager, "stableguards", None)
    if loaded is None:
        return "it was loaded without its proof"
    return torch_guards.verify(loaded.proof, guard_manager, loaded.guards_state, f_locals, loaded.f_globals)


def _keep_loaded(call: Any, code: Any, guard_manager: Any, dynamo_code: Any) -> None:
    """Keep a loaded entry for Dynamo's own cache, not in torch's list of precompiled ones.

    Dynamo checks precompiled entries before its cache, in the order installed,
    for every backend.  A process that runs a function's entries in another
    order than they were compiled pays their failed guards on every call (a
    dynamic entry's shape guards: about 11 us each, chunk_ff), where a traced
    process moves the entry that passed to the front.  Kept here, an entry
    joins Dynamo's cache on its first call (``_serve_loaded``): from then on it
    is an entry like a traced one, moved to the front when it passes and
    checked only for its own backend.
    """
    package = STATE.installing.get()
    if package is None:
        return call(code, guard_manager, dynamo_code)
    if not _misses_compile():
        return call(code, _proven_on_first_pass(code, guard_manager), dynamo_code)
    from torch._guards import CompileContext

    entry = LoadedEntry(weakref.ref(package), guard_manager, dynamo_code, CompileContext.current_compile_id())
    # torch installs entries in compile order; Dynamo's own cache tries the newest first
    # (the dynamic one automatic dynamic shapes led to), and so do these.  Each entry's
    # guards decide alone whether it may serve, so any order is sound.
    STATE.loaded.setdefault(STATE.by_code(code), []).insert(0, entry)
    return None


def _proven_on_first_pass(code: Any, guard_manager: Any) -> Any:
    """A loaded entry going to torch's precompiled list, which Dynamo's C++ serves directly
    (under a stance where a miss never reaches ``_serve_loaded``): its proof is checked
    by an epilogue guard, which runs once every other guard has passed, on the first
    call that passes them; after that it answers from memory."""
    outcome: list[bool] = []
    frame = frame_label(code)

    def proven(f_locals: dict) -> bool:
        if not outcome:
            why = _refusal(guard_manager, f_locals)
            outcome.append(why is None)
            if why is not None:
                messages.not_used(frame, why)
        return outcome[0]

    guard_manager.root.add_epilogue_lambda_guard(proven, ["stableguards: the warm-start entry's proof holds"],
                                                 None)
    return guard_manager


def _serve_loaded(call: Any, self: Any, frame: Any, *args: Any, **kwargs: Any) -> Any:
    """A call no cache entry serves: the first loaded entry of this compiled context whose
    guards pass, and whose proof holds on this call, becomes the frame's cache entry, as a
    compile would make it.

    Sound as a compile's result is: the entry's guards are checked on this call
    (and on every later one, by Dynamo), and before it serves the first, what
    they prove here is compared with what the cold compile's proved
    (``_refusal``): an entry that proves less is dropped, named in explain().
    Only the compiled context that loaded it (its package) is served, so
    another backend compiling the same code compiles its own.  Nothing is
    traced, and no frame is counted."""
    rows = STATE.loaded.get(STATE.by_code(frame.f_code)) if STATE.loaded else None
    if rows:
        package = getattr(getattr(self, "_inner_convert", None), "_package", None)
        for entry in list(rows):
            if entry.package() is not package or package is None or not entry.guard_manager.check(frame.f_locals):
                continue
            why = _refusal(entry.guard_manager, frame.f_locals)
            if why is None:
                return _admit(frame.f_code, entry)
            _drop(frame.f_code, entry)
            messages.not_used(frame_label(frame.f_code), why)
    return call(self, frame, *args, **kwargs)


def _drop(code: Any, entry: LoadedEntry) -> None:
    rows = STATE.loaded.get(STATE.by_code(code), [])
    with contextlib.suppress(ValueError):  # another thread took it first
        rows.remove(entry)
    if not rows:
        STATE.loaded.pop(STATE.by_code(code), None)


def _admit(code: Any, entry: LoadedEntry) -> Any:
    """What a compile of ``code`` returns and records, for a loaded entry."""
    from torch._dynamo.convert_frame import orig_code_map, output_codes
    from torch._dynamo.types import GuardedCode, wrap_guarded_code

    _drop(code, entry)  # another thread may have admitted it first: a duplicate entry, harmless
    # A later recompile names the guard that failed under the original code; reset clears both.
    orig_code_map[entry.code] = code
    output_codes.add(entry.code)
    return wrap_guarded_code(GuardedCode(entry.code, entry.guard_manager, entry.compile_id, "warm start"))


def _uninstall(call: Any, self: Any) -> None:
    """A package uninstalled: its loaded entries still waiting go too."""
    call(self)
    STATE.drop_loaded(self)


def _bypass_current_compile(call: Any, *args: Any, **kwargs: Any) -> None:
    """Feature detection only: torch's per-compile bypass exists (see the module docstring)."""
    return call(*args, **kwargs)


def _reset_code_caches(call: Any) -> None:
    """torch._dynamo.reset() drops Dynamo's cache entries: the loaded ones waiting too."""
    call()
    STATE.drop_loaded()


def _misses_compile() -> bool:
    """Whether a call no cache entry serves reaches ``_serve_loaded``: not under a stance
    that never compiles then (fail_on_recompile, eager_on_recompile,
    skip_guard_eval_unsafe) or compiles with a callback of its own (eager_then_compile)."""
    from torch._dynamo import eval_frame

    return eval_frame._stance.stance == "default" and not eval_frame._stance.skip_guard_eval_unsafe


def _set_stance(call: Any, stance: Any) -> Any:
    """Under a stance where a miss does not reach ``_serve_loaded`` (``_misses_compile``),
    the loaded entries still waiting go to torch's precompiled list, which Dynamo
    checks before anything else: as torch installs them."""
    prior = call(stance)
    if not _misses_compile() and STATE.loaded:
        from torch._C._dynamo.eval_frame import _load_precompile_entry

        rows, STATE.loaded = STATE.loaded, {}
        for (_, code), entries in rows.items():
            for entry in entries:
                if entry.package() is not None:
                    _load_precompile_entry(code, _proven_on_first_pass(code, entry.guard_manager), entry.code)
    return prior


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
    tokens = [(STATE.frame, STATE.frame.set(frame_name)), (STATE.bundling, STATE.bundling.set(True)),
              (STATE.traced, STATE.traced.set(torch_guards.Traced()))]
    try:
        result = call(self, frame, *args, **kwargs)
    except Exception as error:
        if not _retry_without_package(error):
            raise
        failure = error
    else:
        failure = None
    finally:
        for var, token in reversed(tokens):
            var.reset(token)
    if failure is not None:
        self._package = None
        EVENTS.fell_back("warm start compile", failure)
        messages.left_out(frame_name, f"compiling it for a saved entry failed ({failure!r:.200}); compiled "
                                      f"again without")
        return call.fn(self, frame, *args, **kwargs)
    _save(package, ours, frame_name)
    return result


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


def _save(package: Any, ours: Ours, frame: str) -> None:
    from torch._dynamo.precompile_context import PrecompileContext
    from torch.compiler._cache import CacheArtifactManager

    entry = package.cache_entry()
    if not any(code.guarded_codes for code in entry.codes):
        return
    if unsaveable := [STATE.unsaveable[bid] for bid in entry.backend_ids if bid in STATE.unsaveable]:
        STATE.pending.pop(package, None)
        messages.left_out(frame, f"a backward compiled on first use cannot be saved: "
                                                      f"{unsaveable[0]}")
        return
    if any(PrecompileContext.serialize_artifact_by_key(bid) is None for bid in entry.backend_ids):
        # A training graph's AOTAutograd entry exists once its backward has
        # compiled, on first use: saved then (_record_artifact).
        if package not in STATE.pending:
            messages.pending(frame)
        STATE.pending[package] = frame
        return
    try:
        # Written to our store only: torch's mega-cache (save_cache_artifacts) records
        # what the user's settings make torch save, and these entries are ours.
        with CacheArtifactManager.with_fresh_cache():
            _store().save_cache_entry(entry, ours.key.digest)
    except RuntimeError as error:
        messages.left_out(frame, f"not saved ({error})")
        return
    STATE.pending.pop(package, None)
    messages.saved()
    STATE.saved_here.add(ours.key.digest)
    write_index(cache_subdir("warm_start"), ours.key, ours.code)


def _record_artifact(call: Any, cls: Any, artifact: Any) -> None:
    """A graph's compiled artifact arrived (a backward, compiled on first use): save the
    packages that waited for one."""
    call(cls, artifact)
    for package, frame in list(STATE.pending.items()):
        _save(package, STATE.ours[package], frame)


def _bundle_autograd_entries(call: Any) -> bool:
    """AOTAutograd entries of ours are bundled (self-contained): a package saves its graphs
    from them.  Any other compile bundles as the user's settings say."""
    return STATE.bundling.get() or call()


def _compile_backward(call: Any, self: Any, *args: Any, **kwargs: Any) -> Any:
    """A backward compiled on first use, for a graph of ours: its entry is bundled too."""
    backend_id = getattr(self.aot_config, "precompile_backend_id", None)
    if backend_id not in STATE.backend_ids:
        return call(self, *args, **kwargs)
    tokens = [(STATE.bundling, STATE.bundling.set(True)), (STATE.backward_of, STATE.backward_of.set(backend_id))]
    try:
        return call(self, *args, **kwargs)
    finally:
        for var, token in reversed(tokens):
            var.reset(token)


def _save_aot_entry(call: Any, *compiled_fns: Any) -> bool:
    """Whether AOTAutograd saves a graph's entry.  A bundled entry holds inductor's compiled
    code; for a graph with nothing to compute inductor returns the graph itself, which
    bundling cannot hold (torch 2.15 fails the compile: "expected OutputCode").  Such a
    graph of ours is saved as the user's settings say, and left out of its entry."""
    if not STATE.bundling.get() or all(_is_output_code(fn) for fn in compiled_fns if fn is not None):
        return call(*compiled_fns)
    token = STATE.bundling.set(False)
    try:
        saved = call(*compiled_fns)
    finally:
        STATE.bundling.reset(token)
    _leave_out("inductor returned a graph with nothing to compute as it is: there is no compiled code to save")
    return saved


def _is_output_code(fn: Any) -> bool:
    from torch._inductor.output_code import OutputCode

    while hasattr(fn, "__wrapped__"):
        fn = fn.__wrapped__
    return isinstance(fn, OutputCode)


def _leave_out(reason: str) -> None:
    """Leave the graph being compiled out of our package: the frame's compile (torch's
    per-compile bypass), or the function whose backward this is."""
    backward_of = STATE.backward_of.get()
    if backward_of is not None:
        STATE.unsaveable[backward_of] = reason
        return
    from torch._dynamo.symbolic_convert import InstructionTranslator

    tx = getattr(InstructionTranslator, "current_tx", lambda: None)()
    if tx is not None and tx.output.package is not None:
        tx.output.bypass_package(reason)


def _user_bundles() -> bool:
    """Whether torch would bundle AOTAutograd entries with the user's settings alone."""
    import torch._dynamo.config as dynamo_config
    import torch._functorch.config as functorch_config

    return bool(functorch_config.bundled_autograd_cache or dynamo_config.caching_precompile)


def _count_bundled_hit(call: Any, self: Any, example_inputs: Any) -> Any:
    """An inductor graph served from a bundled AOTAutograd entry counts as an FX-graph
    cache hit when only warm start bundles: unbundled, the same AOTAutograd hit
    reads the graph from the FX-graph cache and counts it there (the counter and
    the compile event), and users read them to see how much a cache saved."""
    result = call(self, example_inputs)
    if STATE.bundling.get() and not _user_bundles():
        from torch._dynamo.utils import CompileEventLogger, counters

        counters["inductor"]["fxgraph_cache_hit"] += 1
        CompileEventLogger.try_(CompileEventLogger.increment_toplevel, "inductor_fx_local_cache_hit_count")
    return result


def _load_compiled_graph(call: Any, self: Any, constants: Any) -> Any:
    """Load a cached inductor graph for one of our entries without preparing to compile C++
    (see _precompile_header)."""
    if STATE.installing.get() is None:
        return call(self, constants)
    token = STATE.loading_compiled.set(True)
    try:
        return call(self, constants)
    finally:
        STATE.loading_compiled.reset(token)


def _precompile_header(call: Any, header: str, hashable_cmd_line: str, **compile_command: Any) -> str | None:
    """No precompiled header while a cached graph of ours loads.

    Loading a cached CPU graph imports its module, whose C++ kernels are
    already built in the cache dir; inductor still runs the preprocessor over
    its kernel header and hashes the output first (0.2 s a process here), to
    name a precompiled header that only a compile would use.  The kernels'
    paths do not depend on it (inductor computes them before it).  So a load
    goes without one; a kernel missing from disk then compiles without a
    precompiled header: the same binary, more slowly.
    """
    if STATE.loading_compiled.get():
        return None
    return call(header, hashable_cmd_line, **compile_command)


def _add_backend_id(call: Any, self: Any, backend_id: str, *args: Any, **kwargs: Any) -> None:
    """A graph compiled for one of our packages: its backend id marks it ours wherever it
    compiles more (a backward on first use, a specialization at call time)."""
    if self in STATE.ours:
        STATE.backend_ids.add(backend_id)
    return call(self, backend_id, *args, **kwargs)


def _ours(backend_id: str | None) -> bool:
    return backend_id is not None and (STATE.frame.get() is not None or backend_id in STATE.backend_ids)


@contextlib.contextmanager
def _sanitized_for_key(call: Any, gm: Any) -> Iterator[None]:
    """A graph of ours keyed as it is without a package.  torch clears ``_backend_id`` while
    it computes the AOTAutograd key; set by a package compile it sits earlier in the
    graph module's ``__dict__`` than where clearing puts it, and the pickled dict, so
    the key, differs from a compile without a package (flag off, or a frame left out)."""
    backend_id = gm.__dict__.pop("_backend_id", None) if _ours(getattr(gm, "_backend_id", None)) else None
    try:
        with call(gm):
            yield
    finally:
        if backend_id is not None:
            gm._backend_id = backend_id


def _reduce_aot_config(call: Any, self: Any, aot_config: Any) -> Any:
    """AOTAutograd's cache key for our compiles, without the package's backend id.

    A package compile names its graph ``__compiled_fn_N_<uuid>``, new per
    compile, and torch puts that name in the AOTAutograd key, so every frame
    compiled under a package missed the AOTAutograd cache.  The name only labels
    the bundled artifact; on a hit torch records the artifact under the current
    compile's name, never the cached one.  So two keys that differ only there
    stand for the same compiled graph.  Other packages' keys are torch's."""
    if _ours(getattr(aot_config, "precompile_backend_id", None)):
        aot_config = dataclasses.replace(aot_config, precompile_backend_id=None)
    return call(self, aot_config)


def _bypass_package(call: Any, self: Any, reason: str = "", **kwargs: Any) -> None:
    """A compile left out of one of our packages: named in explain() rather than in torch's
    warning, and never an error (``strict_precompile`` is about the user's packages)."""
    frame = STATE.frame.get()
    if frame is None or self.package is None or self.package not in STATE.ours:
        return call(self, reason, **kwargs)
    messages.left_out(frame, reason)
    self.package.bypass_current_compile()
    self.package = None


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

    * the live tree's facts (``torch_guards.live_proof``): each leaf guard in
      words that mean the same in every process, identities included, and the
      facts Dynamo left unguarded.  A guard with no such words (no rule, an
      object with no identity) leaves the entry out, named;
    * the saved guards are loaded back here and must prove every fact and
      pass on the compiled call (``torch_guards.round_trip``), or the entry is
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

    saved = []
    for guard in sorted_guards:
        replacement = _replacement(guard)
        if replacement is not None:
            _keep_builtin(self, guard, output_graph)
            guard = dataclasses.replace(guard, create_fn=replacement, guard_types=None)
        saved.append(guard)
    try:
        proof = torch_guards.live_proof(self.guard_manager, builder, sorted_guards, output_graph,
                                      STATE.traced.get() or torch_guards.Traced())
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

    state = load_guards_state(saved_state)
    token = STATE.checking.set(True)
    try:
        loaded = load_guard_manager(state, code, output_graph.global_scope)
    finally:
        STATE.checking.reset(token)
    return torch_guards.round_trip(proof, loaded, state, output_graph)


def _pickle_guards_state(call: Any, state: Any, builder: Any) -> bytes:
    """The entry's proof goes into the saved guard state (``_serialize_guards``)."""
    proof = STATE.proof.get()
    if proof is not None:
        state.stableguards_proof = proof.to_state()
    return call(state, builder)


def _load_guard_manager(call: Any, guards_state: Any, target_code: Any, runtime_global_scope: Any) -> Any:
    """Build a saved entry's guards from the cold process's ambient state, not this one's,
    and keep its proof beside them for ``_serve_loaded``.

    Two guards read the process's state when they are built rather than the
    saved state they print: the default device and the saved-tensor hooks.  The
    cold process proved "the default device was D" and "no inlineable hooks were
    active"; built under the same state, the loaded guards check each call for
    that (a warm ``torch.compile`` inside a ``saved_tensors_hooks`` context would
    otherwise build "these hooks", by id).  Only our own entries are touched."""
    if STATE.installing.get() is None and not STATE.checking.get():
        return call(guards_state, target_code, runtime_global_scope)
    from stableguards.warm_start.proof import Proof

    with _cold_ambient_state(guards_state.output_graph.current_device):
        guard_manager = call(guards_state, target_code, runtime_global_scope)
    guard_manager.stableguards = LoadedProof(Proof.from_state(getattr(guards_state, "stableguards_proof", None)),
                                             guards_state, runtime_global_scope)
    return guard_manager


@contextlib.contextmanager
def _cold_ambient_state(device: Any) -> Iterator[None]:
    """The default device the cold compile saw, and no inlineable saved-tensor hooks (the only
    hooks an entry is saved under), while guards are built."""
    import torch
    import torch.utils._device as device_state
    from torch._functorch._aot_autograd import utils

    popped = []
    while utils.saved_tensors_hooks_are_inlineable(utils.top_saved_tensors_hooks()):
        popped.append(utils.top_saved_tensors_hooks())
        torch._C._autograd._pop_saved_tensors_default_hooks()
    prior, device_state.CURRENT_DEVICE = device_state.CURRENT_DEVICE, device
    try:
        yield
    finally:
        device_state.CURRENT_DEVICE = prior
        for pack, unpack in reversed(popped):
            torch._C._autograd._push_saved_tensors_default_hooks(pack, unpack)


def _record_constant(call: Any, tx: Any, fn: Any, name: str, args: Any, kwargs: Any) -> Any:
    """An ``assume_constant_result`` function called while tracing for a saved entry: its
    result is a fact of the entry (``warm_start.facts.CONSTANT_RESULT``)."""
    traced = STATE.traced.get()
    if traced is None:
        return call(tx, fn, name, args, kwargs)

    def recorded(*a: Any, **k: Any) -> Any:
        result = fn(*a, **k)
        traced.constants.append(torch_guards.ConstantCall(fn, a, k, result))
        return result

    return call(tx, recorded, name, args, kwargs)


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
    ``fn.__code__`` (``CLOSURE_BY_NAME``) can pass there.  Other objects, and
    code without such a path, are pickled as torch pickles them (by value, a
    fresh code object that no live function runs: that check never passes).
    Other packages' guards are pickled as torch pickles them."""
    import types

    if isinstance(obj, types.CodeType) and STATE.frame.get() is not None:
        path = code_path(obj)
        if path is not None:
            return code_at, path
    return call(self, obj)


def _keep_builtin(manager: Any, guard: Any, output_graph: Any) -> None:
    """A guard on ``__builtins_dict__['all']`` needs ``all`` in the saved builtins, which
    torch prunes to the names its own BUILTIN_MATCH guards recorded."""
    from torch._dynamo.source import DictGetItemSource, GlobalSource

    source = guard.originating_source
    if (isinstance(source, DictGetItemSource) and isinstance(source.index, str)
            and isinstance(source.base, GlobalSource)
            and source.base.global_name == output_graph.name_of_builtins_dict_key_in_fglobals):
        manager.used_builtin_vars.add(source.index)


def _replacement(guard: Any) -> Any:
    """The by-name builder method for an identity guard; whether the rebuilt check proves
    what this one did is checked on the trees (``_serialize_guards``), not assumed."""
    kind = guard.create_fn_name()
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
ID_BY_NAME = _same_check_as("ID_MATCH")
FUNCTION_BY_NAME = _same_check_as("FUNCTION_MATCH")
_REPLACEMENTS = {"MODULE_MATCH": MODULE_BY_NAME, "CLASS_MATCH": CLASS_BY_NAME, "CLOSURE_MATCH": CLOSURE_BY_NAME,
                 "FUNCTION_MATCH": FUNCTION_BY_NAME, "ID_MATCH": ID_BY_NAME}
_ID_CHECKS = {"MODULE_MATCH": ("ID_MATCH",), "CLASS_MATCH": ("ID_MATCH",), "FUNCTION_MATCH": ("ID_MATCH",)}


def _explain_miss(code: Any, key: Components) -> None:
    differences = changed_components(cache_subdir("warm_start"), key, code)
    if differences:
        messages.missed(frame_label(code), differences)


HOOKS = [
    Hook("torch._dynamo.eval_frame", "_optimize", "warm_start", _optimize, params=("backend", "package")),
    Hook("torch._dynamo.eval_frame", "_TorchDynamoContext.__call__", "warm_start", _context_call,
         params=("fn",)),
    Hook(_PACKAGE, "CompilePackage.uninstall", "warm_start", _uninstall),
    Hook("torch._C._dynamo.eval_frame", "_load_precompile_entry", "warm_start", _keep_loaded),
    Hook("torch._dynamo.convert_frame", "ConvertFrame.__call__", "warm_start", _serve_loaded, params=("frame",)),
    Hook("torch._dynamo", "reset_code_caches", "warm_start", _reset_code_caches),
    Hook("torch._dynamo.decorators", "_set_stance", "warm_start", _set_stance, params=("stance",)),
    Hook(_PACKAGE, "CompilePackage.bypass_current_compile", "warm_start", _bypass_current_compile),
    Hook("torch._dynamo.output_graph", "OutputGraph.bypass_package", "warm_start", _bypass_package,
         params=("reason",)),
    Hook("torch._dynamo.precompile_context", "PrecompileContext.record_artifact", "warm_start", _record_artifact,
         params=("artifact",)),
    # should_bundle_autograd_cache and graph_compile's by-name copy of it (lazy: they
    # import inductor).
    Hook(_AUTOGRAD_CACHE, "should_bundle_autograd_cache", "warm_start", _bundle_autograd_entries, lazy=True),
    Hook("torch._functorch._aot_autograd.graph_compile", "should_bundle_autograd_cache", "warm_start",
         _bundle_autograd_entries, lazy=True),
    Hook("torch._functorch._aot_autograd.runtime_wrappers", "_AutogradBackwardCompiler.get_or_compile",
         "warm_start", _compile_backward, lazy=True),
    Hook("torch._functorch._aot_autograd.graph_compile", "_should_save_cache", "warm_start", _save_aot_entry,
         lazy=True),
    Hook("torch._functorch._aot_autograd.aot_autograd_result", "BundledOutputCodeLoadable.load", "warm_start",
         _count_bundled_hit, params=("example_inputs",), lazy=True),
    Hook(_AUTOGRAD_CACHE, "AOTAutogradCachePickler._reduce_aot_config", "warm_start", _reduce_aot_config,
         params=("aot_config",), lazy=True),
    Hook(_AUTOGRAD_CACHE, "sanitize_gm_for_cache", "warm_start", _sanitized_for_key, params=("gm",), lazy=True),
    Hook(_PACKAGE, "CompilePackage.add_backend_id", "warm_start", _add_backend_id, params=("backend_id",)),
    Hook("torch._inductor.output_code", "CompiledFxGraph.after_deserialization", "warm_start",
         _load_compiled_graph, params=("constants",), lazy=True),
    Hook("torch._inductor.codecache", "_precompile_header", "warm_start", _precompile_header,
         params=("header", "hashable_cmd_line"), lazy=True),
    Hook("torch._dynamo.guards", "CheckFunctionManager.serialize_guards", "warm_start", _serialize_guards,
         params=("builder", "sorted_guards", "output_graph")),
    Hook("torch._dynamo.guards", "GuardsStatePickler.reducer_override", "warm_start", _reduce_code,
         params=("obj",)),
    Hook("torch._dynamo.guards", "pickle_guards_state", "warm_start", _pickle_guards_state,
         params=("state", "builder")),
    Hook(_PACKAGE, "load_guard_manager", "warm_start", _load_guard_manager,
         params=("guards_state", "target_code", "runtime_global_scope")),
    # assume_constant_result calls (builtin.py imports it from here when called).  nn_module's
    # by-name copy runs only for a specialized module, whose NN_MODULE guard is never saved.
    Hook("torch._dynamo.variables.functions", "invoke_and_store_as_constant", "warm_start", _record_constant,
         params=("tx", "fn", "name", "args", "kwargs")),
    Hook("torch._dynamo.symbolic_convert", "InliningInstructionTranslator.__init__", "warm_start", _record_inlined,
         params=("parent", "code", "symbolic_locals", "funcvar")),
]
