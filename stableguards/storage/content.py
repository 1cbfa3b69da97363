"""Content-addressed, verified, optionally signed entries over an engine.

An entry is published in two writes: its bytes under their own digest
(``blobs/<sha256>``), then a small record under its name
(``refs/<namespace>/<name>``) that says which digest it is, how long, and,
with a key, an HMAC over namespace, name, digest and size.  A reader follows the
record, checks the HMAC before anything else and the bytes against the digest,
and gets the whole entry or nothing:

* a record is written only after its bytes, so a writer killed between the two
  leaves no record (its bytes are unreachable, harmless);
* concurrent writers of one entry each write a whole record (the last one
  stays); writers of different entries never touch the same name;
* corrupt, truncated or foreign bytes, an unsigned or wrongly signed record
  when a key is set: ``Unusable`` with the reason (the caller warns once and
  compiles as usual); nothing stored is removed.

The HMAC binds bytes to a name: whoever can write the store but has no key
cannot make any reader load bytes of their choosing under a name.  Without a
key the store must be trusted like code (entries are pickles).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import socket
import time
import uuid
from dataclasses import dataclass

from stableguards.storage.engines import Engine

FORMAT = 1


class Unusable(Exception):
    """A stored entry that must not be used: the reason says why."""


@dataclass(frozen=True)
class Ref:
    digest: str
    size: int
    mac: str | None

    def dumps(self) -> bytes:
        record = {"format": FORMAT, "digest": self.digest, "size": self.size}
        if self.mac is not None:
            record["mac"] = self.mac
        return json.dumps(record, sort_keys=True).encode()

    @classmethod
    def loads(cls, raw: bytes) -> Ref:
        try:
            record = json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, ValueError):
            raise Unusable("its record is not a stableguards store record") from None
        if not isinstance(record, dict) or record.get("format") != FORMAT:
            raise Unusable(f"its record is of another format ({str(record)[:60]})")
        digest, size, mac = record.get("digest"), record.get("size"), record.get("mac")
        if not isinstance(digest, str) or not isinstance(size, int) or not isinstance(mac, (str, type(None))):
            raise Unusable("its record is incomplete")
        return cls(digest, size, mac)


class ContentStore:
    """Named entries over ``engine``; signed and checked with ``key`` when there is one."""

    def __init__(self, engine: Engine, key: bytes | None = None) -> None:
        self.engine = engine
        self.key = key

    def describe(self) -> str:
        return self.engine.describe() + (" (signed)" if self.key else "")

    def unsigned(self) -> Engine:
        """Where this store keeps plain data that nothing runs or trusts (the key ledger: it
        only explains a miss), read and written unsigned, by names apart from the signed
        entries' (``refs/``, ``blobs/``, ``leases/``).  Never for anything that is loaded."""
        return self.engine

    def _mac(self, namespace: str, name: str, digest: str, size: int) -> str | None:
        if self.key is None:
            return None
        message = json.dumps([namespace, name, digest, size]).encode()
        return hmac.new(self.key, message, hashlib.sha256).hexdigest()

    def publish(self, namespace: str, name: str, data: bytes) -> str:
        """Store ``data`` as the entry ``namespace/name``; its digest.  Raises Unavailable."""
        digest = hashlib.sha256(data).hexdigest()
        self.engine.put(f"blobs/{digest}", data)
        self.engine.put(f"refs/{namespace}/{name}",
                        Ref(digest, len(data), self._mac(namespace, name, digest, len(data))).dumps())
        return digest

    def fetch(self, namespace: str, name: str) -> bytes | None:
        """The entry's bytes, None when there is none.  Raises Unusable (see the module
        docstring) or Unavailable."""
        raw = self.engine.get(f"refs/{namespace}/{name}")
        if raw is None:
            return None
        ref = Ref.loads(raw)
        if self.key is not None:
            if ref.mac is None:
                raise Unusable("it is not signed, and STABLEGUARDS_STORE_KEY is set")
            if not hmac.compare_digest(ref.mac, self._mac(namespace, name, ref.digest, ref.size) or ""):
                raise Unusable("its signature does not match STABLEGUARDS_STORE_KEY")
        data = self.engine.get(f"blobs/{ref.digest}")
        if data is None:
            raise Unusable(f"its bytes ({ref.digest[:12]}) are missing")
        actual = hashlib.sha256(data).hexdigest()
        if len(data) != ref.size or actual != ref.digest:
            raise Unusable(f"its bytes are corrupt or truncated ({len(data)} of {ref.size} bytes, digest "
                           f"{actual[:12]}, expected {ref.digest[:12]})")
        return data

    def has(self, namespace: str, name: str) -> bool:
        """Whether the entry has a record (whether it verifies is found when it is fetched)."""
        return self.engine.get(f"refs/{namespace}/{name}") is not None

    # Leases: while one process makes the entry ``namespace/name``, others wait for it.

    def claim(self, namespace: str, name: str, ttl_s: float) -> bool:
        """Take the entry's lease for this process if nobody holds it; it expires after
        ``ttl_s`` whatever happens to this process."""
        return self.engine.claim(f"leases/{namespace}/{name}", lease_owner(), ttl_s)

    def release(self, namespace: str, name: str) -> None:
        """Give the lease back, if this process still holds it."""
        self.engine.release(f"leases/{namespace}/{name}", lease_owner())

    def held(self, namespace: str, name: str) -> bool:
        return self.engine.held(f"leases/{namespace}/{name}")

    def wait_released(self, namespace: str, name: str, timeout_s: float, poll_s: float = 0.1) -> bool:
        """Wait until nobody holds the entry's lease (True: its holder saved the entry, gave
        up, or died and the lease expired), or ``timeout_s`` passes (False)."""
        deadline = time.monotonic() + timeout_s
        while self.held(namespace, name):
            if time.monotonic() >= deadline:
                return False
            time.sleep(poll_s)
        return True


LEASE_ENV = "STABLEGUARDS_STORE_LEASE_S"
DEFAULT_LEASE_S = 600.0
_TOKEN = uuid.uuid4().hex[:12]


def lease_seconds() -> float:
    """How long a lease lasts unless given back, and how long a process waits for the entry
    another one is compiling (``STABLEGUARDS_STORE_LEASE_S``; 600 s)."""
    try:
        return max(0.0, float(os.environ.get(LEASE_ENV, DEFAULT_LEASE_S)))
    except ValueError:
        return DEFAULT_LEASE_S


def lease_owner() -> str:
    """Who holds a lease: this host and process (a forked child is another owner)."""
    return f"{socket.gethostname()}:{os.getpid()}:{_TOKEN}"
