"""Where the shared store's bytes live: a directory (the default) or Redis (for fleets).

An engine knows names and bytes, nothing of what they mean (``storage.content`` does):

* ``get(name, limit)`` the bytes stored under ``name``, or None; never more than ``limit``
  bytes are read, and only what the engine itself wrote is read at all (in a directory a
  regular file, opened without following a link or blocking): anything else raises
  ``Refused``, so whoever can write the store cannot make a reader hang or grow;
* ``put(name, data)`` replaces them atomically: a reader sees the old bytes or
  the new, never part of either;
* ``swap(name, expected, new)`` the same, only if the bytes are still ``expected``
  (compare-and-swap; None is "no bytes"), so read-merge-write never loses another
  writer's merge; ``names(prefix)`` lists what is stored under a prefix;
* leases, whose bytes the caller makes (``storage.leases``): ``claim(name, lease, ttl_s,
  replacing)`` stores ``lease`` if nobody holds one (or the one there is still
  ``replacing``: a lease its reader found dead), ``renew(name, held, lease, ttl_s)``
  replaces this holder's ``held`` bytes with ``lease``, ``release(name, held)`` removes them
  if they are still there.  In Redis a lease also expires by itself ``ttl_s`` after its
  last renewal; a reader never relies on that (``storage.content``).

Failures of the engine itself (a directory that cannot be written, Redis
unreachable) raise ``Unavailable``; the caller warns and goes on without.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import tempfile
import time
import urllib.parse
from pathlib import Path
from typing import Any, Protocol

from stableguards.files import atomic_write

# The most a read of plain data with no size of its own (a profile, the key ledger) may return.
PLAIN_BYTES = 64 << 20


class Unavailable(Exception):
    """The engine cannot be read or written right now; ``cause`` says which (``unreachable``,
    ``unreadable``, ``unwritable``: one warning each, ``storage.messages``)."""

    def __init__(self, reason: str, cause: str = "unreachable") -> None:
        super().__init__(reason)
        self.cause = cause


class Refused(Exception):
    """What is stored under a name is not something the engine wrote: not a regular file, a
    link, or (``oversize``) more bytes than the reader's bound.  Never read (past the bound);
    the reader treats it as unusable."""

    def __init__(self, reason: str, oversize: bool = False) -> None:
        super().__init__(reason)
        self.oversize = oversize


class Engine(Protocol):
    def get(self, name: str, limit: int = PLAIN_BYTES) -> bytes | None: ...

    def put(self, name: str, data: bytes) -> None: ...

    def swap(self, name: str, expected: bytes | None, new: bytes | None) -> bool: ...

    def names(self, prefix: str) -> list[str]: ...

    def claim(self, name: str, lease: bytes, ttl_s: float, replacing: bytes | None = None) -> bool: ...

    def renew(self, name: str, held: bytes, lease: bytes, ttl_s: float) -> bool: ...

    def release(self, name: str, held: bytes) -> None: ...

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

    def get(self, name: str, limit: int = PLAIN_BYTES) -> bytes | None:
        self._path(name)  # a name that stays inside the directory
        try:
            return _read(self.directory, name, limit)
        except FileNotFoundError:
            return None
        except Refused:
            raise
        except OSError as error:
            raise Unavailable(f"{self._path(name)}: {error}", "unreadable") from error

    def put(self, name: str, data: bytes) -> None:
        path = self._path(name)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            atomic_write(path, data)
        except OSError as error:
            raise Unavailable(f"{path}: {error}", "unwritable") from error

    def swap(self, name: str, expected: bytes | None, new: bytes | None) -> bool:
        """Under the name's file lock (``<name>.lock``): readers take none, since every write is
        a rename; only writers that swap wait for each other."""
        from filelock import FileLock, Timeout  # only writers of merged data need it

        path = self._path(name)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            with FileLock(str(path) + ".lock", timeout=_LOCK_S):
                if self.get(name, max(len(expected or b""), 1)) != expected:
                    return False
                if new is None:
                    path.unlink(missing_ok=True)
                else:
                    atomic_write(path, new)
                return True
        except Refused:
            return False  # not what the caller expects: it reads it again, and is refused there
        except (Timeout, OSError) as error:
            raise Unavailable(f"{path}: {error}", "unwritable") from error

    def names(self, prefix: str) -> list[str]:
        """Stored names directly under ``prefix`` (a folder, ending in ``/``, or ""), without
        the engine's own files (temp files, locks)."""
        folder = self._path(prefix) if prefix else self.directory
        try:
            entries = [p for p in folder.iterdir() if p.is_file()]
        except FileNotFoundError:
            return []
        except OSError as error:
            raise Unavailable(f"{folder}: {error}", "unreadable") from error
        return sorted(prefix + p.name for p in entries
                      if not p.name.startswith(".") and not p.name.endswith((".lock", ".break")))

    def claim(self, name: str, lease: bytes, ttl_s: float, replacing: bytes | None = None) -> bool:
        """A lease is a file that appears whole or not at all (hard-linked from a temp file:
        the link fails if the name exists).  One found dead (``replacing``) is removed first by
        one claimant at a time (``_break``), so two claimants of a dead lease never both win.
        A directory has no clock of its own: ``ttl_s`` is for the readers (in the lease)."""
        path = self._path(name)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            if replacing is not None:
                _break(self, name, replacing)
            fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".claim")
            try:
                with os.fdopen(fd, "wb") as f:
                    f.write(lease)
                os.link(tmp, path)
            finally:
                os.unlink(tmp)
        except FileExistsError:
            return False
        except OSError as error:
            raise Unavailable(f"{path}: {error}", "unwritable") from error
        return True

    def renew(self, name: str, held: bytes, lease: bytes, ttl_s: float) -> bool:
        """Replace this holder's lease with ``lease`` if it is still there.  Between the read
        and the rename another claimant may break it (only one found dead); both then compile
        the entry, and both save a whole one."""
        try:
            if self.get(name, len(held)) != held:
                return False
        except Refused:
            return False
        self.put(name, lease)
        return True

    def release(self, name: str, held: bytes) -> None:
        with contextlib.suppress(Refused):
            if self.get(name, len(held)) == held:
                self._path(name).unlink(missing_ok=True)


# How long a writer waits for another one's swap: each holds the lock for one small read and write.
_LOCK_S = 10.0

# A claimant that died while breaking a dead lease leaves its breaker file behind this long.
_BREAKER_S = 10.0

_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
# What opening a name without following links or blocking says when the name is not a plain file
# or folder of ours: a link (ELOOP), a link or file where a folder should be (ENOTDIR), a socket
# or a FIFO with no writer for a write (ENXIO).
_NOT_OURS = {errno.ELOOP, errno.ENOTDIR, errno.ENXIO}


def _read(directory: Path, name: str, limit: int) -> bytes:
    """The bytes of the regular file ``name`` under ``directory``: every folder on the way and
    the file itself opened without following a link, the file without blocking (a FIFO opens
    at once, then is refused), at most ``limit`` bytes.  Raises FileNotFoundError, Refused or
    OSError."""
    *folders, leaf = name.split("/")
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | getattr(os, "O_CLOEXEC", 0))
    try:
        try:
            for folder in folders:
                inner = os.open(folder, _DIR_FLAGS, dir_fd=fd)
                os.close(fd)
                fd = inner
            inner = os.open(leaf, _READ_FLAGS, dir_fd=fd)
        except OSError as error:
            if error.errno in _NOT_OURS:
                raise Refused(f"{name} in {directory} is not a file the store wrote (a link, a socket or a "
                              f"FIFO)") from None
            raise
        os.close(fd)
        fd = inner
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise Refused(f"{name} in {directory} is not a regular file")
        if info.st_size > limit:
            raise Refused(f"{name} in {directory} holds {info.st_size} bytes, more than the {limit} it may", True)
        chunks, left = [], limit + 1
        while left > 0 and (chunk := os.read(fd, min(left, 1 << 20))):
            chunks.append(chunk)
            left -= len(chunk)
        data = b"".join(chunks)
        if len(data) > limit:  # it grew while read
            raise Refused(f"{name} in {directory} holds more than the {limit} bytes it may", True)
        return data
    finally:
        os.close(fd)


def _break(engine: DirectoryEngine, name: str, dead: bytes) -> None:
    """Remove the dead lease ``dead`` at ``name``, unless another claimant is breaking it (it
    holds ``<lease>.break``) or it was replaced meanwhile: read again under the breaker, so a
    fresh lease another claimant made is never removed."""
    path = engine._path(name)
    breaker = path.with_name(f"{path.name}.break")
    try:
        fd = os.open(breaker, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    except FileExistsError:
        with contextlib.suppress(FileNotFoundError):
            if breaker.lstat().st_mtime < time.time() - _BREAKER_S:
                breaker.unlink()
        return
    os.close(fd)
    try:
        try:
            current = engine.get(name, len(dead))
        except Refused:
            current = dead  # not a lease at all: as dead as one
        if current == dead:
            path.unlink(missing_ok=True)
    finally:
        breaker.unlink(missing_ok=True)


# A bounded GET: the value only if it is a string of at most ARGV[1] bytes.  Returns {0}: none,
# {1}: not a string, {2, size}: too long, {3, value}.
_GET = """
local kind = redis.call('type', KEYS[1]).ok
if kind == 'none' then return {0} end
if kind ~= 'string' then return {1} end
local size = redis.call('strlen', KEYS[1])
if size > tonumber(ARGV[1]) then return {2, size} end
return {3, redis.call('get', KEYS[1])}
"""

# A lease: set (for ARGV[2] ms) if there is none, or the one there is ARGV[3] (found dead; "" for none).
_CLAIM = """
local current = redis.call('get', KEYS[1])
if current == false or (ARGV[3] ~= '' and current == ARGV[3]) then
  redis.call('set', KEYS[1], ARGV[1], 'PX', ARGV[2])
  return 1
end
return 0
"""

# Renew: this holder's lease (ARGV[1]) replaced by ARGV[2] for ARGV[3] ms, if it is still there.
_RENEW = """
if redis.call('get', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('set', KEYS[1], ARGV[2], 'PX', ARGV[3])
return 1
"""

# Compare-and-delete: a lease is given back only by the holder whose bytes are there.
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
    """Names under one key prefix in a Redis database; ``SET`` is atomic, a lease is a key with
    an expiry, claimed, renewed and given back by scripts (Redis runs each atomically)."""

    PREFIX = "stableguards:store:"

    def __init__(self, url: str, timeout_s: float = 2.0) -> None:
        import redis  # optional dependency: pip install 'stableguards[redis]'

        self.url = url
        self._redis = redis
        self._client = redis.Redis.from_url(url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s)
        self._scripts = {name: self._client.register_script(text) for name, text in
                         (("get", _GET), ("claim", _CLAIM), ("renew", _RENEW), ("release", _RELEASE),
                          ("swap", _SWAP))}

    def describe(self) -> str:
        return redacted(self.url)

    def _call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        try:
            return getattr(self._client, method)(*args, **kwargs)
        except self._redis.RedisError as error:
            raise Unavailable(f"{redacted(self.url)}: {error}") from error

    def _script(self, name: str, key: str, *args: Any) -> Any:
        try:
            return self._scripts[name](keys=[self.PREFIX + key], args=list(args))
        except self._redis.RedisError as error:
            raise Unavailable(f"{redacted(self.url)}: {error}") from error

    def get(self, name: str, limit: int = PLAIN_BYTES) -> bytes | None:
        reply = self._script("get", name, limit)
        if reply[0] == 0:
            return None
        if reply[0] == 1:
            raise Refused(f"{name} in {self.describe()} is not a string value")
        if reply[0] == 2:
            raise Refused(f"{name} in {self.describe()} holds {reply[1]} bytes, more than the {limit} it may", True)
        return reply[1]

    def put(self, name: str, data: bytes) -> None:
        self._call("set", self.PREFIX + name, data)

    def swap(self, name: str, expected: bytes | None, new: bytes | None) -> bool:
        return bool(self._script("swap", name, "0" if expected is None else "1", expected or b"",
                                 "0" if new is None else "1", new or b""))

    def names(self, prefix: str) -> list[str]:
        pattern = self.PREFIX + "".join("\\" + ch if ch in "*?[]\\" else ch for ch in prefix) + "*"
        found = self._call("scan_iter", match=pattern)
        try:  # directly under the prefix, as in a directory
            return sorted(name for n in found if "/" not in (name := n.decode()[len(self.PREFIX):])[len(prefix):])
        except self._redis.RedisError as error:  # scan_iter is lazy: it fails while iterated
            raise Unavailable(f"{redacted(self.url)}: {error}") from error

    def claim(self, name: str, lease: bytes, ttl_s: float, replacing: bytes | None = None) -> bool:
        return bool(self._script("claim", name, lease, _ms(ttl_s), replacing or b""))

    def renew(self, name: str, held: bytes, lease: bytes, ttl_s: float) -> bool:
        return bool(self._script("renew", name, held, lease, _ms(ttl_s)))

    def release(self, name: str, held: bytes) -> None:
        self._script("release", name, held)


def _ms(seconds: float) -> int:
    return max(1, int(seconds * 1000))


def redacted(url: str) -> str:
    """``url`` with any user name and password replaced by ``***``: fit for logs and explain()."""
    parts = urllib.parse.urlsplit(url)
    if parts.username is None and parts.password is None:
        return url
    host = parts.hostname or ""
    netloc = "***@" + (f"[{host}]" if ":" in host else host) + (f":{parts.port}" if parts.port else "")
    return urllib.parse.urlunsplit(parts._replace(netloc=netloc))
