"""Specialization-aware profiles: where Dynamo's automatic-dynamic state is read and written.

The profile model, its merge and its stores are plain logic beside this
module; here torch's ``CodeState`` is converted to and from it,
and the compile outcomes (which dimensions the compile specialized, and why)
are recorded as each frame's guards are built.
"""

from __future__ import annotations

import os
from collections import defaultdict
from typing import Any

from stableguards.events import EVENTS
from stableguards.hooks.core import Hook, cache_subdir
from stableguards.hooks.seams import fills
from stableguards.profiles.identity import closure_fingerprint, default_profile_key
from stableguards.profiles.profile import DYNAMIC, UNSET, CodeKey, Dim, Dims, Profile, SourceEntry
from stableguards.profiles.profile import ProfileError, State, specialized, static
from stableguards.profiles.session import handed_on
from stableguards.profiles.state import STATE
from stableguards.profiles.store import EngineStore, NewerProfile, ProfileStore, TieredStore, decode, encode
from stableguards.storage import STORE_ENV, configured, redis_engine

REDIS_ENV_VAR = "STABLEGUARDS_PGO_REDIS_URL"


def _make(call: Any, code: Any, closure: Any = None) -> Any:
    """torch's CodeId with a closure fingerprint that is the same in every process."""
    if not closure:
        return call(code, closure)
    import torch._dynamo.pgo as pgo

    return pgo.CodeId(code.co_filename, code.co_firstlineno, code.co_name,
                      pgo._hash_containing_file(code.co_filename), closure_fingerprint(closure))


def _get_code_state(call: Any) -> Any:
    """Dynamo's automatic-dynamic state, read from this process's profile."""
    import torch._dynamo.pgo as pgo

    if pgo._CODE_STATE is not None:
        return call()
    state = _load_code_state()
    pgo._CODE_STATE = state
    return state


def _put_code_state(call: Any) -> None:
    """Dynamo's automatic-dynamic state, merged with the compile outcomes into the profile."""
    # No session: the profile was read by torch (flag off then, or our read
    # failed), so torch writes it too.
    if STATE.session is None:
        return call()
    _save_code_state()
    return None


@fills("build_guards.after", "profiles")
def after_guards(dynamo_output: Any, code: Any, check_fn: Any) -> None:
    """A frame's guards are built (``hooks.seams``): record what its compile specialized."""
    if STATE.session is not None:
        _record_outcomes(code, dynamo_output.tracer_output)


def _set_replacement(call: Any, shape_env: Any, a: Any, tgt: Any, msg: str) -> None:
    """Keep why a symbol was replaced: the ShapeEnv only logs it."""
    before = shape_env._replacements_version_counter
    call(shape_env, a, tgt, msg)
    if shape_env._replacements_version_counter != before:
        STATE.note_replacement(shape_env, str(a), msg)


def profile_key(job_id: str | None = None) -> str | None:
    """The key a profile is stored under, or None when caches are off.

    ``job_id`` names another job's profile (torch's ``pgo_extra_read_key`` and
    ``pgo_extra_write_key``).  Otherwise TORCH_COMPILE_JOB_ID
    (torch.compiler.config.job_id) wins; without it the key names the entry
    point (see stableguards.profiles.identity).  torch.compiler.config.cache_key_tag
    is always part of it, and the rank is, as upstream, unless a shared store is
    named (``STABLEGUARDS_STORE``): then every rank reads and joins one profile, so
    rank 7 starts from what rank 0 learned (a join only makes more dimensions
    dynamic, which guards make sound on every rank).
    """
    import torch
    import torch._inductor.config as inductor_config

    if inductor_config.force_disable_caches:
        return None
    job_id = job_id or torch.compiler.config.job_id or default_profile_key()
    tag = torch.compiler.config.cache_key_tag
    rank = "" if os.environ.get(STORE_ENV) else f":rank{_rank()}"
    return f"{job_id}{rank}" + (f":{tag}" if tag else "")


def profile_store() -> ProfileStore | None:
    """Where profiles live, following torch's settings; None when there is nowhere.

    * Local: ``pgo/`` in the configured store (``STABLEGUARDS_STORE``, else
      ``<inductor cache dir>/stableguards/store``), on its engine and its one Redis
      client, when ``torch._dynamo.config.automatic_dynamic_local_pgo`` is on
      (torch's default); or Redis when STABLEGUARDS_PGO_REDIS_URL is set (the
      user's explicit choice).
    * Remote: torch's own remote PGO cache, when
      ``automatic_dynamic_remote_pgo`` turns it on, holding JSON (never a pickle).

    Read from the first that has a profile (local, then remote, as torch), and
    written to all.
    """
    import torch._dynamo.config as dynamo_config
    import torch._dynamo.pgo as pgo

    tiers: list[ProfileStore] = []
    url = os.environ.get(REDIS_ENV_VAR)
    if url or dynamo_config.automatic_dynamic_local_pgo:
        try:
            # The store stands where torch's local profiles would: it follows their switch.
            tiers.append(EngineStore(redis_engine(url) if url else configured(cache_subdir("store")).unsigned()))
        except ImportError:
            EVENTS.warn_once("redis", f"{REDIS_ENV_VAR if url else STORE_ENV} names Redis but the redis "
                                      "package is not installed (pip install 'stableguards[redis]'); "
                                      "compiling without it")
    if pgo.should_use_remote_dynamo_pgo_cache() and (remote := pgo.get_remote_cache()) is not None:
        tiers.append(TorchRemoteStore(remote))
    if not tiers:
        return None
    return tiers[0] if len(tiers) == 1 else TieredStore(tiers)


class TorchRemoteStore:
    """torch's remote PGO cache (``automatic_dynamic_remote_pgo``), holding stableguards' JSON.

    Under its own key prefix, so a flag-off job's pickle and a flag-on job's
    JSON never meet.  A remote cache has no compare-and-set: a write puts the
    join of what this process read and wrote there, and two processes writing
    at once can each lose the other's latest additions until one writes again
    (the merge is monotone, so nothing that is re-learned is lost for good).
    """

    PREFIX = "stableguards:"
    FIELD = "stableguards_profile"

    def __init__(self, cache: Any) -> None:
        self._cache = cache
        self._known: dict[str, Profile] = {}

    def read(self, key: str) -> Profile | None:
        try:
            data = self._cache.get(self.PREFIX + key)
        except Exception as error:  # noqa: BLE001 - a remote that fails is a remote that is not there
            EVENTS.warn_once("remote pgo", f"torch's remote PGO cache failed to read ({error!r}); "
                                          "compiling without its profile")
            return None
        if data is None:
            return None
        try:
            profile = decode(data[self.FIELD].encode())
        except (KeyError, TypeError, AttributeError, ProfileError, NewerProfile) as error:
            EVENTS.warn_once("remote pgo format", f"torch's remote PGO cache holds an unusable profile "
                                                 f"under {self.PREFIX}{key} ({error!r}); ignored")
            return None
        self._known[key] = profile
        return profile

    def merge_write(self, key: str, profile: Profile) -> Profile | None:
        merged = self._known.get(key, Profile()) | profile
        try:
            self._cache.put(self.PREFIX + key, {self.FIELD: encode(merged).decode()})
        except Exception as error:  # noqa: BLE001
            EVENTS.warn_once("remote pgo write", f"torch's remote PGO cache failed to write ({error!r})")
            return None
        self._known[key] = merged
        return merged

    def clear(self, key: str) -> bool:
        return False  # torch's remote caches have no delete

    def keys(self) -> list[str]:
        return []

    def describe(self, key: str) -> str:
        return f"torch remote PGO cache {self.PREFIX}{key}"


def _rank() -> int:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank()
    return int(os.environ.get("RANK", "0"))


def _load_code_state() -> Any:
    import torch
    import torch._dynamo.pgo as pgo

    state: Any = defaultdict(pgo.CodeState)
    key, store = profile_key(), profile_store()
    if key is None or store is None:
        STATE.session = None
        return state
    _import_bundled(store, key)
    extra_read = getattr(torch.compiler.config, "pgo_extra_read_key", None)
    extra_write = getattr(torch.compiler.config, "pgo_extra_write_key", None)
    profile = STATE.open(store, key, extra_read and profile_key(extra_read), extra_write and profile_key(extra_write))
    if profile.frames:
        _record_artifact(profile)
    stale = 0
    for code, sources in profile.frames.items():
        if code.filename and pgo._hash_containing_file(code.filename) != code.file_hash:
            stale += 1  # edited or gone: it can never match, but it is kept for the store
        code_state = state[pgo.CodeId(code.filename, code.firstlineno, code.name,
                                      code.file_hash, code.closure)]
        for name, entry in sources.items():
            code_state.automatic_dynamic[name] = _to_frame_state(entry)
    if stale:
        EVENTS.warn_once("stale", f"the PGO profile {store.describe(key)} names {stale} frame(s) whose "
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
    if STATE.save(observed) and STATE.session is not None:
        _record_artifact(STATE.session.known)


def _artifact_key() -> str | None:
    """The key torch files PGO artifacts under (its own cache key), else stableguards'."""
    import torch._dynamo.pgo as pgo

    return pgo.get_cache_key() or profile_key()


def _record_artifact(profile: Profile) -> None:
    """Put the profile in torch's cache artifacts, so ``torch.compiler.save_cache_artifacts()``
    carries it: as torch's own PGO artifact type, with a JSON payload."""
    import torch._dynamo.pgo as pgo
    from torch.compiler._cache import CacheArtifactManager

    if (key := _artifact_key()) is not None:
        CacheArtifactManager.record_artifact(pgo.PGOCacheArtifact.type(), key, encode(profile))


def _import_bundled(store: ProfileStore, key: str) -> None:
    """Take in a profile ``torch.compiler.load_cache_artifacts()`` put where torch keeps its own.

    torch writes a loaded PGO artifact to its local profile path; when the
    artifact came from stableguards it is JSON, and it goes into the store.  A
    pickle (torch's own, written with the flag off) is never loaded here.
    """
    import torch._dynamo.pgo as pgo

    for torch_key in dict.fromkeys(k for k in (pgo.get_cache_key(), key) if k):
        path = pgo.code_state_path(torch_key)
        if path is None or not os.path.exists(path):
            continue
        with open(path, "rb") as f:
            raw = f.read()
        if not raw.lstrip().startswith(b"{"):
            continue
        try:
            profile = decode(raw)
        except (ProfileError, NewerProfile) as error:
            EVENTS.warn_once(f"bundled {path}", f"the PGO artifact loaded at {path} is unusable ({error}); "
                                               "ignored")
            continue
        if store.merge_write(key, profile) is not None:
            os.remove(path)  # in the store now; torch would fail to unpickle it


def _record_outcomes(code: Any, tracer_output: Any) -> None:
    import torch
    import torch._dynamo.pgo as pgo

    output_graph = tracer_output.output_graph
    if output_graph is None or STATE.session is None:
        return
    shape_env = output_graph.shape_env
    code_key = _code_key(pgo.CodeId.make(code, tracer_output.closure))

    def outcome(sym: Any) -> Dim:
        expr = sym.node._expr  # the symbol as created; .expr has replacements applied
        if not shape_env.replace(expr).is_number:
            return DYNAMIC
        return specialized(*STATE.replacement_reasons(shape_env, str(expr)))

    for tracked in output_graph.tracked_fakes or ():
        name, fake = tracked.source.name, tracked.fake
        if isinstance(fake, torch.Tensor):
            for i, size in enumerate(fake.size()):
                if isinstance(size, torch.SymInt):
                    STATE.session.record_outcome(code_key, name, ("size", i), outcome(size))
        elif isinstance(fake, (torch.SymInt, torch.SymFloat)):
            STATE.session.record_outcome(code_key, name, ("scalar",), outcome(fake))


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


HOOKS = [
    # Upstream identifies closures with hash(), which changes between processes.
    Hook("torch._dynamo.pgo", "CodeId.make", "profiles", _make, params=("code", "closure")),
    Hook("torch._dynamo.pgo", "get_code_state", "profiles", _get_code_state),
    # convert_frame imported put_code_state by name: its copy is the one called.
    Hook("torch._dynamo.convert_frame", "put_code_state", "profiles", _put_code_state),
    Hook("torch.fx.experimental.symbolic_shapes", "ShapeEnv._set_replacement", "profiles", _set_replacement,
         params=("a", "tgt", "msg")),
]
