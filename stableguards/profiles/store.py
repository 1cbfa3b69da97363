"""Where profiles live: in the store's engine (a directory, the default, or Redis for fleets).

Every profile store shares one contract:

* ``read`` returns the profile, or None when there is none or it cannot be
  used; problems produce one clear warning each, never an exception.
* ``merge_write`` joins a profile into what is stored with a compare-and-swap,
  so concurrent writers never lose each other's entries (the join is
  commutative and associative, see profile.py).
* Nothing stored is destroyed by accident: a corrupt profile is moved aside
  (``…bad-<time>``) before a fresh one is written; a profile from a newer
  stableguards is left in place and neither read nor overwritten.
"""

from __future__ import annotations

import itertools
import json
import os
import random
import time
from typing import Any, Protocol

from stableguards.events import EVENTS
from stableguards.storage import messages as store_messages
from stableguards.storage.engines import Engine, Refused, Unavailable
from stableguards.profiles.profile import VERSION, Profile, ProfileError, dumps, from_json


class NewerProfile(Exception):
    """A profile written by a newer stableguards: leave it alone."""


def encode(profile: Profile) -> bytes:
    return dumps(profile).encode()


def decode(raw: bytes) -> Profile:
    """Parse stored bytes; ProfileError if unusable, NewerProfile if from a newer version."""
    try:
        data: Any = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ProfileError(f"not valid JSON ({error})") from None
    if isinstance(data, dict) and isinstance(data.get("version"), int) and data["version"] > VERSION:
        raise NewerProfile(f"version {data['version']}")
    return from_json(data)


class ProfileStore(Protocol):
    def read(self, key: str) -> Profile | None: ...

    def merge_write(self, key: str, profile: Profile) -> Profile | None: ...

    def clear(self, key: str) -> bool: ...

    def keys(self) -> list[str]: ...

    def describe(self, key: str) -> str: ...


class EngineStore:
    """Profiles as JSON under ``<prefix><key>.json`` in a store engine (``storage.engines``):
    the shared store's directory or Redis, or a directory of profiles (``--dir``).

    Plain JSON, not signed: a profile only says which dimensions start dynamic, and
    the guards of whatever is compiled from it are checked in every process.
    A merge reads, joins and writes back with the engine's compare-and-swap, so a
    writer that got in between is merged again, never lost.
    """

    # How long a merge keeps trying while other writers change the value first.  Each
    # retry waits a random, growing pause: writers that collided then spread out
    # instead of colliding again (a fixed count of immediate retries lost writes
    # with eight writers on two cores).
    MERGE_BUDGET_S = 5.0
    MAX_PAUSE_S = 0.05

    def __init__(self, engine: Engine, prefix: str = "pgo/") -> None:
        self.engine = engine
        self.prefix = prefix
        # The bytes this store last read or wrote under each name, decoded: a process saves its
        # profile after each compile, and decoding it again each time cost more than the compile's
        # own merge (GPT-2 training: 14 saves).  Bytes are compared, so another writer's are decoded.
        self._decoded: dict[str, tuple[bytes, Profile]] = {}

    def name(self, key: str) -> str:
        safe = "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in key)
        return f"{self.prefix}{safe}.json"

    def describe(self, key: str) -> str:
        return f"{self.engine.describe()}/{self.name(key)}"

    def read(self, key: str) -> Profile | None:
        try:
            return self._read(key)[1]
        except _Untouchable:
            return None
        except Unavailable as error:
            self._unavailable(error)
            return None

    def merge_write(self, key: str, profile: Profile) -> Profile | None:
        """Join ``profile`` into the stored one; the merged profile, or None if not written."""
        deadline = time.monotonic() + self.MERGE_BUDGET_S
        try:
            for attempt in itertools.count():
                raw, stored = self._read(key)
                merged = profile if stored is None else stored | profile
                if merged == stored:
                    return merged  # nothing new to write
                data = encode(merged)
                if self.engine.swap(self.name(key), raw, data):
                    self._decoded[self.name(key)] = (data, merged)
                    return merged
                # Another writer got in first: merge again on top of theirs.
                if time.monotonic() >= deadline:
                    break
                time.sleep(random.uniform(0, min(self.MAX_PAUSE_S, 0.001 * 2 ** attempt)))
        except _Untouchable:
            return None
        except Unavailable as error:
            self._unavailable(error)
            return None
        where = self.describe(key)
        _warn(f"contended:{where}", f"{where} kept changing for {self.MERGE_BUDGET_S:.0f} s while merging; "
                                    "profile not saved this time")
        return None

    def clear(self, key: str) -> bool:
        name = self.name(key)
        try:
            while (raw := self.engine.get(name)) is not None:
                if self.engine.swap(name, raw, None):
                    return True
        except Unavailable as error:
            self._unavailable(error)
        return False

    def keys(self) -> list[str]:
        try:
            names = self.engine.names(self.prefix)
        except Unavailable as error:
            self._unavailable(error)
            return []
        return [n[len(self.prefix):-len(".json")] for n in names if n.endswith(".json") and ".bad-" not in n]

    def _read(self, key: str) -> tuple[bytes | None, Profile | None]:
        """The stored bytes and their profile.  Unusable bytes are moved aside (the profile is
        None, the bytes are what a swap expects); a newer profile raises _Untouchable."""
        name = self.name(key)
        try:
            raw = self.engine.get(name)
        except Refused as error:  # not a profile this store wrote: never read, never replaced
            _warn(f"refused:{self.describe(key)}", f"{self.describe(key)} is not a file the store wrote ({error}); "
                                                   "leaving it untouched and compiling without it")
            raise _Untouchable from None
        if raw is None:
            return None, None
        if (known := self._decoded.get(name)) is not None and known[0] == raw:
            return raw, known[1]
        try:
            profile = decode(raw)
            self._decoded[name] = (raw, profile)
            return raw, profile
        except NewerProfile as newer:
            _warn(f"newer:{self.describe(key)}", f"{self.describe(key)} was written by a newer stableguards "
                                                 f"({newer}); leaving it untouched and compiling without it")
            raise _Untouchable from None
        except ProfileError as error:
            aside = f"{name[:-len('.json')]}.bad-{time.strftime('%Y%m%dT%H%M%S')}-{os.getpid()}.json"
            self.engine.put(aside, raw)  # kept, byte for byte, before anything replaces it
            if self.engine.swap(name, raw, None):
                _warn(f"bad:{self.describe(key)}", f"{self.describe(key)} is unusable ({error}); moved it to "
                                                   f"{aside} and compiling as if there were no profile")
            return None, None

    def _unavailable(self, error: Unavailable) -> None:
        """One warning per cause and store, whichever part met it first (an unreachable Redis
        fails profiles and entries alike)."""
        store_messages.warn("a profile could not be read or saved", self.engine.describe(), error)


class _Untouchable(Exception):
    """The stored entry exists but must not be read into this process or overwritten."""


class TieredStore:
    """Several stores as one: read from the first that has a profile, write to every one.

    torch's order: the local profile first, then the remote one.  Writing to all
    of them keeps each as complete as this process can make it.
    """

    def __init__(self, tiers: list[ProfileStore]) -> None:
        self.tiers = tiers

    def read(self, key: str) -> Profile | None:
        for tier in self.tiers:
            profile = tier.read(key)
            if profile is not None and profile.frames:
                return profile
        return None

    def merge_write(self, key: str, profile: Profile) -> Profile | None:
        written = [merged for tier in self.tiers if (merged := tier.merge_write(key, profile)) is not None]
        if not written:
            return None
        joined = written[0]
        for merged in written[1:]:
            joined = joined | merged
        return joined

    def clear(self, key: str) -> bool:
        return any([tier.clear(key) for tier in self.tiers])  # a list: clear every tier

    def keys(self) -> list[str]:
        return sorted({key for tier in self.tiers for key in tier.keys()})

    def describe(self, key: str) -> str:
        return " + ".join(tier.describe(key) for tier in self.tiers)


def _warn(topic: str, message: str) -> None:
    EVENTS.warn_once(f"profile store {topic}", f"stableguards PGO: {message}")
