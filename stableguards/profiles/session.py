"""One process's dealings with one stored profile.

Dynamo keeps its own in-memory view of what varied (torch's
``FrameStateSizeEntry`` objects); the integration layer converts it to a
``Profile`` and hands it here.  The session adds what only the compiles know
(which dynamic dimensions stayed dynamic and which were specialized), writes
when that adds something the store lacks, and remembers what it loaded so a
restart's explanation can name what was handed on.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

from stableguards.profiles.profile import (
    DYNAMIC,
    UNSET,
    CodeKey,
    Dim,
    Dims,
    Profile,
    SourceEntry,
    State,
)
from stableguards.profiles.store import ProfileStore

# Where in a source a compile outcome applies: ("scalar",) or ("size", dim).
Slot = tuple[str] | tuple[str, int]


def handed_on(dim: Dim) -> Dim:
    """What the next process starts from for a stored dimension.

    Specialized dimensions start unset, so the next process compiles them
    static first, as the cold run did, instead of creating symbols that vanish.
    """
    if dim.state in (State.VARIED, State.DYNAMIC):
        return DYNAMIC
    if dim.state == State.SPECIALIZED:
        return UNSET
    return dim


class ProfileSession:
    """The profile under ``key``; optionally read from ``extra_read`` when there is none
    (torch's ``pgo_extra_read_key``) and written to ``extra_write`` too
    (``pgo_extra_write_key``), so jobs can hand profiles to each other."""

    def __init__(self, store: ProfileStore, key: str, counters: Counter[str],
                 extra_read: str | None = None, extra_write: str | None = None) -> None:
        self.store = store
        self.key = key
        self.extra_read = extra_read
        self.extra_write = extra_write
        self.counters = counters
        self.loaded = Profile()
        # What the store is known to hold: what was loaded joined with what was written.
        self._known = Profile()
        self._outcomes: dict[CodeKey, dict[str, dict[Slot, Dim]]] = {}

    def load(self) -> Profile:
        """Read the stored profile (empty if there is none or it is unusable).

        Only when the key has none is the extra key read, as torch does: a job's
        own profile is the better guide to its own shapes.
        """
        self.loaded = self.store.read(self.key) or Profile()
        self._known = self.loaded
        if not self.loaded.frames and self.extra_read is not None:
            self.loaded = self.store.read(self.extra_read) or Profile()
        self.counters["pgo_profiles_loaded"] += bool(self.loaded.frames)
        self.counters["pgo_sources_loaded"] += len(self.loaded)
        return self.loaded

    def record_outcome(self, code: CodeKey, source: str, slot: Slot, outcome: Dim) -> None:
        """A compile kept ``slot`` of ``source`` dynamic, or specialized it."""
        slots = self._outcomes.setdefault(code, {}).setdefault(source, {})
        slots[slot] = slots[slot] | outcome if slot in slots else outcome

    def with_outcomes(self, observed: Profile) -> Profile:
        """Dynamo's view, with each dimension it made dynamic resolved by the compiles."""
        frames = {}
        for code, sources in observed.frames.items():
            outcomes = self._outcomes.get(code, {})
            frames[code] = {
                name: _resolve(entry, outcomes.get(name, {})) for name, entry in sources.items()
            }
        return Profile(frames)

    def save(self, observed: Profile) -> bool:
        """Merge what this process learned into the store, if it adds anything."""
        profile = self.with_outcomes(observed)
        if profile <= self._known:
            self.counters["pgo_writes_skipped"] += 1
            return False
        merged = self.store.merge_write(self.key, profile)
        if self.extra_write is not None:
            self.store.merge_write(self.extra_write, profile)
        if merged is None:
            return False
        self._known = merged
        self.counters["pgo_writes"] += 1
        return True

    @property
    def known(self) -> Profile:
        """What the store is known to hold after this session's reads and writes."""
        return self._known


def specialized_sources(profile: Profile) -> set[tuple[CodeKey, str, Dim]]:
    """Dimensions a compile specialized: the next process starts them unset, not dynamic."""
    found = set()
    for code, name, entry in profile.entries():
        found |= {(code, name, d) for d in entry.dims() if d.state == State.SPECIALIZED}
    return found


def _resolve(entry: SourceEntry, outcomes: dict[Slot, Dim]) -> SourceEntry:
    if not outcomes:
        return entry
    scalar = _resolve_dim(entry.scalar, outcomes.get(("scalar",)))
    size: Dims = entry.size
    if isinstance(size, tuple):
        size = tuple(_resolve_dim(d, outcomes.get(("size", i))) for i, d in enumerate(size))
    return replace(entry, scalar=scalar, size=size)


def _resolve_dim(observed: Dim, outcome: Dim | None) -> Dim:
    # Only a dimension Dynamo treated as dynamic has a compile outcome to apply.
    if outcome is None or observed.state < State.VARIED:
        return observed
    return outcome
