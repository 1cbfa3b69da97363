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

import importlib.abc
import importlib.util
import inspect
import logging
import os
import sys
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

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
PARTS = ("symbols", "pgo")
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
        if not enabled("pgo"):
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
    from torch._inductor.runtime.cache_dir_utils import cache_dir

    return LocalStore(Path(cache_dir()) / "stableguards" / "pgo")


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

    if pgo._CODE_STATE is None or MANAGER.profile is None:
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
