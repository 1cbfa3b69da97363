"""The one module that touches torch's private internals.

It registers the ``torch._dynamo.config.stable_guards`` flag, installs and
uninstalls every hook, and refuses to hook a torch it was not written for.
Every hook reads the flag on each call, so flipping it takes effect at the next
compile, and every hook fails open: an error inside stableguards logs one
warning, is counted by the manager, and the call goes to torch's own code.

Nothing here imports ``torch._dynamo`` eagerly.  ``arm()`` runs at the end of
``import torch`` (through the ``torch.backends`` entry point) and on
``import stableguards``; it waits for ``torch._dynamo`` to be imported, so a
program that never compiles pays only for this module's import.
"""

from __future__ import annotations

import contextvars
import importlib.abc
import importlib.util
import inspect
import logging
import os
import sys
import weakref
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

from stableguards.backend_match import BackendFingerprint, BackendKey, fingerprint, key_for
from stableguards.key_diff import KeyLedger, KeyRecord, differences, nearest
from stableguards.manager import GuardManager
from stableguards.pgo.identity import closure_fingerprint, default_profile_key
from stableguards.pgo.profile import DYNAMIC, UNSET, CodeKey, Dim, Dims, Profile, SourceEntry
from stableguards.pgo.profile import State, specialized, static
from stableguards.pgo.session import handed_on
from stableguards.pgo.store import LocalStore, ProfileStore, RedisStore

log = logging.getLogger("stableguards")

FLAG = "stable_guards"
ENV_VAR = "TORCHDYNAMO_STABLE_GUARDS"
REDIS_ENV_VAR = "STABLEGUARDS_PGO_REDIS_URL"
SUPPORTED_TORCH = ("2.13.",)

# STABLEGUARDS_DISABLE=symbols,pgo leaves those parts to torch while the flag is on:
# for A/B measurements, and for bisecting a part that misbehaves.
PARTS = ("symbols", "pgo", "backend", "keys")
LOG_ARTIFACT = "stableguards"
MANAGER = GuardManager(disabled=os.environ.get("STABLEGUARDS_DISABLE", ""))

# (owner, attribute) -> the original, for every hook in place.
_originals: dict[tuple[Any, str], Any] = {}
_warned: set[str] = set()


def arm() -> None:
    """Register the flag and hooks as soon as ``torch._dynamo`` exists.

    Called at the end of ``import torch``, where an exception would abort the
    import, so it never raises.
    """
    try:
        _register_log_artifact()
        dynamo = sys.modules.get("torch._dynamo")
        if dynamo is not None and hasattr(dynamo, "config"):
            install()
        elif not any(isinstance(f, _AfterImport) for f in sys.meta_path):
            sys.meta_path.insert(0, _AfterImport("torch._dynamo", lambda _: install()))
    except Exception as error:  # noqa: BLE001 - must not break `import torch`
        _warn_once("arm", f"stableguards could not arm its hooks ({error!r}); it is inactive")


def install() -> None:
    """Register the flag and put every hook in place (idempotent)."""
    import torch
    import torch._dynamo.config as dynamo_config

    _register_flag(dynamo_config)
    if unknown := MANAGER.disabled - set(PARTS):
        _warn_once("parts", f"STABLEGUARDS_DISABLE names {', '.join(sorted(unknown))}, which "
                            f"stableguards does not have; its parts are {', '.join(PARTS)}")
    if not torch.__version__.startswith(SUPPORTED_TORCH):
        _warn_once(
            "version",
            f"stableguards supports torch {', '.join(v + 'x' for v in SUPPORTED_TORCH)}, "
            f"not {torch.__version__}: torch._dynamo.config.{FLAG} is accepted but does nothing",
        )
        return
    import torch._dynamo.convert_frame as convert_frame
    import torch._dynamo.pgo as pgo
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    _hook(ShapeEnv, "_generate_unique_id", _stable_unique_id)
    _hook(ShapeEnv, "_set_replacement", _replacement_reasons)
    _hook(pgo.CodeId, "make", _stable_code_id)
    _hook(pgo, "get_code_state", _profile_reader)
    # convert_frame imported put_code_state by name: its copy is the one called.
    _hook(convert_frame, "put_code_state", _profile_writer)
    _hook(convert_frame.DynamoOutput, "build_guards", _outcome_recorder)
    import torch._dynamo.eval_frame as eval_frame

    # BACKEND_MATCH.  convert_frame imported its helpers by name: patch its copies.
    _hook(eval_frame, "get_compiler_fn", _per_backend_compiler_fn)
    _hook(convert_frame.ConvertFrameAssert, "__call__", _backend_of_compile)
    _hook(convert_frame, "compute_cache_size", _per_backend_cache_size)
    _hook(convert_frame, "get_and_maybe_log_recompilation_reasons", _recompile_reasons)
    import torch._inductor.codecache as codecache

    # FxGraphCache.prepare_key calls compiled_fx_graph_hash by its module-global name.
    _hook(codecache, "compiled_fx_graph_hash", _fx_key_explainer)
    _attach_log_artifact()


def uninstall() -> None:
    """Put every original back; the flag stays registered so user code keeps working."""
    for (owner, name), original in _originals.items():
        setattr(owner, name, original)
    _originals.clear()


def enabled(part: str) -> bool:
    """Whether the flag is on for this thread (config overrides are per thread) and
    ``part`` is not listed in STABLEGUARDS_DISABLE."""
    import torch._dynamo.config as dynamo_config

    return bool(getattr(dynamo_config, FLAG, False)) and part not in MANAGER.disabled


def _register_flag(dynamo_config: ModuleType) -> None:
    from torch.utils._config_module import _Config, _ConfigEntry

    if FLAG in dynamo_config._config:
        return
    entry = _ConfigEntry(_Config(default=False, env_name_default=ENV_VAR), FLAG)
    dynamo_config._config[FLAG] = entry
    # The module caches its hash and dict per context; both must see the new key.
    dynamo_config._hash_dirty_var.set(True)
    dynamo_config._get_dict_dirty_keys_var.set(None)


def _hook(owner: Any, name: str, make: Callable[[Any], Any]) -> None:
    if (owner, name) in _originals:
        return
    # The raw attribute, so a staticmethod is put back as a staticmethod.
    raw = inspect.getattr_static(owner, name)
    _originals[(owner, name)] = raw
    hooked = make(getattr(owner, name))
    setattr(owner, name, staticmethod(hooked) if isinstance(raw, staticmethod) else hooked)


def _fell_back(hook: str, error: BaseException) -> None:
    MANAGER.record_fallback(hook, error)
    _warn_once(hook, f"stableguards hook {hook!r} failed ({error!r}); using torch's own behaviour")


def _warn_once(key: str, message: str) -> None:
    if key not in _warned:
        _warned.add(key)
        log.warning(message)


def _stable_unique_id(original: Callable[[Any, str], int]) -> Callable[[Any, str], int]:
    def _generate_unique_id(shape_env: Any, source_name: str) -> int:
        if enabled("symbols"):
            try:
                return MANAGER.symbol_id(shape_env, source_name, shape_env.unique_ids)
            except Exception as error:  # noqa: BLE001 - fail open
                _fell_back("symbol ids", error)
        return original(shape_env, source_name)

    return _generate_unique_id


class _AfterImport(importlib.abc.MetaPathFinder):
    """Run a callback right after a module finishes importing, then step aside."""

    def __init__(self, module_name: str, callback: Callable[[ModuleType], None]) -> None:
        self.module_name = module_name
        self.callback = callback

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname != self.module_name:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(fullname)
        if spec is None or spec.loader is None:
            return spec
        exec_module = spec.loader.exec_module
        callback = self.callback

        def exec_then_callback(module: ModuleType) -> None:
            exec_module(module)
            try:
                callback(module)
            except Exception as error:  # noqa: BLE001 - never break the user's import
                _warn_once("install", f"stableguards could not install ({error!r}); it is inactive")

        spec.loader.exec_module = exec_then_callback  # type: ignore[method-assign]
        return spec


# --- PGO: specialization-aware profiles ----------------------------------------


def _stable_code_id(original: Callable[..., Any]) -> Callable[..., Any]:
    """torch's CodeId with a closure fingerprint that is the same in every process."""

    def make(code: Any, closure: Any = None) -> Any:
        if enabled("pgo") and closure:
            try:
                fingerprint = closure_fingerprint(closure)
            except Exception as error:  # noqa: BLE001 - fail open
                _fell_back("pgo code identity", error)
            else:
                import torch._dynamo.pgo as pgo

                return pgo.CodeId(code.co_filename, code.co_firstlineno, code.co_name,
                                  pgo._hash_containing_file(code.co_filename), fingerprint)
        return original(code, closure)

    return make


def _profile_reader(original: Callable[[], Any]) -> Callable[[], Any]:
    def get_code_state() -> Any:
        import torch._dynamo.pgo as pgo

        if pgo._CODE_STATE is not None or not enabled("pgo"):
            return original()
        try:
            state = _load_code_state()
        except Exception as error:  # noqa: BLE001 - fail open
            _fell_back("pgo read", error)
            return original()
        pgo._CODE_STATE = state
        return state

    return get_code_state


def _profile_writer(original: Callable[[], None]) -> Callable[[], None]:
    def put_code_state() -> None:
        # No session: the profile was read by torch (flag off then, or our read
        # failed), so torch writes it too.
        if not enabled("pgo") or MANAGER.profile is None:
            return original()
        try:
            _save_code_state()
        except Exception as error:  # noqa: BLE001 - fail open
            _fell_back("pgo write", error)
            original()

    return put_code_state


def _outcome_recorder(original: Callable[..., Any]) -> Callable[..., Any]:
    """After a frame compiled, note which dynamic dimensions stayed dynamic."""

    def build_guards(self: Any, code: Any, *args: Any, **kwargs: Any) -> Any:
        guards = original(self, code, *args, **kwargs)
        if enabled("pgo") and MANAGER.profile is not None:
            try:
                _record_outcomes(code, self.tracer_output)
            except Exception as error:  # noqa: BLE001 - fail open
                _fell_back("pgo compile outcomes", error)
        return guards

    return build_guards


def _replacement_reasons(original: Callable[..., None]) -> Callable[..., None]:
    """Keep why a symbol was replaced: the ShapeEnv only logs it."""

    def _set_replacement(shape_env: Any, a: Any, tgt: Any, msg: str) -> None:
        before = shape_env._replacements_version_counter
        original(shape_env, a, tgt, msg)
        if shape_env._replacements_version_counter != before and enabled("pgo"):
            try:
                MANAGER.note_replacement(shape_env, str(a), msg)
            except Exception as error:  # noqa: BLE001 - fail open
                _fell_back("pgo specialization reasons", error)

    return _set_replacement


def profile_key() -> str | None:
    """The key this process's profile is stored under, or None when caches are off.

    TORCH_COMPILE_JOB_ID (torch.compiler.config.job_id) wins; without it the
    key names the entry point (see stableguards.pgo.identity).  The rank and
    torch.compiler.config.cache_key_tag are always part of it, as upstream.
    """
    import torch
    import torch._inductor.config as inductor_config

    if inductor_config.force_disable_caches:
        return None
    job_id = torch.compiler.config.job_id or default_profile_key()
    tag = torch.compiler.config.cache_key_tag
    return f"{job_id}:rank{_rank()}" + (f":{tag}" if tag else "")


def profile_store() -> ProfileStore | None:
    """Redis if STABLEGUARDS_PGO_REDIS_URL is set, else a directory in the inductor cache dir."""
    url = os.environ.get(REDIS_ENV_VAR)
    if url:
        try:
            return RedisStore(url)
        except ImportError:
            _warn_once("redis", f"{REDIS_ENV_VAR} is set but the redis package is not installed "
                                "(pip install 'stableguards[redis]'); compiling without a profile")
            return None
    return LocalStore(cache_subdir("pgo"))


def cache_subdir(name: str) -> Path:
    """``<inductor cache dir>/stableguards/<name>``: where stableguards keeps its files."""
    from torch._inductor.runtime.cache_dir_utils import cache_dir

    return Path(cache_dir()) / "stableguards" / name


def _rank() -> int:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank()
    return int(os.environ.get("RANK", "0"))


def _load_code_state() -> Any:
    import torch._dynamo.pgo as pgo

    state: Any = defaultdict(pgo.CodeState)
    key, store = profile_key(), profile_store()
    if key is None or store is None:
        MANAGER.profile = None
        return state
    profile = MANAGER.open_profile(store, key)
    stale = 0
    for code, sources in profile.frames.items():
        if code.filename and pgo._hash_containing_file(code.filename) != code.file_hash:
            stale += 1  # edited or gone: it can never match, but it is kept for the store
        code_state = state[pgo.CodeId(code.filename, code.firstlineno, code.name,
                                      code.file_hash, code.closure)]
        for name, entry in sources.items():
            code_state.automatic_dynamic[name] = _to_frame_state(entry)
    if stale:
        _warn_once("stale", f"the PGO profile {store.describe(key)} names {stale} frame(s) whose "
                            "source file changed or is gone; they are ignored (and kept; "
                            "`python -m stableguards pgo clear` removes the profile)")
    return state


def _save_code_state() -> None:
    import torch._dynamo.pgo as pgo

    if pgo._CODE_STATE is None:
        return
    observed = Profile({
        _code_key(code_id): {name: _from_frame_state(e) for name, e in cs.automatic_dynamic.items()}
        for code_id, cs in pgo._CODE_STATE.items()
    })
    MANAGER.save_profile(observed)


def _record_outcomes(code: Any, tracer_output: Any) -> None:
    import torch
    import torch._dynamo.pgo as pgo

    output_graph = tracer_output.output_graph
    if output_graph is None or MANAGER.profile is None:
        return
    shape_env = output_graph.shape_env
    code_key = _code_key(pgo.CodeId.make(code, tracer_output.closure))

    def outcome(sym: Any) -> Dim:
        expr = sym.node._expr  # the symbol as created; .expr has replacements applied
        if not shape_env.replace(expr).is_number:
            return DYNAMIC
        return specialized(*MANAGER.replacement_reasons(shape_env, str(expr)))

    for tracked in output_graph.tracked_fakes or ():
        name, fake = tracked.source.name, tracked.fake
        if isinstance(fake, torch.Tensor):
            for i, size in enumerate(fake.size()):
                if isinstance(size, torch.SymInt):
                    MANAGER.profile.record_outcome(code_key, name, ("size", i), outcome(size))
        elif isinstance(fake, (torch.SymInt, torch.SymFloat)):
            MANAGER.profile.record_outcome(code_key, name, ("scalar",), outcome(fake))


def _code_key(code_id: Any) -> CodeKey:
    closure = code_id.closure_hash
    return CodeKey(code_id.file_hash, code_id.firstlineno, code_id.name,
                   None if closure is None else str(closure), code_id.filename)


def _from_frame_state(entry: Any) -> SourceEntry:
    return SourceEntry(_from_atom(entry.scalar), _from_dims(entry.size), _from_dims(entry.stride))


def _from_dims(dims: Any) -> Dims:
    return tuple(_from_atom(d) for d in dims) if isinstance(dims, tuple) else _from_atom(dims)


def _from_atom(atom: Any) -> Dim:
    import torch._dynamo.pgo as pgo

    if atom is pgo.auto_dynamic:
        return DYNAMIC
    if atom is pgo.auto_unset:
        return UNSET
    if isinstance(atom, pgo.InferStride):
        return static(f"S({atom.dim})")
    return static(atom)


def _to_frame_state(entry: SourceEntry) -> Any:
    import torch._dynamo.pgo as pgo

    return pgo.FrameStateSizeEntry(
        scalar=_to_atom(entry.scalar), size=_to_dims(entry.size), stride=_to_dims(entry.stride)
    )


def _to_dims(dims: Dims) -> Any:
    return tuple(_to_atom(d) for d in dims) if isinstance(dims, tuple) else _to_atom(dims)


def _to_atom(dim: Dim) -> Any:
    import torch._dynamo.pgo as pgo

    dim = handed_on(dim)
    if dim.state == State.DYNAMIC:
        return pgo.auto_dynamic
    if dim.state == State.UNSET:
        return pgo.auto_unset
    if isinstance(dim.value, str):  # S(d): an inferred stride
        return pgo.InferStride(int(dim.value[2:-1]))
    return dim.value


# --- BACKEND_MATCH: a per-backend cache ----------------------------------------
#
# torch.compile hands Dynamo a backend; get_compiler_fn wraps it for calling.
# We put a _KeyedBackend in between whose ``_torchdynamo_orig_backend`` is the
# interned key of the backend's fingerprint.  The C++ cache lookup follows that
# attribute chain to its end, so cache entries store and compare the key: a
# pointer comparison for equal configurations, never a match for different
# ones, and no strong reference to the backend itself.


class _DynamoBackendKey(BackendKey):
    """A BackendKey as Dynamo expects the end of the backend chain to look.

    ``compiler_name`` is the backend's own (``"eager"``, ``"inductor"``), as on
    torch's wrappers: Dynamo reads it to decide whether the backend is a
    registered one (convert_frame.clear_compile_context_weakrefs).
    """

    __slots__ = ("compiler_name",)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        # Never called: Dynamo calls _KeyedBackend.  It only needs to be callable.
        raise RuntimeError("a stableguards backend key is not a compiler")

    def reset(self) -> None:
        """torch._dynamo.reset() resets cached backends; the backends themselves reset elsewhere."""


class _KeyedBackend:
    """The user's backend, as Dynamo calls it, with its key where Dynamo looks for identity."""

    def __init__(self, backend: Any, key: _DynamoBackendKey) -> None:
        self._backend = backend
        self._torchdynamo_orig_backend = key
        self.compiler_name = getattr(backend, "compiler_name", None) or key.compiler_name
        # WrapBackendDebug copies this object's __dict__, so these must be instance attributes.
        for name in ("backend_ctx_ctor", "get_compiler_config"):
            if hasattr(backend, name):
                setattr(self, name, getattr(backend, name))

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._backend(*args, **kwargs)

    def reset(self) -> None:
        reset = getattr(self._backend, "reset", None)
        if callable(reset):
            reset()


_current_key: contextvars.ContextVar[BackendKey | None] = contextvars.ContextVar(
    "stableguards_backend_key", default=None)
# Fingerprints of user backend objects, computed once: some backends (aot_autograd)
# rewrite their own options on first use, and must keep the identity they had.
_user_fingerprints: weakref.WeakKeyDictionary[Any, BackendFingerprint] = weakref.WeakKeyDictionary()


def _per_backend_compiler_fn(original: Callable[[Any], Any]) -> Callable[[Any], Any]:
    def get_compiler_fn(compiler_fn: Any) -> Any:
        if _pending_release:
            _release_pending()
        if enabled("backend") and not isinstance(compiler_fn, _KeyedBackend):
            try:
                keyed = _keyed(compiler_fn)
            except Exception as error:  # noqa: BLE001 - fail open
                _fell_back("backend match", error)
            else:
                return original(keyed)
        return original(compiler_fn)

    return get_compiler_fn


def _keyed(compiler_fn: Any) -> _KeyedBackend:
    from torch._dynamo.backends.registry import lookup_backend

    backend = lookup_backend(compiler_fn) if isinstance(compiler_fn, str) else compiler_fn
    user = _user_backend(backend)
    fp = backend_fingerprint(backend)
    key = key_for(fp, _DynamoBackendKey)
    if not hasattr(key, "compiler_name"):  # equal fingerprints, equal names: set once
        key.compiler_name = (getattr(backend, "compiler_name", None)
                             or _registered_name(backend) or fp.description)
    key.watch(user, _release_entries)
    return _KeyedBackend(backend, key)  # type: ignore[arg-type]


def backend_fingerprint(backend: Any) -> BackendFingerprint:
    """The fingerprint of a backend as torch.compile or torch._dynamo.optimize received it."""
    user = _user_backend(backend)
    if user is None or user is backend:
        return _fingerprint_user(backend) if user is not None else fingerprint(backend, _registered_name)
    inner = _fingerprint_user(user)
    if not inner.stable:
        return inner

    def name_of(obj: Any) -> str | None:
        return f"backend {inner.description} #{inner.digest}" if obj is user else _registered_name(obj)

    return fingerprint(backend, name_of)


def _fingerprint_user(user: Any) -> BackendFingerprint:
    try:
        return _user_fingerprints[user]
    except (KeyError, TypeError):
        pass
    fp = fingerprint(user, _registered_name)
    try:
        _user_fingerprints[user] = fp
    except TypeError:
        pass  # not weakly referenceable: fingerprinted afresh each time
    return fp


def _user_backend(backend: Any) -> Any:
    """The object whose life decides how long compiled code is kept, or None for good.

    torch.compile wraps what the user passed (a name, a callable) in a wrapper
    made per call; the user's own object is its ``compiler_fn``.  Registered
    backends and inductor live as long as the process.
    """
    inner = getattr(backend, "compiler_fn", backend)
    if getattr(backend, "compiler_name", None) == "inductor" and not hasattr(backend, "compiler_fn"):
        return None
    return None if _registered_name(inner) is not None else inner


def _registered_name(obj: Any) -> str | None:
    from torch._dynamo.backends import registry

    for name, fn in registry._COMPILER_FNS.items():
        if fn is obj:
            return name
    return None


# Keys whose last backend died, waiting for a safe moment to release their entries.
_pending_release: list[BackendKey] = []


def _release_entries(key: BackendKey) -> None:
    """A key's last backend died: release its cache entries, now if that is safe.

    This runs from a finalizer, which can fire inside torch's own cache work
    (torch._dynamo.reset() dropping the last reference, say), where walking the
    cache entries would touch freed memory.  Dynamo holds compile_lock during
    compiles and resets; inside it, the release waits for the next safe point
    (a torch.compile call, or the start of a frame compile).
    """
    import torch._dynamo.convert_frame as convert_frame

    _pending_release.append(key)
    if not convert_frame.compile_lock._is_owned():
        _release_pending()


def _release_pending() -> None:
    """Invalidate the cache entries of every pending key: their compiled code can go."""
    try:
        import torch._C._dynamo.eval_frame as c_eval_frame
        import torch._dynamo.convert_frame as convert_frame
        from torch._dynamo.guards import DeletedGuardManagerWrapper

        while _pending_release:
            key = _pending_release.pop()
            if key.alive:  # an equal backend came along meanwhile: its code is still wanted
                continue
            released = 0
            for ref in list(convert_frame.input_codes.seen):
                code = ref()
                if code is None:
                    continue
                for entry in c_eval_frame._debug_get_cache_entry_list(code):
                    manager = entry.guard_manager
                    if entry.backend is key and getattr(manager, "extra_state", None) is not None:
                        manager.extra_state.invalidate(
                            manager.cache_entry, DeletedGuardManagerWrapper("backend was collected"))
                        released += 1
            MANAGER.note_backend_released(str(key.fingerprint), released)
    except Exception as error:  # noqa: BLE001 - may run from a finalizer: never raise
        _fell_back("backend release", error)


def _backend_of_compile(original: Callable[..., Any]) -> Callable[..., Any]:
    """Know which backend a compile is for, and say when a frame switched backends."""

    def __call__(self: Any, frame: Any, cache_entry: Any, *args: Any, **kwargs: Any) -> Any:
        if _pending_release:
            _release_pending()
        key = _innermost_key(self) if enabled("backend") else None
        if key is not None:
            try:
                _note_switch(frame.f_code, key)
            except Exception as error:  # noqa: BLE001 - fail open
                _fell_back("backend switch", error)
        token = _current_key.set(key)
        try:
            return original(self, frame, cache_entry, *args, **kwargs)
        finally:
            _current_key.reset(token)

    return __call__


def _innermost_key(convert: Any) -> BackendKey | None:
    backend = convert
    for _ in range(16):  # the chain is short; a loop here would be a bug elsewhere
        if isinstance(backend, BackendKey):
            return backend
        backend = getattr(backend, "_torchdynamo_orig_backend", None)
        if backend is None:
            return None
    return None


def _note_switch(code: Any, key: BackendKey) -> None:
    import torch._C._dynamo.eval_frame as c_eval_frame

    others = {e.backend for e in c_eval_frame._debug_get_cache_entry_list(code)
              if e.code is not None and e.backend is not None}
    if others and key not in others:
        MANAGER.note_backend_switch(
            f"{code.co_name} ({code.co_filename}:{code.co_firstlineno})", str(key.fingerprint),
            [str(o.fingerprint) if isinstance(o, BackendKey) else type(o).__name__ for o in others])


def _per_backend_cache_size(original: Callable[..., Any]) -> Callable[..., Any]:
    """The recompile limit counts the live entries of the backend being compiled for."""

    def compute_cache_size(frame: Any, cache_entries: Any, *args: Any) -> Any:
        key = _current_key.get()
        if key is not None:
            cache_entries = [e for e in cache_entries if e.backend is key and e.code is not None]
        return original(frame, cache_entries, *args)

    return compute_cache_size


def _recompile_reasons(original: Callable[..., Any]) -> Callable[..., Any]:
    def get_and_maybe_log_recompilation_reasons(cache_entry: Any, frame: Any, *args: Any,
                                                **kwargs: Any) -> Any:
        reasons = original(cache_entry, frame, *args, **kwargs)
        if reasons and enabled("backend"):
            code = frame.f_code
            MANAGER.note_recompile(f"{code.co_name} ({code.co_filename}:{code.co_firstlineno})",
                                   [str(r) for r in reasons])
        return reasons

    return get_and_maybe_log_recompilation_reasons


def _register_log_artifact() -> None:
    """TORCH_LOGS=stableguards: torch parses TORCH_LOGS right after loading entry points."""
    from torch._logging._internal import log_registry, register_artifact

    if not log_registry.is_artifact(LOG_ARTIFACT):
        register_artifact(LOG_ARTIFACT, "stableguards: why restarts missed and frames recompiled",
                          off_by_default=True)


def _attach_log_artifact() -> None:
    import torch._logging

    logger = torch._logging.getArtifactLogger("torch._dynamo.stableguards", LOG_ARTIFACT)
    if not MANAGER.listeners:
        MANAGER.listeners.append(logger.debug)


# --- Why did the FX-graph cache miss? ---------------------------------------------


def _fx_key_explainer(original: Callable[..., Any]) -> Callable[..., Any]:
    def compiled_fx_graph_hash(*args: Any, **kwargs: Any) -> Any:
        key, debug_lines = original(*args, **kwargs)
        if enabled("keys"):
            try:
                _explain_fx_key(key, debug_lines)
            except Exception as error:  # noqa: BLE001 - fail open
                _fell_back("cache key explanation", error)
        return key, debug_lines

    return compiled_fx_graph_hash


def _explain_fx_key(key: str, debug_lines: list[str]) -> None:
    """On a local miss, diff the key against the closest one recorded; then record it."""
    from torch._inductor.codecache import FxGraphCache

    ledger = KeyLedger(cache_subdir("fxkeys"))
    record = KeyRecord.from_debug_lines(key, debug_lines)
    if not os.path.exists(FxGraphCache._get_tmp_dir_for_key(key)):
        closest = nearest(record, ledger.recent())
        MANAGER.note_cache_miss(key, closest.key if closest else None,
                                differences(record, closest) if closest else [])
    ledger.record(record)
