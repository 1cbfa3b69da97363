"""Where the shared store's bytes live: a directory (the default) or Redis (for fleets).

An engine knows names and bytes, nothing of what they mean (``storage.content`` does):

* ``get(name)`` the bytes stored under ``name``, or None;
* ``put(name, data)`` replaces them atomically: a reader sees the old bytes or
  the new, never part of either;
* ``swap(name, expected, new)`` the same, only if the bytes are still ``expected``
  (compare-and-swap; None is "no bytes"), so read-merge-write never loses another
  writer's merge; ``names(prefix)`` lists what is stored under a prefix;
* ``claim(name, owner, ttl_s)`` takes a lease if nobody holds a live one,
  ``release(name, owner)`` gives it back if ``owner`` still holds it, ``held(name)``
  says whether anybody does.  A lease
  expires by itself after ``ttl_s``, so a holder that died never blocks anyone
  for longer.

Failures of the engine itself (a directory that cannot be written, Redis
unreachable) raise ``Unavailable``; the caller warns and goes on without.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
import time
import urllib.parse
from pathlib import Path
from typing import Any, Protocol

from stableguards.files import atomic_write


class Unavailable(Exception):
    """The engine cannot be read or written right now."""


class Engine(Protocol):
    def get(self, name: str) -> bytes | None: ...

    def put(self, name: str, data: bytes) -> None: ...

    def swap(self, name: str, expected: bytes | None, new: bytes | None) -> bool: ...

    def names(self, prefix: str) -> list[str]: ...

    def claim(self, name: str, owner: str, ttl_s: float) -> bool: ...

    def release(self, name: str, owner: str) -> None: ...

    def held(self, name: str) -> bool: ...

    def describe(self) -> str: ...


class DirectoryEngine:
    """One file per name under a directory; writes go through a temp file and a rename."""

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.directory = Path(directory)

    def describe(self) -> str:
        return str(self.directory)

    def _path(self, name: str) -> Path:
        if name.startswith("/") or ".." in name.split("/"):
            raise ValueError(f"not a store name: {name!r}")
        return self.directory / name

    def get(self, name: str) -> bytes | None:
        try:
            return self._path(name).read_bytes()
        except FileNotFoundError:
            return None
        except OSError as error:
            raise Unavailable(f"{self._path(name)}: {error}") from error

    def put(self, name: str, data: bytes) -> None:
        path = self._path(name)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            atomic_write(path, data)
        except OSError as error:
            raise Unavailable(f"{path}: {error}") from error

    def swap(self, name: str, expected: bytes | None, new: bytes | None) -> bool:
        """Under the name's file lock (``<name>.lock``): readers take none, since every write is
        a rename; only writers that swap wait for each other."""
        from filelock import FileLock, Timeout  # only writers of merged data need it

        path = self._path(name)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            with FileLock(str(path) + ".lock", timeout=_LOCK_S):
                try:
                    current: bytes | None = path.read_bytes()
                except FileNotFoundError:
                    current = None
                if current != expected:
                    return False
                if new is None:
                    path.unlink(missing_ok=True)
                else:
                    atomic_write(path, new)
                return True
        except (Timeout, OSError) as error:
            raise Unavailable(f"{path}: {error}") from error

    def names(self, prefix: str) -> list[str]:
        """Stored names directly under ``prefix`` (a folder, ending in ``/``, or ""), without
        the engine's own files (temp files, locks)."""
        folder = self._path(prefix) if prefix else self.directory
        try:
            entries = [p for p in folder.iterdir() if p.is_file()]
        except FileNotFoundError:
            return []
        except OSError as error:
            raise Unavailable(f"{folder}: {error}") from error
        return sorted(prefix + p.name for p in entries
                      if not p.name.startswith(".") and not p.name.endswith((".lock", ".break")))

    def claim(self, name: str, owner: str, ttl_s: float) -> bool:
        """A lease is a file that appears whole or not at all (hard-linked from a temp file:
        the link fails if the name exists).  An expired one is removed first by one claimant
        at a time (``_break``), so two claimants of an expired lease never both win."""
        path = self._path(name)
        record = json.dumps({"owner": owner, "expires": time.time() + ttl_s}).encode()
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            held = _lease_record(path)
            if held is not None and held.get("expires", 0) < time.time():
                _break(path, held)
            fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".claim")
            try:
                with os.fdopen(fd, "wb") as f:
                    f.write(record)
                os.link(tmp, path)
            finally:
                os.unlink(tmp)
        except FileExistsError:
            return False
        except OSError as error:
            raise Unavailable(f"{path}: {error}") from error
        return True

    def release(self, name: str, owner: str) -> None:
        path = self._path(name)
        held = _lease_record(path)
        if held is not None and held.get("owner") == owner:
            path.unlink(missing_ok=True)

    def held(self, name: str) -> bool:
        record = _lease_record(self._path(name))
        return record is not None and record.get("expires", 0) >= time.time()


# How long a writer waits for another one's swap: each holds the lock for one small read and write.
_LOCK_S = 10.0

# A claimant that died while breaking an expired lease leaves its breaker file behind this long.
_BREAKER_S = 10.0


def _break(path: Path, expired: dict[str, Any]) -> None:
    """Remove the expired lease ``expired`` at ``path``, unless another claimant is breaking it
    (it holds ``<lease>.break``) or it was replaced meanwhile: read again under the breaker, so
    a fresh lease another claimant made is never removed."""
    breaker = path.with_name(f"{path.name}.break")
    try:
        fd = os.open(breaker, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        with contextlib.suppress(FileNotFoundError):
            if breaker.stat().st_mtime < time.time() - _BREAKER_S:
                breaker.unlink()
        return
    os.close(fd)
    try:
        if _lease_record(path) == expired:
            path.unlink(missing_ok=True)
    finally:
        breaker.unlink(missing_ok=True)


def _lease_record(path: Path) -> dict[str, Any] | None:
    try:
        record = json.loads(path.read_bytes())
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        # Garbage (a lease appears whole, see claim): held, for now; it ages out by its
        # modification time.
        try:
            return {"owner": None, "expires": path.stat().st_mtime + 60}
        except FileNotFoundError:
            return None
    return record if isinstance(record, dict) else {"owner": None, "expires": 0}


# Compare-and-delete: a lease is given back only by the owner that holds it.
_RELEASE = "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) else return 0 end"

# Compare-and-swap in one script (Redis runs a script atomically).  ARGV: whether bytes are
# expected ("1") or their absence ("0"), the expected bytes, whether to set ("1") or delete, the new bytes.
_SWAP = """
local current = redis.call('get', KEYS[1])
if (ARGV[1] == '0' and current ~= false) or (ARGV[1] == '1' and current ~= ARGV[2]) then return 0 end
if ARGV[3] == '1' then redis.call('set', KEYS[1], ARGV[4]) else redis.call('del', KEYS[1]) end
return 1
"""


class RedisEngine:
    """Names under one key prefix in a Redis database; ``SET`` is atomic, a lease is ``SET NX PX``."""

    PREFIX = "stableguards:store:"

    def __init__(self, url: str, timeout_s: float = 2.0) -> None:
        import redis  # optional dependency: pip install 'stableguards[redis]'

        self.url = url
        self._redis = redis
        self._client = redis.Redis.from_url(url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s)
        self._release = self._client.register_script(_RELEASE)
        self._swap = self._client.register_script(_SWAP)

    def describe(self) -> str:
        return redacted(self.url)

    def _call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        try:
            return getattr(self._client, method)(*args, **kwargs)
        except self._redis.RedisError as error:
            raise Unavailable(f"{redacted(self.url)}: {error}") from error

    def get(self, name: str) -> bytes | None:
        return self._call("get", self.PREFIX + name)

    def put(self, name: str, data: bytes) -> None:
        self._call("set", self.PREFIX + name, data)

    def swap(self, name: str, expected: bytes | None, new: bytes | None) -> bool:
        args = ["0" if expected is None else "1", expected or b"", "0" if new is None else "1", new or b""]
        try:
            return bool(self._swap(keys=[self.PREFIX + name], args=args))
        except self._redis.RedisError as error:
            raise Unavailable(f"{redacted(self.url)}: {error}") from error

    def names(self, prefix: str) -> list[str]:
        pattern = self.PREFIX + "".join("\\" + ch if ch in "*?[]\\" else ch for ch in prefix) + "*"
        found = self._call("scan_iter", match=pattern)
        try:  # directly under the prefix, as in a directory
            return sorted(name for n in found if "/" not in (name := n.decode()[len(self.PREFIX):])[len(prefix):])
        except self._redis.RedisError as error:  # scan_iter is lazy: it fails while iterated
            raise Unavailable(f"{redacted(self.url)}: {error}") from error

    def claim(self, name: str, owner: str, ttl_s: float) -> bool:
        return bool(self._call("set", self.PREFIX + name, owner.encode(), nx=True, px=max(1, int(ttl_s * 1000))))

    def held(self, name: str) -> bool:
        return bool(self._call("exists", self.PREFIX + name))

    def release(self, name: str, owner: str) -> None:
        try:
            self._release(keys=[self.PREFIX + name], args=[owner.encode()])
        except self._redis.RedisError as error:
            raise Unavailable(f"{redacted(self.url)}: {error}") from error


def redacted(url: str) -> str:
    """``url`` with any user name and password replaced by ``***``: fit for logs and explain()."""
    parts = urllib.parse.urlsplit(url)
    if parts.username is None and parts.password is None:
        return url
    host = parts.hostname or ""
    netloc = "***@" + (f"[{host}]" if ":" in host else host) + (f":{parts.port}" if parts.port else "")
    return urllib.parse.urlunsplit(parts._replace(netloc=netloc))
