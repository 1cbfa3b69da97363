"""The store fault campaign's grammar: what whoever can write the store (or the machine) does
to it, drawn by hypothesis, and how each fault is made (tests/test_store_campaign.py).

A plain case is a sequence of steps over a few entries of one store (a directory or Redis),
signed with a key: writers publish (in processes of their own; some killed mid-publish, some
refused by a read-only directory or a full disk), faults are made on an entry's record, blob or
lease, Redis stops and starts, after a publish of every entry.  After each step a reader fetches every entry, and waits on
the lease of the entry a step touched.  A compiled case is a set of faults
made on what a compiled training step left in the store.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import socket
from dataclasses import dataclass
from pathlib import Path

from hypothesis import strategies as st

from stableguards.storage.content import Ref
from stableguards.storage.engines import Unavailable
from stableguards.storage.leases import Lease

ENTRIES = 3
KEY = b"campaign-key"
# Faults on bytes (a record's or a blob's), on what sits at a name (a directory's only: Redis
# holds values), on a record's signature, and on leases.
BYTES = ("flip", "truncate", "extend")
NODES = ("fifo", "device", "link out", "directory", "socket")
RECORDS = ("unsigned", "another key", "another name's", "an older one")
LEASES = ("forged", "replayed", "far future", "garbage", "dead holder")
SECRET = b"what a file outside the store holds"


@dataclass(frozen=True)
class Step:
    op: str  # publish, killed publish, refused publish, fault, outage
    entry: int
    fault: str = ""
    target: str = ""  # record, blob, lease


@dataclass(frozen=True)
class Case:
    name: str
    engine: str  # directory, redis
    steps: tuple[Step, ...]


def _steps(engine: str) -> st.SearchStrategy[tuple[Step, ...]]:
    entry = st.integers(0, ENTRIES - 1)
    faults = [st.builds(Step, st.just("fault"), entry, st.sampled_from(BYTES), st.sampled_from(("record", "blob"))),
              st.builds(Step, st.just("fault"), entry, st.sampled_from(RECORDS), st.just("record")),
              st.builds(Step, st.just("fault"), entry, st.sampled_from(LEASES), st.just("lease"))]
    ops = ["publish", "killed publish"]
    if engine == "directory":
        faults.append(st.builds(Step, st.just("fault"), entry, st.sampled_from(NODES),
                                st.sampled_from(("record", "blob", "lease"))))
        ops.append("refused publish")
    else:
        ops.append("outage")
    step = st.one_of(st.builds(Step, st.sampled_from(ops), entry), *faults)
    return st.lists(step, min_size=6, max_size=16).map(tuple)


def cases(engine: str) -> st.SearchStrategy[Case]:
    return st.builds(Case, st.just(""), st.just(engine), _steps(engine))


def name_of(entry: int) -> str:
    return f"entry{entry}"


def make_fault(engine, entry: int, fault: str, target: str, tmp: Path, older: dict[int, bytes]) -> None:
    """Make ``fault`` on ``target`` of ``entry`` in the store over ``engine`` (``older``: a
    record each entry had before its last publish, for a replay)."""
    record_name = f"refs/ns/{name_of(entry)}"
    if target == "lease":
        lease_name = f"leases/ns/{name_of(entry)}"
        lease = {"forged": Lease("forger:1:x", 600).dumps(),
                 "replayed": Lease("gone:1:x", 1).signed(KEY, lease_name).dumps(),
                 "dead holder": Lease("dead:1:x", 1, 7).signed(KEY, lease_name).dumps(),
                 "far future": json.dumps({"owner": "forger", "expires": 1e12}).encode(),
                 "garbage": os.urandom(64)}.get(fault)
        if lease is None:  # what the store never writes, at the lease's name
            plant(Path(engine.directory), lease_name, fault, tmp)
        else:
            _put(engine, lease_name, lease)
        return
    name = record_name
    if target == "blob":
        try:
            name = f"blobs/{json.loads(_current(engine, record_name))['digest']}"
        except (TypeError, ValueError, KeyError):  # no record, or one an earlier fault damaged
            return
    if fault in NODES:
        plant(Path(engine.directory), name, fault, tmp)
        return
    current = _current(engine, name)
    if fault in BYTES:
        if current is None:
            return
        changed = {"flip": bytes([current[0] ^ 1]) + current[1:], "truncate": current[: len(current) // 2],
                   "extend": current + b"x" * 1000}[fault]
        _put(engine, name, changed)
    elif fault == "another name's":
        other = _current(engine, f"refs/ns/{name_of((entry + 1) % ENTRIES)}")
        if other is not None:
            _put(engine, record_name, other)
    elif fault == "an older one":
        if entry in older:
            _put(engine, record_name, older[entry])
    else:  # a record over bytes of the forger's choosing
        data = b"forged entry"
        digest = hashlib.sha256(data).hexdigest()
        _put(engine, f"blobs/{digest}", data)
        mac = None
        if fault == "another key":
            message = json.dumps(["ns", name_of(entry), digest, len(data)]).encode()
            mac = hmac.new(b"another key", message, hashlib.sha256).hexdigest()
        _put(engine, record_name, Ref(digest, len(data), mac).dumps())


def _put(engine, name: str, data: bytes) -> None:
    """A fault's write; none where an earlier fault left what cannot be replaced (a directory)."""
    try:
        engine.put(name, data)
    except Unavailable:
        pass


def _current(engine, name: str) -> bytes | None:
    try:
        return engine.get(name, 1 << 20)
    except Exception:  # noqa: BLE001 - a fault made before: nothing to change
        return None


def plant(store_dir: Path, name: str, kind: str, tmp: Path) -> None:
    """Put what the store never writes at ``name``: a FIFO, a link to a device or out of the
    store, a directory, a socket."""
    path = store_dir / name
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.is_dir() and not path.is_symlink():
        return
    path.unlink(missing_ok=True)
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "device":
        path.symlink_to("/dev/zero")
    elif kind == "link out":
        outside = tmp / "outside"
        outside.write_bytes(SECRET)
        path.symlink_to(outside)
    elif kind == "directory":
        path.mkdir()
    else:
        here = os.getcwd()
        os.chdir(path.parent)  # a socket's path must be short
        try:
            with socket.socket(socket.AF_UNIX) as s:
                s.bind(path.name)
        finally:
            os.chdir(here)


# A compiled case: faults made on what a compiled training step left in a directory store (a
# directory planted at a name is left out: nothing can be saved there again).
STORED = ("warm_start", "fx_graph", "aot_autograd", "kernel_binary", "pgo")
COMPILED_FAULTS = BYTES + RECORDS[:2] + ("fifo", "link out", "device", "lease")


@dataclass(frozen=True)
class CompiledCase:
    name: str
    faults: tuple[tuple[str, str, int], ...]  # (fault, namespace, which of its names)


def compiled_cases() -> st.SearchStrategy[CompiledCase]:
    fault = st.tuples(st.sampled_from(COMPILED_FAULTS), st.sampled_from(STORED), st.integers(0, 50))
    return st.builds(CompiledCase, st.just(""), st.lists(fault, min_size=1, max_size=4).map(tuple))
