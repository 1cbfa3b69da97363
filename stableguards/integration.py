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

import collections
import contextvars
import functools
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

from stableguards.backend_match import BackendFingerprint, BackendKey, Fingerprinter, key_for
from stableguards.cudagraph_checks import StaticInputMoved, StaticInputWatch, copied_grads_message, input_names
from stableguards.key_diff import KeyLedger, KeyRecord, differences, nearest
from stableguards.manager import GuardManager
from stableguards.optimizer_guards import OptimizerLives
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
PARTS = ("symbols", "pgo", "backend", "keys", "optimizer", "cudagraphs")
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
        uninstall()
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
    _hook(convert_frame.DynamoOutput, "build_guards", _guard_builder)
    import torch._dynamo.eval_frame as eval_frame

    # BACKEND_MATCH.  convert_frame imported its helpers by name: patch its copies.
    _hook(eval_frame, "get_compiler_fn", _per_backend_compiler_fn)
    _hook(convert_frame.ConvertFrameAssert, "__call__", _backend_of_compile)
    _hook(convert_frame, "compute_cache_size", _per_backend_cache_size)
    _hook(convert_frame, "get_and_maybe_log_recompilation_reasons", _recompile_reasons)
    from torch._dynamo.variables import builder, dicts
    from torch._dynamo.variables.optimizer import OptimizerVariable

    # Optimizer steps.  builder imported is_from_optimizer_source by name: patch its copy.
    _hook(OptimizerVariable, "__init__", _note_optimizer_seen)
    _hook(OptimizerVariable, "map_sources_and_install_guards", _optimizer_state_dicts)
    _hook(builder, "is_from_optimizer_source", _grads_fully_guarded)
    _hook(dicts.ConstDictVariable, "has_new_items", _same_slot_is_not_new)
    # Importing inductor while torch._dynamo finishes importing is circular (this
    # runs at the end of that import): its hooks go in when inductor loads them.
    _after_import("torch._inductor.codecache", _hook_codecache)
    _after_import("torch._inductor.cudagraph_trees", _hook_cudagraphs)
    _attach_log_artifact()


def _after_import(module_name: str, install_hooks: Callable[[ModuleType], None]) -> None:
    """Run ``install_hooks`` on the module now if it is loaded, else once it is."""
    module = sys.modules.get(module_name)
    if module is not None and not getattr(getattr(module, "__spec__", None), "_initializing", False):
        install_hooks(module)
    elif not any(isinstance(f, _AfterImport) and f.callback is install_hooks for f in sys.meta_path):
        sys.meta_path.insert(0, _AfterImport(module_name, install_hooks))


def _hook_codecache(codecache: ModuleType) -> None:
    # FxGraphCache.prepare_key calls compiled_fx_graph_hash by its module-global name.
    _hook(codecache, "compiled_fx_graph_hash", _fx_key_explainer)


def _hook_cudagraphs(cudagraph_trees: ModuleType) -> None:
    _hook(cudagraph_trees.CUDAGraphNode, "__init__", _record_static_inputs)
    _hook(cudagraph_trees.CUDAGraphNode, "check_invariants", _explain_static_input_moves)


def uninstall() -> None:
    """Put every original back; the flag stays registered so user code keeps working."""
    for (owner, name), original in _originals.items():
        setattr(owner, name, original)
    _originals.clear()
    sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, _AfterImport)]


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
                uninstall()  # all hooks or none: half a library would be worse than none
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


def _guard_builder(original: Callable[..., Any]) -> Callable[..., Any]:
    """Around building a compiled frame's guards: optimizer guards before, outcomes after."""

    def build_guards(self: Any, code: Any, *args: Any, **kwargs: Any) -> Any:
        output = self.tracer_output.output_graph
        # torch asserts the output graph exists; this hook must not fail before it does.
        optimizers_on = enabled("optimizer") and output is not None
        steps = getattr(output, _STEPS, None) if optimizers_on else None
        seen = _optimizers_seen(output) if optimizers_on else None
        if steps:
            try:
                _guard_state_dicts_by_version(output, steps)
            except Exception as error:  # noqa: BLE001 - fail open
                _fell_back("optimizer guards", error)
        guards = original(self, code, *args, **kwargs)
        if seen:
            try:
                _tie_to_optimizers(seen, guards)
            except Exception as error:  # noqa: BLE001 - fail open
                _fell_back("optimizer lifetime", error)
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
        if args and enabled("cudagraphs"):
            _note_input_sources(args[0])
        return self._backend(*args, **kwargs)

    def reset(self) -> None:
        reset = getattr(self._backend, "reset", None)
        if callable(reset):
            reset()


_current_key: contextvars.ContextVar[BackendKey | None] = contextvars.ContextVar(
    "stableguards_backend_key", default=None)


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
    fp = backend_fingerprint(backend)
    key = key_for(fp, _DynamoBackendKey)
    if not hasattr(key, "compiler_name"):  # equal fingerprints, equal names: set once
        key.compiler_name = (getattr(backend, "compiler_name", None)
                             or _registered_name(backend) or fp.description)
    key.watch(_user_backend(backend), _release_entries)
    return _KeyedBackend(backend, key)  # type: ignore[arg-type]


def backend_fingerprint(backend: Any) -> BackendFingerprint:
    """The fingerprint of a backend as torch.compile or torch._dynamo.optimize received it."""
    return _FINGERPRINTER.fingerprint(backend)


@functools.cache
def _torch_wrapper_types() -> tuple[type, ...]:
    """torch's own backend wrappers, whose __call__ only calls their parts (see backend_match)."""
    import torch
    from torch._dynamo.backends import common

    names = ("_TorchCompileInductorWrapper", "_TorchCompileAOTInductorWrapper", "_TorchCompileWrapper")
    found = tuple(getattr(torch, n) for n in names if isinstance(getattr(torch, n, None), type))
    aot = getattr(common, "AotAutograd", None)
    return found + ((aot,) if isinstance(aot, type) else ())


def _is_torch_wrapper(obj: Any) -> bool:
    return type(obj) in _torch_wrapper_types()


def _torch_name(obj: Any) -> str | None:
    """Names of torch objects that are one object per name: dtypes, devices, layouts, ops."""
    import torch

    if type(obj) in (torch.dtype, torch.device, torch.layout, torch.memory_format):
        return repr(obj)
    if type(obj) in (torch._ops.OpOverload, torch._ops.OpOverloadPacket):
        return f"op {obj}"
    return None


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


_FINGERPRINTER = Fingerprinter(_registered_name, _is_torch_wrapper, _torch_name)


# Releases waiting for a safe moment: a key whose last backend died, an optimizer that died.
_pending_release: list[Callable[[], None]] = []


def _release_soon(release: Callable[[], None]) -> None:
    """Run ``release`` now if that is safe, else at the next safe point.

    Releases run from finalizers, which can fire inside torch's own cache work
    (torch._dynamo.reset() dropping the last reference, say), where walking the
    cache entries would touch freed memory.  Dynamo holds compile_lock during
    compiles and resets; inside it, the release waits for the next safe point
    (a torch.compile call, or the start of a frame compile).
    """
    import torch._dynamo.convert_frame as convert_frame

    _pending_release.append(release)
    if not convert_frame.compile_lock._is_owned():
        _release_pending()


def _release_pending() -> None:
    while _pending_release:
        release = _pending_release.pop()
        try:
            release()
        except Exception as error:  # noqa: BLE001 - may run from a finalizer: never raise
            _fell_back("cache entry release", error)


def _invalidate_entries(dead: Callable[[Any], bool], why: str) -> int:
    """Invalidate every cache entry ``dead`` picks: its compiled code and guards can go."""
    import torch._C._dynamo.eval_frame as c_eval_frame
    import torch._dynamo.convert_frame as convert_frame
    from torch._dynamo.guards import DeletedGuardManagerWrapper

    released = 0
    for ref in list(convert_frame.input_codes.seen):
        code = ref()
        if code is None:
            continue
        for entry in c_eval_frame._debug_get_cache_entry_list(code):
            manager = entry.guard_manager
            if dead(entry) and getattr(manager, "extra_state", None) is not None:
                manager.extra_state.invalidate(manager.cache_entry, DeletedGuardManagerWrapper(why))
                released += 1
    return released


def _release_entries(key: BackendKey) -> None:
    """A key's last backend died: release its cache entries (unless an equal backend came back)."""

    def release() -> None:
        if not key.alive:
            released = _invalidate_entries(lambda e: e.backend is key, "backend was collected")
            MANAGER.note_backend_released(str(key.fingerprint), released)

    _release_soon(release)


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
            f"{code.co_name} ({code.co_filename}:{code.co_firstlineno})", key.fingerprint,
            [o.fingerprint if isinstance(o, BackendKey) else type(o).__name__ for o in others])


def _per_backend_cache_size(original: Callable[..., Any]) -> Callable[..., Any]:
    """The recompile limit counts the live entries of the backend being compiled for.

    Invalidated entries (their backend or optimizer was collected) can never
    run again, so they do not count either: rebuilding an optimizer must not
    use up the frame's room.
    """

    def compute_cache_size(frame: Any, cache_entries: Any, *args: Any) -> Any:
        key = _current_key.get()
        if key is not None:
            cache_entries = [e for e in cache_entries if e.backend is key and e.code is not None]
        elif enabled("optimizer"):
            cache_entries = [e for e in cache_entries if e.code is not None]
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


# --- Optimizer steps ----------------------------------------------------------------
#
# The reasoning is in stableguards/optimizer_guards.py; here is where Dynamo is told.

# Set on the OutputGraph being traced (it lives as long as the trace does): per
# optimizer step, (weak optimizer, [(source of opt.state[p], that dict)]).
_STEPS = "_stableguards_optimizer_steps"


def _optimizer_state_dicts(original: Callable[..., None]) -> Callable[..., None]:
    """Note each per-parameter state dict an optimizer step reads, with the source Dynamo gave it."""

    def map_sources_and_install_guards(self: Any, tx: Any) -> None:
        original(self, tx)
        if enabled("optimizer") and _DICT_VERSIONS_SOUND:
            try:
                from torch._dynamo.source import AttrSource, ConstDictKeySource, DictGetItemSource

                state = AttrSource(self.source, "state")
                dicts = [(DictGetItemSource(state, ConstDictKeySource(state, i)), d)
                         for i, d in enumerate(self.value.state.values()) if type(d) is dict]
                if not hasattr(tx.output, _STEPS):
                    setattr(tx.output, _STEPS, [])
                getattr(tx.output, _STEPS).append((weakref.ref(self.value), dicts))
                tx.output.add_graph_finalizer(_state_leaves_with(weakref.ref(self.value)))
            except Exception as error:  # noqa: BLE001 - fail open
                _fell_back("optimizer state dicts", error)
        if enabled("cudagraphs"):
            try:
                _warn_copied_grads(self)
            except Exception as error:  # noqa: BLE001 - fail open
                _fell_back("cudagraph grad copies", error)

    return map_sources_and_install_guards


def _state_leaves_with(optimizer: weakref.ref[Any]) -> Callable[[Any], None]:
    """A graph finalizer: the graph drops the optimizer's state tensors when the optimizer dies.

    The graph holds them as buffers.  Upstream's finalizer pops them by the
    names of their sources, but Dynamo registers them under the names of other
    sources for the same tensors (``...state___1___exp_avg`` for
    ``...state[list(dict.keys(...))[1]]``), so a graph something else holds
    keeps every state tensor alive.  Found by identity instead, they go.
    """

    def init(gm: Any) -> None:
        opt = optimizer()
        if opt is None:
            return
        owned = {id(t) for state in opt.state.values() for t in state.values()}
        names = [n for n, t in gm._buffers.items() if id(t) in owned]
        graph = weakref.ref(gm)

        def drop() -> None:
            if (g := graph()) is not None:
                for name in names:
                    g._buffers.pop(name, None)

        weakref.finalize(opt, drop)

    return init


# Dict version tags: PEP 509, deprecated in 3.12 and gone in 3.14, where torch
# checks dicts otherwise.  Where the tags are not there, upstream's guards stay.
_DICT_VERSIONS_SOUND = sys.version_info < (3, 14)


def _guard_state_dicts_by_version(output: Any, steps: list) -> None:
    """Replace identity guards on state tensors by one DICT_VERSION per state dict.

    A dict is covered only if this frame does not put a new object into it (its
    first step, say): the compiled code would change its version right away,
    and the next call would recompile for nothing.
    """
    from torch._dynamo.guards import GuardBuilder

    side_effects = output.side_effects
    covered = {}
    for _, dicts in steps:
        for source, d in dicts:
            var = side_effects.id_to_variable.get(id(d))
            if var is not None and side_effects.is_modified(var) and var.has_new_items():
                continue
            covered[source] = d
    if not covered:
        return
    guards = output.guards
    # The dict's own guards (type, length, keys) and its values' identities.
    dropped = [g for g in guards if g.originating_source in covered
               or (g.create_fn_name() == "ID_MATCH"
                   and getattr(g.originating_source, "base", None) in covered)]
    for guard in dropped:
        guards.inner.discard(guard)
        guards.source_to_guards[guard.originating_source].remove(guard)
    for source in covered:
        output.guard_on_key_order.discard(source)
        guards.add(source.make_guard(GuardBuilder.DICT_VERSION), collect_debug_stack=False)
    MANAGER.note_optimizer_guards(len(covered), len(dropped))


# Backends that run the traced ops as they are, so their code does not depend on
# a grad's strides.
_STRIDE_AGNOSTIC_BACKENDS = frozenset({"eager", "aot_eager"})


def _grads_fully_guarded(original: Callable[[Any], bool]) -> Callable[[Any], bool]:
    """Grads reached through an optimizer get TENSOR_MATCH, as other inputs do.

    Upstream checks only that they are not None, so a grad whose strides changed
    reaches code compiled for the old strides: inductor's asserts fail where
    eager works.  Backends that do not specialize on strides keep the cheap
    check; an unknown backend gets the full one.
    """

    def is_from_optimizer_source(source: Any) -> bool:
        if not enabled("optimizer"):
            return original(source)
        key = _current_key.get()
        if getattr(key, "compiler_name", None) in _STRIDE_AGNOSTIC_BACKENDS:
            return original(source)
        return False

    return is_from_optimizer_source


def _same_slot_is_not_new(original: Callable[[Any], bool]) -> Callable[[Any], bool]:
    """A dict value read from the very slot it is written back to is not a new item.

    SGD stores each momentum buffer back into ``opt.state[p]`` every step.
    Upstream sees a new VariableTracker and writes the dict back after the graph,
    locating ``opt.state[p]`` by position in a walk over ``opt.state``'s keys:
    N walks per step, O(N^2).  Writing a slot's own value back is a no-op, so
    nothing needs writing.
    """

    def has_new_items(self: Any) -> bool:
        if not original(self):
            return False
        if self.should_reconstruct_all or not enabled("optimizer"):
            return True
        try:
            return any(_is_new(self, key, value) for key, value in self.items.items())
        except Exception as error:  # noqa: BLE001 - fail open
            _fell_back("optimizer state write-back", error)
            return True

    return has_new_items


def _is_new(dict_var: Any, key: Any, value: Any) -> bool:
    from torch._dynamo.source import ConstDictKeySource, DictGetItemSource

    if not dict_var.is_new_item(dict_var.original_items.get(key.vt), value):
        return False
    source = value.source if value.is_realized() else None
    if not isinstance(source, DictGetItemSource) or source.base != dict_var.source:
        return True
    index = source.index
    if isinstance(index, ConstDictKeySource):
        originals = tuple(dict_var.original_items)
        if index.base != dict_var.source or index.index >= len(originals):
            return True
        slot = originals[index.index]
        return not (slot.is_python_constant() and key.vt.is_python_constant()
                    and slot.as_python_constant() == key.vt.as_python_constant())
    return not (key.vt.is_python_constant() and key.vt.as_python_constant() == index)


def _note_optimizer_seen(original: Callable[..., None]) -> Callable[..., None]:
    """Every frame that sees an optimizer, not only its step, is compiled for that object."""

    def __init__(self: Any, value: Any, *args: Any, **kwargs: Any) -> None:
        original(self, value, *args, **kwargs)
        if enabled("optimizer"):
            from torch._guards import TracingContext

            context = TracingContext.try_get()
            if context is not None:
                # By identity: a user's optimizer class may define __eq__ and __hash__.
                seen = context.__dict__.setdefault(_SEEN, {})
                seen.setdefault(id(value), weakref.ref(value))

    return __init__


_SEEN = "_stableguards_optimizers"


def _optimizers_seen(output: Any) -> list[Any]:
    refs = getattr(output.tracing_context, _SEEN, {}).values()
    return [opt for opt in (ref() for ref in refs) if opt is not None]


def _tie_to_optimizers(optimizers: list[Any], check_fn: Any) -> None:
    """The entry being built dies with the optimizers it was traced for.

    Invalidating it drops its code; Dynamo's CleanupManager then removes the
    globals that code installed (compiled function, resume functions), and
    with them the graph.
    """
    for optimizer in optimizers:
        _OPTIMIZER_LIVES.depend(optimizer, check_fn)


def _optimizer_died(description: str, check_fns: list[Any]) -> None:
    """An optimizer was collected: release the cache entries compiled for it.

    Through the CheckFunctionManager's own ``invalidate``, which also drops its
    guard manager: torch keeps some CheckFunctionManagers alive for good (its
    finalizer on ``type(G['holder'])``, an immortal ``dict``, say), and the
    guard manager must not stay with them.
    """
    from torch._dynamo.guards import DeletedGuardManagerWrapper

    def release() -> None:
        live = [c for c in check_fns if not isinstance(c.guard_manager, DeletedGuardManagerWrapper)]
        for check_fn in live:
            check_fn.invalidate(obj_str=f"optimizer {description}")
        MANAGER.note_optimizer_released(description, len(live))

    _release_soon(release)


_OPTIMIZER_LIVES = OptimizerLives(_optimizer_died)


def _warn_copied_grads(optimizer_var: Any) -> None:
    """Say once per optimizer which grads cudagraphs will copy (upstream: only under perf_hints)."""
    from torch._dynamo.variables.optimizer import _is_static_for_cudagraphs

    copied = [source.name for grad, source in optimizer_var.grad_to_source.items()
              if not _is_static_for_cudagraphs(grad)]
    if copied:
        _warn_once(f"copied grads {id(optimizer_var.value)}", copied_grads_message(copied))


# --- cudagraph static inputs ---------------------------------------------------------
#
# A CUDAGraphNode is one recording of a compiled function; a re-record makes a
# sibling node for the same function, so the watch is keyed by the function's id.
_STATIC_INPUTS = StaticInputWatch()
# The Dynamo sources of each recent compile's graph inputs, by compile id: the
# graph that cudagraphs records later only has inductor's placeholder names.
_input_sources: collections.OrderedDict[Any, list[str]] = collections.OrderedDict()
_MAX_COMPILES_NAMED = 256


def _note_input_sources(gm: Any) -> None:
    from torch._guards import CompileContext

    try:
        graph_args = [n.meta.get("grapharg") for n in gm.graph.find_nodes(op="placeholder")]
        compile_id = CompileContext.current_compile_id()
    except Exception as error:  # noqa: BLE001 - fail open
        _fell_back("cudagraph input names", error)
        return
    _input_sources[compile_id] = [a.source.name if a is not None and a.source is not None else "?"
                                  for a in graph_args]
    while len(_input_sources) > _MAX_COMPILES_NAMED:
        _input_sources.popitem(last=False)


def _record_static_inputs(original: Callable[..., None]) -> Callable[..., None]:
    def __init__(self: Any, wrapped_function: Any, id: Any, parent: Any, inputs: Any,
                 *args: Any, **kwargs: Any) -> None:
        original(self, wrapped_function, id, parent, inputs, *args, **kwargs)
        if enabled("cudagraphs"):
            try:
                compile_id = args[5] if len(args) > 5 else kwargs.get("compile_id")
                names = input_names([p.name for p in wrapped_function.placeholders],
                                    _input_sources.get(compile_id))
                _STATIC_INPUTS.record(wrapped_function.id, inputs, self.tensor_static_input_idxs, names)
            except Exception as error:  # noqa: BLE001 - fail open
                _fell_back("cudagraph static inputs", error)

    return __init__


def _explain_static_input_moves(original: Callable[..., Any]) -> Callable[..., Any]:
    """torch 2.13 re-records silently when a static input moved: say which, or refuse (strict)."""

    def check_invariants(self: Any, inputs: Any) -> Any:
        from torch._inductor.cudagraph_trees import CheckInvariantStatus

        status, logger = original(self, inputs)
        if status == CheckInvariantStatus.StaticInputIdxMismatch and enabled("cudagraphs"):
            try:
                report = _STATIC_INPUTS.check(self.wrapped_function.id, inputs,
                                              strict=MANAGER.strict_static_inputs)
            except StaticInputMoved:
                raise
            except Exception as error:  # noqa: BLE001 - fail open
                _fell_back("cudagraph static inputs", error)
            else:
                if report is not None:
                    MANAGER.note_static_inputs_moved(report.describe())
        return status, logger

    return check_invariants
