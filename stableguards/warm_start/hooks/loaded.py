"""Loaded entries join Dynamo's cache, as a compile's result would, once their proof holds."""

from __future__ import annotations

import contextlib
import dataclasses
import weakref
from typing import Any

from stableguards.codes import frame_label
from stableguards.events import EVENTS
from stableguards.hooks.core import Hook
from stableguards.warm_start import messages
from stableguards.warm_start.hooks import optimizer_init, proofs
from stableguards.warm_start.state import STATE

_PACKAGE = "torch._dynamo.package"


@dataclasses.dataclass(frozen=True, eq=False)
class LoadedEntry:
    """A saved entry, loaded and waiting for its first call: its guards and code."""

    package: weakref.ref
    guard_manager: Any
    code: Any
    compile_id: Any
    refusals: set[str] = dataclasses.field(default_factory=set)  # why its proof refused calls, once named


def _refusal(guard_manager: Any, f_locals: dict) -> str | None:
    """Why a loaded entry whose guards passed on this call may not serve it: its tree, written
    on this call, does not prove what the cold one did (``hooks.proofs.verify``).  Where it
    may, it lives as long as the optimizers its checks were bound to on this call."""
    loaded = getattr(guard_manager, "stableguards", None)
    if loaded is None:
        return "it was loaded without its proof"
    made: list = []
    with EVENTS.timed("warm start proof"):
        why = proofs.verify(loaded.proof, guard_manager, loaded.guards_state, f_locals, loaded.f_globals,
                            loaded.unguarded, made)
    EVENTS.count("warm_start_facts_checked", len(loaded.proof.facts) if loaded.proof is not None else 0)
    if why is None:
        _lives_with([binding.get() for binding in made], guard_manager)
    return why


def _lives_with(bound: list[Any], guard_manager: Any) -> None:
    """Released when an optimizer it was bound to is collected, as a traced entry is
    (slot ``entry.lives_with``): until then its checks fail for any other object, and
    it would count towards the frame's recompile limit for good."""
    from stableguards.hooks.entries import InstalledEntry
    from stableguards.hooks.seams import signal
    from stableguards.identity.names import by_state

    if optimizers := [obj for obj in bound if obj is not None and by_state(obj)]:
        # The guard manager keeps its token alive; the optimizers' table holds it weakly.
        guard_manager.stableguards_entry = InstalledEntry(guard_manager)
        signal("entry.lives_with", optimizers, guard_manager.stableguards_entry)


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
    package = STATE.loading.get().package
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
    (``_refusal``).  Only the compiled context that loaded it (its package) is
    served, so another backend compiling the same code compiles its own.
    Nothing is traced, and no frame is counted.  An entry whose cold trace made
    a fresh optimizer's state is tried again once this call's fresh optimizer
    holds that state (``_serves_with_cold_state``).

    An entry its proof refuses stays loaded: a refusal binds nothing
    (``proofs.verify``), so it may serve a later call, as it must where one
    function is called for two objects of the same kind (each of a GAN's two
    optimizers steps through ``Optimizer.step``'s wrapper, whose entries pass
    each other's guards until their proof binds them).  It is named in
    explain() when no entry serves the call and it is compiled."""
    rows = STATE.loaded.get(STATE.by_code(frame.f_code)) if STATE.loaded else None
    if rows:
        package = getattr(getattr(self, "_inner_convert", None), "_package", None)
        refused: list[tuple[LoadedEntry, str]] = []
        for entry in list(rows):
            if entry.package() is not package or package is None or not entry.guard_manager.check(frame.f_locals):
                continue
            why = _refusal(entry.guard_manager, frame.f_locals)
            if why is None:
                return _admit(frame.f_code, entry)
            refused.append((entry, why))
        for entry in list(rows) if package is not None else ():
            if entry.package() is package and _serves_with_cold_state(entry, frame, refused):
                return _admit(frame.f_code, entry)
        for entry, why in refused:
            if why not in entry.refusals:  # a frame recompiled for the same reason is named once
                entry.refusals.add(why)
                messages.not_used(frame_label(frame.f_code), why)
    return call(self, frame, *args, **kwargs)


def _serves_with_cold_state(entry: LoadedEntry, frame: Any, refused: list[tuple[LoadedEntry, str]]) -> bool:
    """Whether ``entry`` serves this call once its fresh optimizers hold the state its cold
    trace filled (``optimizer_init``): made, then its guards and proof checked in full; the
    state is emptied again if they fail, and a refusal added to ``refused``."""
    loaded = getattr(entry.guard_manager, "stableguards", None)
    filled = optimizer_init.fill_as_cold(loaded.guards_state, frame) if loaded is not None else []
    if not filled:
        return False
    served = False
    try:
        if not entry.guard_manager.check(frame.f_locals):
            return False
        why = _refusal(entry.guard_manager, frame.f_locals)
        if why is not None:
            refused.append((entry, why))
            return False
        served = True
    finally:
        if not served:
            optimizer_init.empty(filled)
    messages.cold_state_made(frame_label(frame.f_code), filled)
    return True


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
    _import_as_tracing_would()
    # A later recompile names the guard that failed under the original code; reset clears both.
    orig_code_map[entry.code] = code
    output_codes.add(entry.code)
    return wrap_guarded_code(GuardedCode(entry.code, entry.guard_manager, entry.compile_id, "warm start"))


def _import_as_tracing_would() -> None:
    """Import what a traced compile would have imported by now.

    ShapeEnv imports ``torch.export._trace`` the first time it names a user
    frame (``uninteresting_files``, cached).  A cold process does that while
    Dynamo traces; a warm one that traced nothing first does it wherever a
    symbol is made next, e.g. in compiled autograd's capture of the backward,
    which runs under Dynamo's callback: the import's own frames (a dataclass's
    generated ``__init__``) reach Dynamo, whose compile imports the module
    again and fails as a circular import.  Done here, it happens as in the
    cold process, outside any frame Dynamo watches."""
    from torch.fx.experimental.symbolic_shapes import uninteresting_files

    uninteresting_files()


def _uninstall(call: Any, self: Any) -> None:
    """A package uninstalled: its loaded entries still waiting go too."""
    call(self)
    STATE.drop_loaded(self)


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


HOOKS = [
    Hook(_PACKAGE, "CompilePackage.uninstall", "warm_start", _uninstall),
    Hook("torch._C._dynamo.eval_frame", "_load_precompile_entry", "warm_start", _keep_loaded),
    Hook("torch._dynamo.convert_frame", "ConvertFrame.__call__", "warm_start", _serve_loaded, params=("frame",)),
    Hook("torch._dynamo", "reset_code_caches", "warm_start", _reset_code_caches),
    Hook("torch._dynamo.decorators", "_set_stance", "warm_start", _set_stance, params=("stance",)),
]
