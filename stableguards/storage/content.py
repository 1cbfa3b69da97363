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
  compiles as usual); nothing stored is removed;
* every read is bounded before anything is parsed: a record to ``RECORD_BYTES``, checked
  before its signature is, then the bytes to the size the record states
  (``engines.Refused`` for anything else, a link or a FIFO included: ``Unusable`` too).

The HMAC binds bytes to a name: whoever can write the store but has no key
cannot make any reader load bytes of their choosing under a name.  Without a
key the store must be trusted like code (entries are pickles).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from stableguards.storage import messages
from stableguards.storage.engines import Engine, Refused
from stableguards.storage.leases import (HEARTBEAT, MAX_WAIT_S, RECORD_BYTES, Ignored, Lease, lease_owner,
                                         lease_seconds)

FORMAT = 1
_DIGEST = re.compile(r"[0-9a-f]{64}")  # a SHA-256: the only blob name a record may point at
# A wait on another process's lease longer than this is said, once, naming the holder.
SLOW_WAIT_S = 5.0


class Unusable(Exception):
    """A stored entry that must not be used: the reason says why, ``cause`` names its kind
    (one warning per cause and store: ``storage.messages``)."""

    def __init__(self, reason: str, cause: str) -> None:
        super().__init__(reason)
        self.cause = cause


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
            raise Unusable("its record is not a stableguards store record", "foreign") from None
        if not isinstance(record, dict) or record.get("format") != FORMAT:
            raise Unusable("its record is of another format", "foreign")
        digest, size, mac = record.get("digest"), record.get("size"), record.get("mac")
        if not (isinstance(digest, str) and _DIGEST.fullmatch(digest) and isinstance(size, int) and size >= 0
                and isinstance(mac, (str, type(None)))):
            raise Unusable("its record is incomplete", "foreign")
        return cls(digest, size, mac)


class ContentStore:
    """Named entries over ``engine``; signed and checked with ``key`` when there is one."""

    def __init__(self, engine: Engine, key: bytes | None = None) -> None:
        self.engine = engine
        self.key = key
        self._lock = threading.Lock()  # the heartbeat thread renews what the compiling thread holds
        self._leases: dict[str, tuple[bytes, Lease]] = {}

    def describe(self) -> str:
        return self.engine.describe()

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
        raw = self._get(f"refs/{namespace}/{name}", RECORD_BYTES, oversize="foreign")
        if raw is None:
            return None
        ref = Ref.loads(raw)
        if self.key is not None:
            if ref.mac is None:
                raise Unusable("it is not signed, and STABLEGUARDS_STORE_KEY is set", "unsigned")
            if not hmac.compare_digest(ref.mac, self._mac(namespace, name, ref.digest, ref.size) or ""):
                raise Unusable("its signature does not match STABLEGUARDS_STORE_KEY", "signed with another key")
        data = self._get(f"blobs/{ref.digest}", ref.size, oversize="corrupt")
        if data is None:
            raise Unusable(f"its bytes ({ref.digest[:12]}) are missing", "missing")
        actual = hashlib.sha256(data).hexdigest()
        if len(data) != ref.size or actual != ref.digest:
            raise Unusable(f"its bytes are corrupt or truncated ({len(data)} of {ref.size} bytes, digest "
                           f"{actual[:12]}, expected {ref.digest[:12]})", "corrupt")
        return data

    def _get(self, name: str, limit: int, oversize: str) -> bytes | None:
        """At most ``limit`` bytes under ``name``; what is longer is Unusable for the cause
        ``oversize``, what the store never writes (a link, a FIFO) for "not a store file"."""
        try:
            return self.engine.get(name, limit)
        except Refused as error:
            if error.oversize:
                raise Unusable(f"{oversize}: {error}", oversize) from None
            raise Unusable(str(error), "not a store file") from None

    def has(self, namespace: str, name: str) -> bool:
        """Whether the entry has a record (whether it verifies is found when it is fetched)."""
        return self._get(f"refs/{namespace}/{name}", RECORD_BYTES, "foreign") is not None

    # Leases: while one process makes the entry ``namespace/name``, others wait for it
    # (``storage.leases``: signed, renewed by a heartbeat, judged dead by whoever reads one).

    def claim(self, namespace: str, name: str, ttl_s: float | None = None, replacing: bytes | None = None,
              renewed: bool = True) -> bool:
        """Take the entry's lease for this process if nobody holds one, or the one there is still
        ``replacing`` (one ``wait`` found dead or ignored).  It lives ``ttl_s`` (the lease period)
        past its last renewal; ``renewed``: this process's heartbeat renews it until released."""
        lease_name, ttl_s = f"leases/{namespace}/{name}", lease_seconds() if ttl_s is None else ttl_s
        lease = Lease(lease_owner(), ttl_s).signed(self.key, lease_name)
        raw = lease.dumps()
        if not self.engine.claim(lease_name, raw, ttl_s, replacing):
            return False
        with self._lock:
            self._leases[lease_name] = (raw, lease)
        if renewed:
            HEARTBEAT.hold((id(self), lease_name), lambda: self._renew(lease_name))
        return True

    def _renew(self, lease_name: str) -> bool:
        """One heartbeat: the lease replaced by its next beat; False once it is no longer ours."""
        with self._lock:
            held = self._leases.get(lease_name)
        if held is None:
            return False
        lease = held[1].next_beat(self.key, lease_name)
        raw = lease.dumps()
        with self._lock:
            if self._leases.get(lease_name) != held:  # released meanwhile
                return False
            if not self.engine.renew(lease_name, held[0], raw, lease.ttl_s):
                self._leases.pop(lease_name, None)
                return False
            self._leases[lease_name] = (raw, lease)
        return True

    def release(self, namespace: str, name: str) -> None:
        """Give the lease back, if this process still holds it."""
        lease_name = f"leases/{namespace}/{name}"
        HEARTBEAT.drop((id(self), lease_name))
        with self._lock:
            held = self._leases.pop(lease_name, None)
        if held is not None:
            self.engine.release(lease_name, held[0])

    def held(self, namespace: str, name: str) -> bool:
        """Whether a lease this process may honour is on the entry (whether its holder is alive
        only ``wait`` tells)."""
        return self._lease(f"leases/{namespace}/{name}")[1] is not None

    def _lease(self, lease_name: str) -> tuple[bytes | None, Lease | None]:
        """The lease's bytes and the lease; bytes and None for one to ignore (said once per
        cause); (None, None) for none, or for what is not a lease at all."""
        try:
            raw = self.engine.get(lease_name, RECORD_BYTES)
        except Refused as error:
            messages.warn("a lease was ignored", self.describe(), Unusable(str(error), "not a store file"))
            return None, None
        if raw is None:
            return None, None
        try:
            return raw, Lease.loads(raw, self.key, lease_name)
        except Ignored as error:
            messages.warn("a lease was ignored", self.describe(), Unusable(str(error), "lease"))
            return raw, None

    def wait(self, namespace: str, name: str, waiting: Callable[[str], None],
             slow: Callable[[str], None], poll_s: float = 0.1) -> bytes | None:
        """Wait while another process holds a live lease on the entry: until it is given back,
        or unchanged for its ``ttl_s`` (its holder stopped beating), or ``MAX_WAIT_S``.
        ``waiting`` is told the holder when a wait starts, ``slow`` once it passes
        ``SLOW_WAIT_S``.  Returns the bytes of a lease that may be replaced (dead, or one to
        ignore), else None.  A caller never waits for a lease it holds itself."""
        lease_name, bound = f"leases/{namespace}/{name}", lease_seconds()
        start = changed = time.monotonic()
        last: bytes | None = None
        said = False
        while True:
            raw, lease = self._lease(lease_name)
            if lease is None:
                return raw
            now = time.monotonic()
            if raw != last:
                if last is None:
                    waiting(lease.owner)
                last, changed = raw, now
            elif now - changed >= min(lease.ttl_s, bound):
                return raw
            if now - start >= MAX_WAIT_S:
                return None
            if now - start >= SLOW_WAIT_S and not said:
                slow(lease.owner)
                said = True
            time.sleep(poll_s)
