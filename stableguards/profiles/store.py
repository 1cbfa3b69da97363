"""Where profiles live: a local directory (the default) or Redis (for fleets).

Both stores share one contract:

* ``read`` returns the profile, or None when there is none or it cannot be
  used; problems produce one clear warning each, never an exception.
* ``merge_write`` joins a profile into what is stored, atomically, so
  concurrent writers never lose each other's entries (the join is
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
from pathlib import Path
from typing import Any, Protocol

from stableguards.events import EVENTS
from stableguards.files import atomic_write
from stableguards.storage.engines import redacted
from stableguards.profiles.profile import VERSION, Profile, ProfileError, dumps, from_json


LOCK_TIMEOUT_S = 10.0


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


def _aside_suffix() -> str:
    return f"bad-{time.strftime('%Y%m%dT%H%M%S')}-{os.getpid()}"


class LocalStore:
    """One JSON file per key, written atomically (temp file + rename) under a file lock."""

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.directory = Path(directory)

    def path(self, key: str) -> Path:
        safe = "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in key)
        return self.directory / f"{safe}.json"

    def describe(self, key: str) -> str:
        return str(self.path(key))

    def read(self, key: str) -> Profile | None:
        path = self.path(key)
        try:
            return decode(path.read_bytes())
        except FileNotFoundError:
            return None
        except (ProfileError, NewerProfile, OSError):
            # Readers take no lock (renames are atomic).  Anything odd is looked at
            # again under the lock, where a writer cannot be replacing the file,
            # and classified once: moved aside, or left untouched.
            with self._lock(path) as locked:
                try:
                    return self._read_locked(path) if locked else None
                except _Untouchable:
                    return None

    def merge_write(self, key: str, profile: Profile) -> Profile | None:
        """Join ``profile`` into the stored one; the merged profile, or None if not written."""
        path = self.path(key)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as error:
            _warn(f"write:{path}", f"cannot create {path.parent} ({error}); profile not saved")
            return None
        with self._lock(path) as locked:
            if not locked:
                return None
            try:
                stored = self._read_locked(path) if path.exists() or path.is_symlink() else None
            except _Untouchable:
                return None
            merged = profile if stored is None else stored | profile
            try:
                atomic_write(path, encode(merged))
            except OSError as error:
                _warn(f"write:{path}", f"cannot write profile {path} ({error}); profile not saved")
                return None
            return merged

    def clear(self, key: str) -> bool:
        path = self.path(key)
        with self._lock(path) as locked:
            if not locked or not path.is_file():
                return False
            path.unlink()
            return True

    def keys(self) -> list[str]:
        if not self.directory.is_dir():
            return []
        return sorted(p.stem for p in self.directory.glob("*.json") if ".bad-" not in p.name)

    def _read_locked(self, path: Path) -> Profile | None:
        """Read while holding the lock: corrupt files go aside, others raise _Untouchable."""
        if path.is_dir():
            _warn(f"dir:{path}", f"{path} is a directory, not a profile; leaving it alone, "
                                     "compiling without a profile and saving none")
            raise _Untouchable
        try:
            raw = path.read_bytes()
        except FileNotFoundError:
            return None
        except OSError as error:
            _warn(f"read:{path}", f"cannot read profile {path} ({error}); compiling without "
                                      "it and leaving it untouched")
            raise _Untouchable from None
        try:
            return decode(raw)
        except NewerProfile as newer:
            _warn(f"newer:{path}", f"profile {path} was written by a newer stableguards "
                                       f"({newer}); leaving it untouched and compiling without it")
            raise _Untouchable from None
        except ProfileError as error:
            aside = path.with_name(f"{path.stem}.{_aside_suffix()}.json")
            os.replace(path, aside)
            _warn(f"bad:{path}", f"profile {path} is unusable ({error}); moved it to {aside} "
                                     "and compiling as if there were no profile")
            return None

    def _lock(self, path: Path) -> _Locked:
        return _Locked(self, path)


class _Untouchable(Exception):
    """The stored entry exists but must not be read into this process or overwritten."""


class _Locked:
    """Context manager: the key's file lock, or False (with a warning) if it cannot be had."""

    def __init__(self, store: LocalStore, path: Path) -> None:
        # Imported here, not at the top: this module loads with `import torch`
        # (the entry point), and only writing a profile needs a lock.
        from filelock import FileLock

        self.store = store
        self.path = path
        self.lock = FileLock(str(path) + ".lock", timeout=LOCK_TIMEOUT_S)

    def __enter__(self) -> bool:
        from filelock import Timeout

        try:
            self.lock.acquire()
            return True
        except (Timeout, OSError) as error:
            self.store.warn(f"lock:{self.path}", f"cannot lock {self.path} ({error!r}); "
                                                 "profile left as it is")
            return False

    def __exit__(self, *exc: object) -> None:
        if self.lock.is_locked:
            self.lock.release()


class RedisStore:
    """Profiles as JSON strings under ``stableguards:pgo:<key>``, merged with WATCH/MULTI."""

    PREFIX = "stableguards:pgo:"
    # How long a merge keeps trying while other writers change the value first.  Each
    # retry waits a random, growing pause: writers that collided then spread out
    # instead of colliding again (a fixed count of immediate retries lost writes
    # with eight writers on two cores).
    MERGE_BUDGET_S = 5.0
    MAX_PAUSE_S = 0.05

    def __init__(self, url: str, timeout_s: float = 2.0) -> None:
        import redis  # optional dependency: pip install 'stableguards[redis]'

        self.url = redacted(url)  # what is shown: never the credentials
        self._redis = redis
        self._client = redis.Redis.from_url(
            url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s
        )

    def describe(self, key: str) -> str:
        return f"{self.url} {self.PREFIX}{key}"

    def read(self, key: str) -> Profile | None:
        try:
            return self._read(self._client, key)
        except _Untouchable:
            return None
        except self._redis.RedisError as error:
            self._unreachable(error)
            return None

    def merge_write(self, key: str, profile: Profile) -> Profile | None:
        name = self.PREFIX + key
        try:
            deadline = time.monotonic() + self.MERGE_BUDGET_S
            with self._client.pipeline() as pipe:
                for attempt in itertools.count():
                    try:
                        pipe.watch(name)
                        stored = self._read(pipe, key)
                        merged = profile if stored is None else stored | profile
                        pipe.multi()
                        pipe.set(name, encode(merged))
                        pipe.execute()
                        return merged
                    except self._redis.WatchError:
                        pass  # another writer got in first: merge again on top of theirs
                    if time.monotonic() >= deadline:
                        break
                    time.sleep(random.uniform(0, min(self.MAX_PAUSE_S, 0.001 * 2 ** attempt)))
            _warn(f"contended:{name}", f"{name} kept changing for {self.MERGE_BUDGET_S:.0f} s while "
                                           "merging; profile not saved this time")
            return None
        except _Untouchable:
            return None
        except self._redis.RedisError as error:
            self._unreachable(error)
            return None

    def clear(self, key: str) -> bool:
        return bool(self._client.delete(self.PREFIX + key))

    def keys(self) -> list[str]:
        names = self._client.scan_iter(match=self.PREFIX + "*")
        return sorted(n.decode()[len(self.PREFIX):] for n in names if b":bad-" not in n)

    def _read(self, client: Any, key: str) -> Profile | None:
        name = self.PREFIX + key
        raw = client.get(name)
        if raw is None:
            return None
        try:
            return decode(raw)
        except NewerProfile as newer:
            _warn(f"newer:{name}", f"{name} was written by a newer stableguards ({newer}); "
                                       "leaving it untouched and compiling without it")
            raise _Untouchable from None
        except ProfileError as error:
            aside = f"{name}:{_aside_suffix()}"
            # RENAMENX: never overwrite something already set aside under that name.
            self._client.renamenx(name, aside)
            _warn(f"bad:{name}", f"{name} is unusable ({error}); moved it to {aside} and "
                                     "compiling as if there were no profile")
            return None

    def _unreachable(self, error: Exception) -> None:
        _warn(f"{self.url} unreachable", f"Redis at {self.url} is unreachable ({type(error).__name__}: "
                                 f"{error}); compiling without a shared profile")


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
