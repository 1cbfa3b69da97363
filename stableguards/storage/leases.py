"""Leases: while one process compiles an entry, others wait for it, but never for a holder
that died, and never on a lease they cannot trust.

A lease is a small record: who holds it, how long it lives without a renewal (``ttl_s``) and a
beat count, signed like an entry's record when ``STABLEGUARDS_STORE_KEY`` is set (over the
lease's name too, so a lease cannot be moved to another entry).  Its holder renews it from a
daemon thread (``Heartbeat``) every sixth of its ``ttl_s``, each renewal a new beat.

A reader judges a lease by what it sees change, on its own clock: one whose bytes stayed the
same for its ``ttl_s`` (at most ``STABLEGUARDS_STORE_LEASE_S``) has lost its holder, whatever
clock wrote it and whatever it says; a replayed or forged lease never beats, so it holds
nobody longer than that.  With a key, an unsigned or foreign lease is ignored.  A holder
that beats but never finishes holds a reader at most ``MAX_WAIT_S``.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import socket
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass, replace

LEASE_ENV = "STABLEGUARDS_STORE_LEASE_S"
DEFAULT_LEASE_S = 30.0
# The most a reader waits for a holder that is alive (it beats): a compile's own time at most.
MAX_WAIT_S = 600.0
# A lease, like an entry's record, is small; anything larger is not one (``engines.Refused``).
RECORD_BYTES = 4096
FORMAT = 1
_TOKEN = uuid.uuid4().hex[:12]


class Ignored(Exception):
    """A lease that is not one this process may honour: the reason says why."""


def lease_seconds() -> float:
    """How long a lease lives after its holder's last renewal (``STABLEGUARDS_STORE_LEASE_S``;
    30 s): a reader waits at most that long past a dead holder's last heartbeat."""
    try:
        return max(0.0, float(os.environ.get(LEASE_ENV, DEFAULT_LEASE_S)))
    except ValueError:
        return DEFAULT_LEASE_S


def lease_owner() -> str:
    """Who holds a lease: this host and process (a forked child is another owner)."""
    return f"{socket.gethostname()}:{os.getpid()}:{_TOKEN}"


@dataclass(frozen=True)
class Lease:
    owner: str
    ttl_s: float
    beat: int = 0
    mac: str | None = None

    def signed(self, key: bytes | None, name: str) -> Lease:
        return replace(self, mac=_mac(key, name, self.owner, self.ttl_s, self.beat))

    def next_beat(self, key: bytes | None, name: str) -> Lease:
        return replace(self, beat=self.beat + 1).signed(key, name)

    def dumps(self) -> bytes:
        record = {"format": FORMAT, "owner": self.owner, "ttl_s": self.ttl_s, "beat": self.beat}
        if self.mac is not None:
            record["mac"] = self.mac
        return json.dumps(record, sort_keys=True).encode()

    @classmethod
    def loads(cls, raw: bytes, key: bytes | None, name: str) -> Lease:
        """The lease in ``raw``, stored as ``name``.  Raises Ignored."""
        try:
            record = json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, ValueError):
            raise Ignored("it is not a stableguards lease") from None
        if not isinstance(record, dict) or record.get("format") != FORMAT:
            raise Ignored("it is a lease of another format")
        owner, ttl_s, beat, mac = (record.get(k) for k in ("owner", "ttl_s", "beat", "mac"))
        if not (isinstance(owner, str) and isinstance(ttl_s, (int, float)) and isinstance(beat, int)
                and isinstance(mac, (str, type(None)))):
            raise Ignored("the lease is incomplete")
        if key is not None:
            if mac is None:
                raise Ignored("the lease is not signed, and STABLEGUARDS_STORE_KEY is set")
            if not hmac.compare_digest(mac, _mac(key, name, owner, float(ttl_s), beat) or ""):
                raise Ignored("the lease's signature does not match STABLEGUARDS_STORE_KEY")
        return cls(owner, float(ttl_s), beat, mac)


def _mac(key: bytes | None, name: str, owner: str, ttl_s: float, beat: int) -> str | None:
    if key is None:
        return None
    return hmac.new(key, json.dumps([name, owner, ttl_s, beat]).encode(), hashlib.sha256).hexdigest()


class Heartbeat:
    """Renews the leases this process holds, from one daemon thread, every sixth of the lease
    period: each renewal is a short store write, so the thread never holds the GIL for long.
    A renewal that finds its lease gone (another process found it dead) stops renewing it; one
    that fails (the store unreachable) tries again at the next beat."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._renewals: dict[object, Callable[[], bool]] = {}
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        os.register_at_fork(after_in_child=self._forget)

    def hold(self, key: object, renew: Callable[[], bool]) -> None:
        with self._lock:
            self._renewals[key] = renew
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="stableguards-lease-heartbeat", daemon=True)
                self._thread.start()
        self._wake.set()  # a beat now, and the period of the lease period set now

    def drop(self, key: object) -> None:
        with self._lock:
            self._renewals.pop(key, None)

    def _run(self) -> None:
        while True:
            self._wake.wait(max(0.05, lease_seconds() / 6))
            self._wake.clear()
            with self._lock:
                renewals = list(self._renewals.items())
            for key, renew in renewals:
                try:
                    alive = renew()
                except Exception:  # noqa: BLE001 - the store unreachable: try again at the next beat
                    alive = True
                if not alive:
                    self.drop(key)

    def _forget(self) -> None:
        """A forked child holds none of its parent's leases, and has no thread yet."""
        self._lock = threading.Lock()
        self._renewals = {}
        self._wake = threading.Event()
        self._thread = None


HEARTBEAT = Heartbeat()
