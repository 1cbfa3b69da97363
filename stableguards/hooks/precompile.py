"""Warm start: save each compiled frame's entry, install it in a restarted process.

torch's ``caching_precompile`` machinery (``torch._dynamo.package``) does the
saving and installing.  Alone it is unsafe; here, with the flag on:

* it runs for backends whose compiled code torch can serialize (inductor: the
  bundled AOTAutograd entry); other backends compile as usual;
* entries are saved when compiled, not only on ``save_cache_artifacts()``;
* the entry's key is ``stableguards.warm_start.entry_key``: module, file, code
  hash, receiver class, backend fingerprint, ``dynamic``, and the Dynamo,
  inductor and functorch configurations, not only qualname and first line;
* no guard is dropped.  torch drops identity guards (``ID_MATCH``,
  ``CLOSURE_MATCH``, ``DICT_VERSION`` and what derives from them) under
  ``caching_precompile``, in the live process too.  They are kept here: those
  on objects a restarted process finds by name are saved as checks by name
  (``_serialize_guards``); any other makes ``serialize_guards`` refuse the
  compile, which is left out of the entry (torch's per-compile bypass), so a
  warm process traces that frame again;
* a load or install that fails falls back to a normal compile, with one warning;
* a restarted process pays what a traced cache costs, no more: a loaded entry
  joins Dynamo's cache on its first call (``_keep_loaded``, ``_serve_loaded``),
  where the entry that passed moves to the front and only its own backend is
  served (torch's precompiled entries are tried first, in a fixed order, for
  any backend), and loading a cached graph skips inductor's precompiled-header
  step (``_precompile_header``).

Needs torch's per-compile bypass (``CompilePackage.bypass_current_compile``,
torch 2.15): with a per-function bypass one unsaveable compile drops the
function's whole entry, and 2.13's install breaks a later in-process recompile.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import uuid
import weakref
from pathlib import Path
from typing import Any

from stableguards.hooks.core import Hook, cache_subdir, registered_name
from stableguards.hooks.state import STATE
from stableguards.pgo.store import atomic_write
from stableguards.warm_start import EntryKey, code_at, code_path, entry_key

_PACKAGE = "torch._dynamo.package"
_AUTOGRAD_CACHE = "torch._functorch._aot_autograd.autograd_cache"
_WARM = STATE.warm  # this part's tables (hooks.state.WarmStartTables)


def _precompiling(on: bool) -> contextlib.AbstractContextManager[None]:
    import torch._dynamo.config as dynamo_config

    return dynamo_config.patch(caching_precompile=on)


def _serializable(backend: Any) -> bool:
    """Backends whose compiled graphs torch saves in a package: inductor's."""
    import torch

    wrapper = getattr(torch, "_TorchCompileInductorWrapper", None)
    return (isinstance(wrapper, type) and type(backend) is wrapper) or registered_name(backend) == "inductor" \
        or backend == "inductor"


def _optimize(call: Any, rebuild_ctx: Any, backend: Any = "inductor", *args: Any, **kwargs: Any) -> Any:
    """Give a compile for a serializable backend a package, as caching_precompile would."""
    if kwargs.get("package") is not None or kwargs.get("disable") or not _serializable(backend):
        return call(rebuild_ctx, backend, *args, **kwargs)
    from stableguards.hooks.backends import backend_fingerprint

    fingerprint = backend_fingerprint(backend)
    with _precompiling(True):
        ctx = call(rebuild_ctx, backend, *args, **kwargs)
    package = getattr(ctx, "_package", None)
    if package is not None and fingerprint.stable:
        _WARM.backends[package] = {"backend": f"{fingerprint.description} #{fingerprint.digest}",
                              "dynamic": kwargs.get("dynamic")}
    return ctx


def _context_call(call: Any, self: Any, fn: Any) -> Any:
    """torch.compile(fn): look the entry up under stableguards' key, then install it.

    Installed entries live on the code object and serve every compiled context
    that runs it, whatever its backend, so one code object gets entries from
    one key only: a second context for it with another key (another backend,
    options, receiver class) uninstalls them, and a context created after
    another one loads nothing.  Both then compile as usual.
    """
    package = getattr(self, "_package", None)
    if package is not None and package.is_initialized():
        return call(self, fn)
    target = _target(fn)
    code = getattr(getattr(target, "__func__", target), "__code__", None)
    key = _key_for(package, target, code) if package is not None else None
    if code is not None and not _claim(code, key.digest if key is not None else None):
        key = None
    if package is None:
        return call(self, fn)
    # Warm start is for a restarted process.  An entry this process saved itself
    # is not loaded back (after torch._dynamo.reset(), say): torch's own caches
    # serve that compile, as without the flag.
    loadable = key is not None and key.digest not in _WARM.saved_here
    # A package with no key of ours (a backend with an identity, code we cannot
    # hash, a shared code object) still needs torch's initialization; a fresh
    # random key finds nothing, and it is never saved.
    token = _WARM.loading.set(key.digest if loadable else f"unkeyed-{uuid.uuid4().hex}")
    not_used = _WARM.not_used.set(None)
    hits = _dynamo_cache_hits()
    try:
        with _precompiling(True):
            result = call(self, fn)
        reason = _WARM.not_used.get()
    finally:
        _WARM.loading.reset(token)
        _WARM.not_used.reset(not_used)
    if key is not None:
        package.__dict__["source_id"] = key.digest  # the cached_property saves use
        _WARM.keys[package] = key
        if reason is not None:
            STATE.manager.note_warm_start_not_used(_frame_name(code), reason)
        elif _dynamo_cache_hits() > hits:
            _WARM.installed[_WARM.by_code(code)] = (key.digest, weakref.ref(package))
            STATE.manager.note_warm_start_loaded(_frame_name(code))
        else:
            _explain_miss(code, key)
    return result


def _claim(code: Any, digest: str | None) -> bool:
    """Record a compiled context for ``code``; whether it may load and save entries."""
    mine = digest or "other"
    row = _WARM.by_code(code)
    installed = _WARM.installed.get(row)
    if installed is not None and installed[0] != mine:
        package = installed[1]()
        if package is not None:
            package.uninstall()
        del _WARM.installed[row]
        STATE.manager.note_warm_start_left_out(
            _frame_name(code), "its installed entry was removed: another compiled context (backend, options "
                               "or receiver class) runs the same code in this process")
    seen = _WARM.contexts.setdefault(row, set())
    others = seen - {mine}
    seen.add(mine)
    return digest is not None and not others


def _target(fn: Any) -> Any:
    """What torch.compile(fn) compiles and keys by: a module's forward, unwrapped."""
    import torch
    from torch._dynamo.eval_frame import innermost_fn

    return innermost_fn(fn.forward if isinstance(fn, torch.nn.Module) else fn)


def _key_for(package: Any, target: Any, code: Any) -> EntryKey | None:
    from torch._dynamo.package import CompilePackage

    backend = _WARM.backends.get(package)
    if backend is None or code is None:
        return None
    return entry_key(torch_key=CompilePackage.source_id_from_fn(target), fn=target,
                     backend=backend["backend"], options={"dynamic": backend["dynamic"]},
                     configs=_configs())


def _configs() -> dict[str, dict[str, Any]]:
    import torch._dynamo.config as dynamo_config
    import torch._functorch.config as functorch_config
    import torch._inductor.config as inductor_config

    from stableguards.hooks.core import FLAG

    dynamo = {k: v for k, v in dynamo_config.get_config_copy().items() if k not in (FLAG, "caching_precompile")}
    return {"dynamo": dynamo, "inductor": inductor_config.get_config_copy(),
            "functorch": functorch_config.get_config_copy()}


def _dynamo_cache_hits() -> int:
    from torch._dynamo.utils import counters

    return counters["dynamo_cache"]["dynamo_cache_hit"]


def _source_id_from_fn(call: Any, fn: Any) -> str:
    return _WARM.loading.get() or call(fn)


def _initialize(call: Any, self: Any, fn: Any, dynamo: Any = None, *args: Any, **kwargs: Any) -> None:
    """A saved entry that does not initialize (changed source, versions) leaves the package
    as it was, so torch's fallback can initialize it fresh."""
    if dynamo is None:
        return call(self, fn, dynamo, *args, **kwargs)
    try:
        return call(self, fn, dynamo, *args, **kwargs)
    except Exception as error:
        _forget(self)
        _WARM.not_used.set(f"{error}"[:200])
        raise RuntimeError(f"stableguards: saved entry not used: {error}") from error


def _install(call: Any, self: Any, backends: Any) -> None:
    """Install a package's entries newest first, and undo a failed install.

    The entries go to ``_keep_loaded``, which waits for a call to admit each to
    Dynamo's cache; where two would pass a call's guards, the first installed
    wins.  torch saves them in compile order; Dynamo's own cache tries the
    newest entry first (the dynamic one that automatic dynamic shapes led to),
    and so does this.  Each entry's guards decide alone whether it may run, so
    any order is sound.

    torch's fallback after a failed install initializes the package again,
    which it refuses once initialized ("already initialized"): undo the install
    and the initialization, and raise what torch's fallback catches."""
    saved_order = [(entry, entry.guarded_codes) for entry in self._codes.values()]
    for entry, guarded in saved_order:
        entry.guarded_codes = guarded[::-1]
    installing = _WARM.installing.set(self)
    try:
        return call(self, backends)
    except Exception as error:
        with contextlib.suppress(Exception):
            self.uninstall()
        _WARM.drop_loaded(self)
        _forget(self)
        _WARM.not_used.set(f"install failed: {error!r}"[:200])
        STATE.warn_once("warm start install", f"stableguards: a saved compiled entry could not be installed "
                                              f"({error!r}); compiling as usual")
        raise RuntimeError(f"stableguards: saved entry not installed: {error}") from error
    finally:
        _WARM.installing.reset(installing)
        for entry, guarded in saved_order:
            entry.guarded_codes = guarded  # saved again in compile order


@dataclasses.dataclass(frozen=True, eq=False)
class LoadedEntry:
    """A saved entry, loaded and waiting for its first call: its guards and code."""

    package: weakref.ref
    guard_manager: Any
    code: Any
    compile_id: Any


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
    package = _WARM.installing.get()
    if package is None or not _misses_compile():
        return call(code, guard_manager, dynamo_code)
    from torch._guards import CompileContext

    entry = LoadedEntry(weakref.ref(package), guard_manager, dynamo_code, CompileContext.current_compile_id())
    _WARM.loaded.setdefault(_WARM.by_code(code), []).append(entry)
    return None


def _serve_loaded(call: Any, self: Any, frame: Any, *args: Any, **kwargs: Any) -> Any:
    """A call no cache entry serves: the first loaded entry of this compiled context whose
    guards pass becomes the frame's cache entry, as a compile would make it.

    Sound as a compile's result is: the entry's guards are checked on this call
    (and on every later one, by Dynamo), and they are the cold compile's, none
    dropped (``_serialize_guards``).  Only the compiled context that loaded it
    (its package) is served, so another backend compiling the same code
    compiles its own.  Nothing is traced, and no frame is counted."""
    rows = _WARM.loaded.get(_WARM.by_code(frame.f_code)) if _WARM.loaded else None
    if rows:
        package = getattr(getattr(self, "_inner_convert", None), "_package", None)
        for entry in rows:
            if entry.package() is package and package is not None and entry.guard_manager.check(frame.f_locals):
                return _admit(frame.f_code, entry)
    return call(self, frame, *args, **kwargs)


def _admit(code: Any, entry: LoadedEntry) -> Any:
    """What a compile of ``code`` returns and records, for a loaded entry."""
    from torch._dynamo.convert_frame import orig_code_map, output_codes
    from torch._dynamo.types import GuardedCode, wrap_guarded_code

    rows = _WARM.loaded.get(_WARM.by_code(code), [])
    with contextlib.suppress(ValueError):  # another thread admitted it first: a duplicate entry, harmless
        rows.remove(entry)
    if not rows:
        _WARM.loaded.pop(_WARM.by_code(code), None)
    # A later recompile names the guard that failed under the original code; reset clears both.
    orig_code_map[entry.code] = code
    output_codes.add(entry.code)
    return wrap_guarded_code(GuardedCode(entry.code, entry.guard_manager, entry.compile_id, "warm start"))


def _uninstall(call: Any, self: Any) -> None:
    call(self)
    _WARM.drop_loaded(self)


def _reset_code_caches(call: Any) -> None:
    """torch._dynamo.reset() drops Dynamo's cache entries: the loaded ones waiting too."""
    call()
    _WARM.drop_loaded()


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
    if not _misses_compile() and _WARM.loaded:
        from torch._C._dynamo.eval_frame import _load_precompile_entry

        rows, _WARM.loaded = _WARM.loaded, {}
        for (_, code), entries in rows.items():
            for entry in entries:
                if entry.package() is not None:
                    _load_precompile_entry(code, entry.guard_manager, entry.code)
    return prior


def _forget(package: Any) -> None:
    package._initialized = False
    package._codes = {}
    package._resume_codes = set()
    package._cached_backends = {}
    package._device_types = frozenset()


def _convert_frame(call: Any, self: Any, frame: Any, *args: Any, **kwargs: Any) -> Any:
    """Compile under the package, then save its entry: every compile, not only on request."""
    package = getattr(self, "_package", None)
    if package is not None and not package.is_initialized():
        # torch.compile(fn) ran without initializing it (torch's caching_precompile
        # was off there, e.g. stableguards' own hook fell back): torch would fail
        # on it, so this compile goes without a package, as it would with the flag off.
        self._package = package = None
    key = _WARM.keys.get(package) if package is not None else None
    if key is None:
        return call(self, frame, *args, **kwargs)
    from torch._dynamo.exc import BackendCompilerFailed, PackageError

    token = _WARM.frame.set(_frame_name(frame.f_code))
    bundling = _WARM.bundling_for_us.set(not _user_bundles())
    try:
        with _precompiling(True):
            result = call(self, frame, *args, **kwargs)
    except (BackendCompilerFailed, PackageError) as error:
        # Compiling for a package bundles the AOTAutograd entry, which fails on
        # some graphs (torch 2.15: "expected OutputCode" for a graph inductor
        # hands back uncompiled).  This function goes on without a package.
        self._package = None
        STATE.manager.note_warm_start_left_out(_frame_name(frame.f_code), f"compiling it for a saved entry "
                                                                          f"failed ({error!r:.200}); compiled "
                                                                          f"as usual, and not saved")
        return call.fn(self, frame, *args, **kwargs)
    finally:
        _WARM.frame.reset(token)
        _WARM.bundling_for_us.reset(bundling)
    _save(package, key, _frame_name(frame.f_code))
    return result


def _save(package: Any, key: EntryKey, frame: str) -> None:
    from torch._dynamo.package import DynamoCache
    from torch.compiler._cache import CacheArtifactManager

    if not package.is_initialized() or not any(e.guarded_codes for e in package._codes.values()):
        return
    try:
        # Written to disk only: torch's mega-cache (save_cache_artifacts) records
        # what the user's settings make torch save, and these entries are ours.
        with CacheArtifactManager.with_fresh_cache():
            DynamoCache.save_cache_entry(package.cache_entry(), key.digest)
    except RuntimeError as error:
        if "not found in the given backends" in str(error):
            # A training graph's AOTAutograd entry exists once its backward has
            # compiled, on first use: saved then (_record_artifact).
            if package not in _WARM.pending:
                STATE.manager.note_warm_start_pending(frame)
            _WARM.pending[package] = (key, frame)
            return
        STATE.manager.note_warm_start_left_out(frame, f"not saved ({error})")
        return
    _WARM.pending.pop(package, None)
    STATE.manager.note_warm_start_saved()
    _WARM.saved_here.add(key.digest)
    _write_index(key)


def _record_artifact(call: Any, cls: Any, artifact: Any) -> None:
    """A graph's compiled artifact arrived (a backward, compiled on first use): save the
    packages that waited for one."""
    call(cls, artifact)
    for package, (key, frame) in list(_WARM.pending.items()):
        _save(package, key, frame)


def _bundle_autograd_entries(call: Any) -> bool:
    """While warm start is in use, AOTAutograd entries are bundled (self-contained), as
    torch bundles them under caching_precompile: a package saves its graphs from them.
    Asked when a backward compiles on first use too, after the frame's compile."""
    return bool(_WARM.keys) or call()


def _user_bundles() -> bool:
    """Whether torch would bundle AOTAutograd entries with the user's settings alone."""
    import torch._dynamo.config as dynamo_config
    import torch._functorch.config as functorch_config

    return bool(functorch_config.bundled_autograd_cache or dynamo_config.caching_precompile)


def _count_bundled_hit(call: Any, self: Any, example_inputs: Any) -> Any:
    """An inductor graph served from a bundled AOTAutograd entry counts as an FX-graph
    cache hit when only warm start bundles: unbundled, the same AOTAutograd hit
    reads the graph from the FX-graph cache and counts it there, and users read
    ``fxgraph_cache_hit`` to see how much of a compile a cache saved."""
    result = call(self, example_inputs)
    if _WARM.bundling_for_us.get():
        from torch._dynamo.utils import counters

        counters["inductor"]["fxgraph_cache_hit"] += 1
    return result


def _load_compiled_graph(call: Any, self: Any, constants: Any) -> Any:
    """Load a cached inductor graph without preparing to compile C++ (see _precompile_header)."""
    token = _WARM.loading_compiled.set(True)
    try:
        return call(self, constants)
    finally:
        _WARM.loading_compiled.reset(token)


def _precompile_header(call: Any, header: str, hashable_cmd_line: str, **compile_command: Any) -> str | None:
    """No precompiled header while a cached graph loads.

    Loading a cached CPU graph imports its module, whose C++ kernels are
    already built in the cache dir; inductor still runs the preprocessor over
    its kernel header and hashes the output first (0.2 s a process here), to
    name a precompiled header that only a compile would use.  The kernels'
    paths do not depend on it (inductor computes them before it).  So a load
    goes without one; a kernel missing from disk then compiles without a
    precompiled header: the same binary, more slowly.
    """
    if _WARM.loading_compiled.get():
        return None
    return call(header, hashable_cmd_line, **compile_command)


def _reduce_aot_config(call: Any, self: Any, aot_config: Any) -> Any:
    """AOTAutograd's cache key without the package's backend id.

    A package compile names its graph ``__compiled_fn_N_<uuid>``, new per
    compile, and torch puts that name in the AOTAutograd key, so every frame
    compiled under a package missed the AOTAutograd cache.  The name only labels
    the bundled artifact; on a hit torch records the artifact under the current
    compile's name, never the cached one.  So two keys that differ only there
    stand for the same compiled graph."""
    if getattr(aot_config, "precompile_backend_id", None) is not None:
        aot_config = dataclasses.replace(aot_config, precompile_backend_id=None)
    return call(self, aot_config)


def _bypass_package(call: Any, self: Any, reason: str = "", **kwargs: Any) -> None:
    """A compile torch leaves out of the package: name it in explain()."""
    frame = _WARM.frame.get()
    if frame is not None and getattr(self, "package", None) is not None:
        STATE.manager.note_warm_start_left_out(frame, reason)
    return call(self, reason, **kwargs)


def _check_function_manager(call: Any, self: Any, *args: Any, **kwargs: Any) -> None:
    """Build guards with torch's precompile filter off: it drops identity guards from the
    live entry.  Kept, they make serialize_guards refuse the compile (it is left
    out of the package), so the entry never proves less than before."""
    with _precompiling(False):
        return call(self, *args, **kwargs)


def _serialize_guards(call: Any, self: Any, builder: Any, sorted_guards: list, output_graph: Any) -> Any:
    """Save four kinds of identity guard as checks that hold across processes.

    torch refuses to save an id check (ids differ between processes), so every
    nn.Module call (``MODULE_MATCH`` on ``G['torch']`` or Dynamo's
    ``__import_*`` aliases) and every inlined function reached through a global
    (``CLOSURE_MATCH``) would leave the entry out.  The saved entry gets the
    same builder method under another name, which proves as much:

    * ``MODULE_BY_NAME`` for a module that is ``sys.modules[its name]``: torch
      saves the guarded scope with modules by name, so a restarted process
      rebuilds "this global *is* ``importlib.import_module(name)``", an
      identity check on the module of that name there, run on every call;
    * ``CLASS_BY_NAME`` for a class its module holds under its qualname
      (``isinstance(x, Config)``): pickle saves it by reference, so the check
      is identity with the class of that name in the restarted process;
    * ``ID_BY_NAME`` for a builtin function its module holds under its name
      (``all``, ``operator.index``): pickled by reference, so identity with the
      builtin of that name;
    * ``CLOSURE_BY_NAME`` for a function its module holds under its qualname:
      torch's check for a Python function is identity of its ``__code__``;
      the guard pickler saves such a function by reference, so a restarted
      process checks the live function's code against the code of the
      function of that name there.  A local function is saved by value, but
      its code by path (``_reduce_code``), so the check is identity with the
      code object every function from that ``def`` runs there.  Its closure
      cells and globals are guarded on their own.

    Code behind those names is the cold run's: torch checks its version and
    the source lines of every function the entry inlined before installing.
    The live entry keeps torch's own guards; every other identity guard still
    makes torch refuse the compile, so the entry is left out.
    """
    import dataclasses

    saved = []
    for guard in sorted_guards:
        replacement = _replacement(guard, builder)
        if replacement is not None:
            _keep_builtin(self, guard, output_graph)
            guard = dataclasses.replace(guard, create_fn=replacement, guard_types=None)
        saved.append(guard)
    return call(self, builder, saved, output_graph)


def _reduce_code(call: Any, self: Any, obj: Any) -> Any:
    """The guard pickler saves a local function's code object by its path from an
    importable function (``warm_start.code_path``), so a restarted process gets
    the code object its live functions share, and an identity check on
    ``fn.__code__`` (``CLOSURE_BY_NAME``) can pass there.  Other objects, and
    code without such a path, are pickled as torch pickles them (by value, a
    fresh code object that no live function runs: that check never passes)."""
    import types

    if isinstance(obj, types.CodeType):
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


def _replacement(guard: Any, builder: Any) -> Any:
    import sys
    import types

    kind = guard.create_fn_name()
    # An id check is what MODULE_MATCH and CLASS_MATCH run; CLOSURE_MATCH must not fall back to one.
    if kind not in _REPLACEMENTS or not set(guard.guard_types or ()) <= {kind, *_ID_CHECKS.get(kind, ())}:
        return None
    value = builder.get(guard)
    if kind == "MODULE_MATCH":
        sound = isinstance(value, types.ModuleType) and sys.modules.get(value.__name__) is value
    elif kind == "CLASS_MATCH":
        sound = isinstance(value, type) and _importable(value)
    elif kind == "ID_MATCH":  # on a builtin function (all, operator.index): pickled by name
        sound = isinstance(value, types.BuiltinFunctionType) and _importable(value)
    else:  # CLOSURE_MATCH on a plain function is a check of its code (else torch uses FUNCTION_MATCH)
        sound = type(value) is types.FunctionType and (_importable(value) or code_path(value.__code__) is not None)
    return _REPLACEMENTS[kind] if sound else None


def _importable(obj: Any) -> bool:
    """What its module holds under its qualname: what a restarted process finds by that name.

    A local function (a closure) is not: the saved scope carries its code by
    value, and the check (``__code__`` identity) could then never pass.
    """
    import functools
    import sys

    module = sys.modules.get(obj.__module__)
    try:
        return functools.reduce(getattr, obj.__qualname__.split("."), module) is obj
    except AttributeError:
        return False


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
_REPLACEMENTS = {"MODULE_MATCH": MODULE_BY_NAME, "CLASS_MATCH": CLASS_BY_NAME, "CLOSURE_MATCH": CLOSURE_BY_NAME,
                 "ID_MATCH": ID_BY_NAME}
_ID_CHECKS = {"MODULE_MATCH": ("ID_MATCH",), "CLASS_MATCH": ("ID_MATCH",)}


# --- explanations: which component of the key changed ---------------------------------

def _index_path(parts: dict[str, str]) -> Path:
    """One file per function (and receiver class, for code models share)."""
    name = hashlib.sha256(f"{parts['module']}:{parts['qualname']}:{parts['receiver']}".encode()).hexdigest()[:32]
    return cache_subdir("warm_start") / f"{name}.json"


def _write_index(key: EntryKey) -> None:
    """The last saved key per function, so a later miss can name what changed."""
    path = _index_path(dict(key.components))
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, json.dumps(key.as_json()).encode())


def _explain_miss(code: Any, key: EntryKey) -> None:
    path = _index_path(dict(key.components))
    try:
        saved = EntryKey.from_json(json.loads(path.read_text()))
    except (OSError, ValueError):
        return  # nothing saved for this function: a cold start, nothing to explain
    if saved.digest != key.digest:
        STATE.manager.note_warm_start_miss(_frame_name(code), key.differences(saved))


def _frame_name(code: Any) -> str:
    return f"{code.co_name} ({os.path.basename(code.co_filename)}:{code.co_firstlineno})"


HOOKS = [
    Hook("torch._dynamo.eval_frame", "_optimize", "precompile", _optimize, params=("backend", "package")),
    Hook("torch._dynamo.eval_frame", "_TorchDynamoContext.__call__", "precompile", _context_call,
         params=("fn",)),
    Hook(_PACKAGE, "CompilePackage.source_id_from_fn", "precompile", _source_id_from_fn, params=("fn",)),
    Hook(_PACKAGE, "CompilePackage.initialize", "precompile", _initialize, params=("fn", "dynamo")),
    Hook(_PACKAGE, "CompilePackage.install", "precompile", _install, params=("backends",)),
    Hook(_PACKAGE, "CompilePackage.uninstall", "precompile", _uninstall),
    Hook("torch._C._dynamo.eval_frame", "_load_precompile_entry", "precompile", _keep_loaded),
    Hook("torch._dynamo.convert_frame", "ConvertFrame.__call__", "precompile", _serve_loaded, params=("frame",)),
    Hook("torch._dynamo", "reset_code_caches", "precompile", _reset_code_caches),
    Hook("torch._dynamo.decorators", "_set_stance", "precompile", _set_stance, params=("stance",)),
    # Feature detection only: per-compile bypass (see the module docstring).
    Hook(_PACKAGE, "CompilePackage.bypass_current_compile", "precompile", lambda call, *a, **k: call(*a, **k)),
    Hook("torch._dynamo.convert_frame", "ConvertFrameAssert.__call__", "precompile", _convert_frame,
         params=("frame",)),
    Hook("torch._dynamo.output_graph", "OutputGraph.bypass_package", "precompile", _bypass_package,
         params=("reason",)),
    Hook("torch._dynamo.precompile_context", "PrecompileContext.record_artifact", "precompile", _record_artifact,
         params=("artifact",)),
    # should_bundle_autograd_cache and graph_compile's by-name copy of it (lazy: they
    # import inductor).
    Hook(_AUTOGRAD_CACHE, "should_bundle_autograd_cache", "precompile", _bundle_autograd_entries, lazy=True),
    Hook("torch._functorch._aot_autograd.graph_compile", "should_bundle_autograd_cache", "precompile",
         _bundle_autograd_entries, lazy=True),
    Hook("torch._functorch._aot_autograd.aot_autograd_result", "BundledOutputCodeLoadable.load", "precompile",
         _count_bundled_hit, params=("example_inputs",), lazy=True),
    Hook(_AUTOGRAD_CACHE, "AOTAutogradCachePickler._reduce_aot_config", "precompile", _reduce_aot_config,
         params=("aot_config",), lazy=True),
    Hook("torch._inductor.output_code", "CompiledFxGraph.after_deserialization", "precompile",
         _load_compiled_graph, params=("constants",), lazy=True),
    Hook("torch._inductor.codecache", "_precompile_header", "precompile", _precompile_header,
         params=("header", "hashable_cmd_line"), lazy=True),
    Hook("torch._dynamo.guards", "CheckFunctionManager.__init__", "precompile", _check_function_manager),
    Hook("torch._dynamo.guards", "CheckFunctionManager.serialize_guards", "precompile", _serialize_guards,
         params=("builder", "sorted_guards", "output_graph")),
    Hook("torch._dynamo.guards", "GuardsStatePickler.reducer_override", "precompile", _reduce_code,
         params=("obj",)),
]
