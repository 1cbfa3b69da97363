"""The guard manager: the one object Dynamo consults while ``stable_guards`` is on.

It owns the stable parts (symbol ids now; profiles, backend matching and
optimizer guards as they arrive), counts what they do and can say why.  It is
plain Python: the hooks in ``stableguards.hooks`` call it with plain
values, and tests can drive it without Dynamo.
"""

from __future__ import annotations

import logging
import weakref
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass

from stableguards.backend_match import BackendFingerprint
from stableguards.pgo.profile import Profile
from stableguards.pgo.session import ProfileSession, specialized_sources
from stableguards.pgo.store import ProfileStore
from stableguards.symbols import DEFAULT_ID_SPACE, allocate

log = logging.getLogger("stableguards")

# Explanations are kept for the most recent events only: a long-running job
# must not grow memory because it compiles often.
_MAX_EVENTS = 256


@dataclass(frozen=True)
class Collision:
    """A source whose home slot was taken, so its id depends on creation order."""

    source: str
    home: int
    holder: str | None
    id: int
    probes: int

    def describe(self) -> str:
        holder = repr(self.holder) if self.holder else "an id allocated outside stableguards"
        return (
            f"source {self.source!r} wanted symbol id {self.home} (held by {holder}) and got "
            f"{self.id} after {self.probes} probe(s): its symbol (s{self.id}, or zf{self.id} "
            f"for a float) is part of the FX-graph and AOTAutograd cache keys via str(symbol), "
            f"so it is stable only while these sources are created in the same order"
        )


@dataclass(frozen=True)
class Fallback:
    """A hook that failed and handed the call back to upstream torch."""

    hook: str
    error: str

    def describe(self) -> str:
        return f"hook {self.hook!r} failed ({self.error}); torch's own behaviour was used"


@dataclass(frozen=True)
class Note:
    """Something worth telling a user who asks why a restart behaved as it did."""

    text: str

    def describe(self) -> str:
        return self.text


class GuardManager:
    """Allocates stable symbol ids, keeps profiles, counts, and explains what happened."""

    def __init__(self, id_space: int = DEFAULT_ID_SPACE, disabled: str = "") -> None:
        self.id_space = id_space
        # Parts left to torch while the flag is on, e.g. {"symbols"}.
        self.disabled = frozenset(p.strip() for p in disabled.split(",") if p.strip())
        self.counters: Counter[str] = Counter()
        self._events: deque[Collision | Fallback | Note] = deque(maxlen=_MAX_EVENTS)
        # The profile of the current process, opened at the first compile.
        self.profile: ProfileSession | None = None
        # Raise StaticInputMoved instead of letting cudagraphs re-record when a static input moved.
        self.strict_static_inputs = False
        # Called with each event's description as it happens (the TORCH_LOGS artifact).
        self.listeners: list[Callable[[str], None]] = []
        # Which source holds each id, per scope (a ShapeEnv under Dynamo), so a
        # collision can name the source it collided with.  Weak, so a finished
        # compile's scope and table go away together.
        self._holders: weakref.WeakKeyDictionary[object, dict[int, str]] = (
            weakref.WeakKeyDictionary()
        )
        # Why each symbol was replaced, per scope: the ShapeEnv logs it but keeps nothing.
        self._reasons: weakref.WeakKeyDictionary[object, dict[str, set[str]]] = (
            weakref.WeakKeyDictionary()
        )

    def symbol_id(self, scope: object, source_name: str, taken: set[int]) -> int:
        """Give ``source_name`` its stable id within ``scope`` and record it in ``taken``."""
        allocation = allocate(source_name, taken, self.id_space)
        holders = self._holders.setdefault(scope, {})
        taken.add(allocation.id)
        holders[allocation.id] = source_name
        self.counters["symbols_allocated"] += 1
        holder = holders.get(allocation.home)
        if allocation.probes and holder == source_name:
            # One source given several symbols (torch's ephemeral sources): numbered
            # in creation order, as upstream does; not a clash between sources.
            self.counters["symbol_repeats"] += 1
        elif allocation.probes:
            self.counters["symbol_collisions"] += 1
            self.counters["symbol_probes"] += allocation.probes
            self._record(Collision(source_name, allocation.home, holder, allocation.id,
                                   allocation.probes))
        return allocation.id

    def open_profile(self, store: ProfileStore, key: str, extra_read: str | None = None,
                     extra_write: str | None = None) -> Profile:
        """Start this process's profile session and load what the store holds."""
        self.profile = ProfileSession(store, key, self.counters, extra_read, extra_write)
        loaded = self.profile.load()
        where = store.describe(key)
        if loaded.frames and extra_read is not None and not self.profile.known.frames:
            where = f"{where} (none there; read the extra key {store.describe(extra_read)})"
        if not loaded.frames:
            self._record(Note(f"profile {where}: none yet, compiling cold"))
            return loaded
        self._record(Note(
            f"profile {where}: loaded {len(loaded)} source(s) in {len(loaded.frames)} frame(s)"))
        self._note_specialized(specialized_sources(loaded), "starts static (was specialized)")
        return loaded

    def save_profile(self, observed: Profile) -> bool:
        """Merge what Dynamo observed, resolved by the compile outcomes, into the store;
        whether anything was written."""
        if self.profile is None:
            return False
        before = specialized_sources(self.profile.known)
        if not self.profile.save(observed):
            return False
        self._note_specialized(specialized_sources(self.profile.known) - before,
                               "recorded as specialized, not dynamic")
        return True

    def note_replacement(self, scope: object, symbol: str, reason: str) -> None:
        self._reasons.setdefault(scope, {}).setdefault(symbol, set()).add(reason)

    def replacement_reasons(self, scope: object, symbol: str) -> set[str]:
        return self._reasons.get(scope, {}).get(symbol, set())

    def _note_specialized(self, found: set, what: str) -> None:
        for code, source, dim in sorted(found, key=lambda f: (f[0].sort_key(), f[1], str(f[2]))):
            self._record(Note(f"source {source!r} of {code.name} at "
                                     f"{code.filename}:{code.firstlineno} {what}: {dim}"))

    def record_fallback(self, hook: str, error: BaseException) -> None:
        """Count a hook that failed open; the caller has already fallen back."""
        self.counters["fallbacks"] += 1
        self._record(Fallback(hook, f"{type(error).__name__}: {error}"))

    def note_backend_switch(self, frame: str, new: BackendFingerprint,
                            cached: list[BackendFingerprint | str]) -> None:
        """A frame compiled for a backend it had no code for, while it had code for others.

        Names the components that tell the new backend from the closest one
        the frame has code for.
        """
        self.counters["backend_switches"] += 1
        known = [c for c in cached if isinstance(c, BackendFingerprint)]
        why = ""
        if known:
            closest = min(known, key=lambda c: len(new.differences(c)))
            differs = new.differences(closest)
            why = (f"; the closest, {closest}, differs in {'; '.join(differs[:3])}"
                   + (f"; and {len(differs) - 3} more" if len(differs) > 3 else ""))
        self._record(Note(f"{frame}: compiled for backend {new}: its code for {len(cached)} other "
                          f"backend(s) is never served to it (BACKEND_MATCH){why}"))

    def note_backend_released(self, backend: str, entries: int) -> None:
        self.counters["backend_entries_released"] += entries
        self._record(Note(f"backend {backend} is gone: released {entries} cache entr"
                          f"{'y' if entries == 1 else 'ies'} compiled for it"))

    def note_optimizer_guards(self, state_dicts: int, identity_guards: int) -> None:
        """A step's state tensors were guarded by their dicts' versions instead of their identities."""
        self.counters["optimizer_state_dicts_versioned"] += state_dicts
        self.counters["optimizer_identity_guards_dropped"] += identity_guards

    def note_hyperparameters_lifted(self, uses: int) -> None:
        """Uses of scheduled hyperparameters rewritten so the graph takes them as inputs."""
        self.counters["hyperparameter_uses_lifted"] += uses

    def note_hyperparameter_specialized(self, sources: list[str]) -> None:
        """A scheduled hyperparameter was made a constant again: AOTAutograd or inductor
        pinned its value while tracing."""
        self.counters["hyperparameters_specialized"] += 1
        self._record(Note(f"specialized {', '.join(sources)}: a decomposition pinned its value, and "
                          f"AOTAutograd's cache would drop that guard; each new value recompiles"))

    def note_hyperparameter_graph_not_cached(self) -> None:
        """A step graph left out of AOTAutograd's cache: its cache would drop guards on a
        scheduled hyperparameter."""
        self.counters["hyperparameter_graphs_not_cached"] += 1

    def note_optimizer_released(self, optimizer: str, entries: int) -> None:
        self.counters["optimizer_entries_released"] += entries
        self._record(Note(f"optimizer {optimizer} was collected: released {entries} cache entr"
                          f"{'y' if entries == 1 else 'ies'} compiled for it"))

    def note_static_inputs_moved(self, description: str) -> None:
        """A cudagraph is re-recorded because static inputs moved: worth a warning, every time."""
        self.counters["cudagraph_rerecords"] += 1
        self._record(Note(description))
        log.warning("stableguards: %s", description)

    def note_recompile(self, frame: str, reasons: list[str]) -> None:
        """Why Dynamo compiled a frame again: the guards that failed, as torch reports them."""
        self.counters["recompiles"] += 1
        self._record(Note(f"{frame} recompiled: " + "; ".join(reasons)))

    def note_cache_miss(self, key: str, nearest: str | None, differences: list[str]) -> None:
        """An FX-graph cache miss, against the closest key recorded before, if any."""
        self.counters["fx_cache_misses"] += 1
        if nearest is None:
            return  # nothing recorded to compare with: a cold cache says nothing useful
        shown = "; ".join(differences[:6]) + (f"; and {len(differences) - 6} more" if len(differences) > 6 else "")
        self._record(Note(f"FX-graph cache miss for key {key[:12]}: the closest recorded key "
                          f"{nearest[:12]} differs in {len(differences)} component(s): {shown}"))

    def note_warm_start_loaded(self, function: str) -> None:
        """A restarted process installed a saved entry for ``function``: no tracing for it."""
        self.counters["warm_start_loaded"] += 1
        self._record(Note(f"warm start: {function} installed its saved compiled entry"))

    def note_warm_start_not_used(self, function: str, reason: str) -> None:
        """A saved entry under the same key failed torch's checks or its install: traced again."""
        self.counters["warm_start_not_used"] += 1
        self._record(Note(f"warm start: {function}'s saved entry was not used ({reason}); compiled as usual"))

    def note_warm_start_saved(self) -> None:
        self.counters["warm_start_saved"] += 1

    def note_warm_start_left_out(self, frame: str, reason: str) -> None:
        """A compile that cannot be saved soundly: a restart traces this frame again."""
        self.counters["warm_start_left_out"] += 1
        self._record(Note(f"warm start: {frame} is left out of its saved entry: {reason}"))

    def note_warm_start_pending(self, frame: str) -> None:
        """An entry waits for a graph compiled on first use (a backward) before it is saved."""
        self._record(Note(f"warm start: {frame}: entry saved once all its graphs are compiled "
                          f"(a backward compiles on its first use)"))

    def note_warm_start_miss(self, function: str, differences: list[str]) -> None:
        """A saved entry exists for ``function`` but under another key: which components differ."""
        self.counters["warm_start_misses"] += 1
        shown = "; ".join(differences[:6]) + (f"; and {len(differences) - 6} more" if len(differences) > 6 else "")
        self._record(Note(f"warm start: {function} has a saved entry for another key; it differs in {shown}"))

    def _record(self, event: Collision | Fallback | Note) -> None:
        self._events.append(event)
        for listener in self.listeners:
            listener(event.describe())

    def explain(self) -> str:
        """Counters so far and, newest last, the events that make a restart miss or differ."""
        lines = ["stableguards: " + (_format_counters(self.counters) or "nothing recorded yet")]
        if self.disabled:
            lines.append("  parts left to torch (STABLEGUARDS_DISABLE): " + ", ".join(sorted(self.disabled)))
        lines += ["  " + event.describe() for event in self._events]
        return "\n".join(lines)

    def reset(self) -> None:
        """Forget counters and events (ids already handed out keep their meaning)."""
        self.counters.clear()
        self._events.clear()


def _format_counters(counters: Counter[str]) -> str:
    return ", ".join(f"{name}={value}" for name, value in sorted(counters.items()))
