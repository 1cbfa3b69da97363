"""This process's profile session, and why each symbol was replaced (for the outcomes)."""

from __future__ import annotations

import weakref

from stableguards.events import EVENTS
from stableguards.profiles import messages
from stableguards.profiles.profile import Profile
from stableguards.profiles.session import ProfileSession, specialized_sources
from stableguards.profiles.store import ProfileStore


class Profiles:
    def __init__(self) -> None:
        # The profile of the current process, opened at the first compile; None when torch
        # reads and writes it (flag off then, or no store).
        self.session: ProfileSession | None = None
        # Why each symbol was replaced, per ShapeEnv: the ShapeEnv logs it but keeps nothing.
        self._reasons: weakref.WeakKeyDictionary[object, dict[str, set[str]]] = weakref.WeakKeyDictionary()

    def open(self, store: ProfileStore, key: str, extra_read: str | None = None,
             extra_write: str | None = None) -> Profile:
        """Start this process's profile session and load what the store holds."""
        self.session = ProfileSession(store, key, EVENTS.counters, extra_read, extra_write)
        loaded = self.session.load()
        where = store.describe(key)
        if loaded.frames and extra_read is not None and not self.session.known.frames:
            where = f"{where} (none there; read the extra key {store.describe(extra_read)})"
        if not loaded.frames:
            messages.none_yet(where)
            return loaded
        messages.loaded(where, len(loaded), len(loaded.frames))
        messages.specialized(specialized_sources(loaded), "starts static (was specialized)")
        return loaded

    def save(self, observed: Profile) -> bool:
        """Merge what Dynamo observed, resolved by the compile outcomes, into the store;
        whether anything was written."""
        if self.session is None:
            return False
        before = specialized_sources(self.session.known)
        if not self.session.save(observed):
            return False
        messages.specialized(specialized_sources(self.session.known) - before, "recorded as specialized, not dynamic")
        return True

    def note_replacement(self, shape_env: object, symbol: str, reason: str) -> None:
        self._reasons.setdefault(shape_env, {}).setdefault(symbol, set()).add(reason)

    def replacement_reasons(self, shape_env: object, symbol: str) -> set[str]:
        return self._reasons.get(shape_env, {}).get(symbol, set())


STATE = Profiles()
