"""Whoever can write the store cannot make a reader hang, grow or wait for nobody; what they
put there is one warning per cause and a miss.  Plain: no torch compile."""

from __future__ import annotations

import json
import logging
import os
import pickle
import subprocess
import sys
import threading
import time

import pytest
from _store_campaign import SECRET, plant

from stableguards.events import EVENTS
from stableguards.keys.ledger import KeyRecord, SharedKeyLedger
from stableguards.storage import configured, content, engines, open_store, trust
from stableguards.storage.content import Unusable
from stableguards.storage.engines import DirectoryEngine, RedisEngine
from stableguards.storage.leases import Lease
from stableguards.store.pickled import artifact_class, top_class

def _within(seconds: float, fn):
    """``fn()``'s result, failing the test if it takes longer (a read that blocks)."""
    result: list = []
    thread = threading.Thread(target=lambda: result.append(_capture(fn)), daemon=True)
    thread.start()
    thread.join(seconds)
    assert result, f"blocked for more than {seconds} s"
    if isinstance(result[0], BaseException):
        raise result[0]
    return result[0]


def _capture(fn):
    try:
        return fn()
    except BaseException as error:  # noqa: BLE001 - handed back to the test's thread
        return error


@pytest.mark.parametrize("kind", ["fifo", "device", "link out", "directory", "socket"])
@pytest.mark.parametrize("where", ["record", "blob", "lease"])
def test_what_the_store_never_writes_is_never_read(tmp_path, kind, where, caplog):
    store = open_store(None, str(tmp_path / "store"), key="k")
    digest = store.publish("ns", "a", b"entry")
    name = {"record": "refs/ns/a", "blob": f"blobs/{digest}", "lease": "leases/ns/a"}[where]
    plant(tmp_path / "store", name, kind, tmp_path)
    with caplog.at_level(logging.WARNING):
        if where == "lease":
            assert _within(5, lambda: store.wait("ns", "a", _never, _never)) is None  # nobody to wait for
            assert not store.held("ns", "a")
        else:
            with pytest.raises(Unusable) as refused:
                _within(5, lambda: store.fetch("ns", "a"))
            assert refused.value.cause == "not a store file" and SECRET.decode() not in str(refused.value)
    assert SECRET.decode() not in caplog.text


def test_a_record_points_only_at_a_blob(tmp_path):
    store = open_store(None, str(tmp_path / "store"), key="")
    for digest in ("../../outside", "blobs/" + "0" * 64, "A" * 64):
        store.engine.put("refs/ns/a", json.dumps({"format": 1, "digest": digest, "size": 3}).encode())
        with pytest.raises(Unusable, match="incomplete"):
            store.fetch("ns", "a")


def test_reads_stop_at_their_bound(tmp_path, monkeypatch):
    store = open_store(None, str(tmp_path / "store"), key="k")
    digest = store.publish("ns", "a", b"abc")
    read: list[str] = []  # the files read
    real_read = os.read
    monkeypatch.setattr(engines.os, "read", lambda fd, n: read.append(os.readlink(f"/proc/self/fd/{fd}"))
                        or real_read(fd, n))
    (tmp_path / "store" / "blobs" / digest).write_bytes(b"abc" * 10_000_000)  # 30 MB behind a 3-byte record
    with pytest.raises(Unusable, match="corrupt"):
        store.fetch("ns", "a")
    blob, record = tmp_path / "store" / "blobs" / digest, tmp_path / "store" / "refs" / "ns" / "a"
    assert str(blob) not in read  # refused by its size: not a byte read
    record.write_bytes(b" " * 100_000 + b"{}")  # a 100 KB "record"
    read.clear()
    with pytest.raises(Unusable, match="foreign"):
        store.fetch("ns", "a")
    assert str(record) not in read


def test_redis_reads_stop_at_their_bound(redis_url):
    RedisEngine(redis_url)._client.flushdb()
    store = open_store(None, redis_url, key="k")
    digest = store.publish("ns", "a", b"abc")
    store.engine.put(f"blobs/{digest}", b"abc" * 1_000_000)
    with pytest.raises(Unusable, match="corrupt"):
        store.fetch("ns", "a")
    store.engine._client.delete(RedisEngine.PREFIX + "refs/ns/a")
    store.engine._client.rpush(RedisEngine.PREFIX + "refs/ns/a", b"x")  # not a string value
    with pytest.raises(Unusable) as refused:
        store.fetch("ns", "a")
    assert refused.value.cause == "not a store file"


@pytest.mark.parametrize("forged", ["unsigned", "another key", "another entry's", "old format, far future"])
def test_with_a_key_a_lease_not_signed_for_its_entry_holds_nobody(tmp_path, forged):
    store = open_store(None, str(tmp_path / "store"), key="k")
    lease = {"unsigned": Lease("forger:1:x", 600).dumps(),
             "another key": Lease("forger:1:x", 600).signed(b"other", "leases/ns/a").dumps(),
             "another entry's": Lease("forger:1:x", 600).signed(b"k", "leases/ns/b").dumps(),
             "old format, far future": json.dumps({"owner": "forger", "expires": 1e12}).encode()}[forged]
    store.engine.put("leases/ns/a", lease)
    assert not store.held("ns", "a")
    start = time.monotonic()
    assert store.wait("ns", "a", _never, _never) == lease  # not waited for: replaced by the next claim
    assert time.monotonic() - start < 1
    assert store.claim("ns", "a", replacing=lease) and store.held("ns", "a")
    store.release("ns", "a")


def test_a_replayed_lease_holds_a_reader_one_lease_period(tmp_path, monkeypatch):
    monkeypatch.setenv("STABLEGUARDS_STORE_LEASE_S", "1")
    store = open_store(None, str(tmp_path / "store"), key="k")
    assert store.claim("ns", "a")
    replayed = store.engine.get("leases/ns/a")  # a valid lease, copied by someone who can write the store
    store.release("ns", "a")
    store.engine.put("leases/ns/a", replayed)
    waiter, told = open_store(None, str(tmp_path / "store"), key="k"), []
    start = time.monotonic()
    assert waiter.wait("ns", "a", told.append, _never) == replayed
    assert 0.9 < time.monotonic() - start < 3 and len(told) == 1  # it never beat


HOLDER = """
import sys, time
from stableguards.storage import open_store
store = open_store(None, sys.argv[1], key="k")
assert store.claim("ns", "a")
print("held", flush=True)
time.sleep(600)
"""


def test_a_holder_that_dies_is_given_up_on_within_seconds(tmp_path, monkeypatch):
    monkeypatch.setenv("STABLEGUARDS_STORE_LEASE_S", "1")
    location = str(tmp_path / "store")
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, location], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        threading.Timer(3, holder.kill).start()
        waiter = open_store(None, location, key="k")
        start = time.monotonic()
        found = waiter.wait("ns", "a", lambda by: None, lambda by: None)
        waited = time.monotonic() - start
    finally:
        holder.kill()
        holder.wait()
    assert found is not None and 2.8 < waited < 5.5  # held while it beat (3 s > 1 s), then 1 s more


def test_a_long_wait_is_said_once_naming_the_holder(tmp_path, monkeypatch, caplog):
    from stableguards.warm_start import messages

    monkeypatch.setattr(content, "SLOW_WAIT_S", 0.2)
    holder, waiter = (open_store(None, str(tmp_path / "store"), key="") for _ in range(2))
    assert holder.claim("ns", "a")
    threading.Timer(1.0, holder.release, ("ns", "a")).start()
    with caplog.at_level(logging.WARNING):
        waiter.wait("ns", "a", lambda by: None, lambda by: messages.waiting_long("f (f.py:1)", "here", by))
    said = [r.getMessage() for r in caplog.records if "waiting for" in r.getMessage()]
    assert len(said) == 1 and content.lease_owner() in said[0] and "f (f.py:1)" in said[0]


def test_one_warning_per_cause_and_store(caplog):
    from stableguards.storage import messages

    with caplog.at_level(logging.WARNING):
        for what in ("an entry could not be read", "a profile could not be saved", "an entry could not be read"):
            messages.warn(what, "redis://h/0", engines.Unavailable("down"))
        messages.warn("an entry could not be read", "redis://h/0", Unusable("bad signature", "signed with another key"))
        messages.warn("an entry could not be read", "/other", engines.Unavailable("down"))
    assert len(caplog.records) == 3


def test_a_shared_store_without_a_key_is_said_once(tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "cache"))
    with caplog.at_level(logging.WARNING):
        for location, key in ((tmp_path / "cache" / "mine", ""), (tmp_path / "shared", "k")):
            monkeypatch.setenv("STABLEGUARDS_STORE", str(location))
            monkeypatch.setenv("STABLEGUARDS_STORE_KEY", key)
            configured(None)
        assert not caplog.records  # under the user's own cache dir, or signed: nothing to say
        monkeypatch.setenv("STABLEGUARDS_STORE_KEY", "")
        for _ in range(2):
            configured(None)
    assert len(caplog.records) == 1 and "without STABLEGUARDS_STORE_KEY" in caplog.records[0].getMessage()


def test_a_store_others_can_write_is_said(tmp_path, monkeypatch, caplog):
    store_dir = tmp_path / "cache" / "store"
    (store_dir / "refs").mkdir(parents=True)
    assert trust.writable_by_others(store_dir) is None
    os.chmod(store_dir / "refs", 0o777)
    assert trust.writable_by_others(store_dir) == store_dir / "refs"
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("STABLEGUARDS_STORE", str(store_dir))
    monkeypatch.setenv("STABLEGUARDS_STORE_KEY", "k")
    with caplog.at_level(logging.WARNING):
        configured(None)
    assert len(caplog.records) == 1 and "chmod go-w" in caplog.records[0].getMessage()


def test_a_shared_ledger_record_of_another_shape_is_skipped(tmp_path):
    engine = DirectoryEngine(tmp_path)
    ledger = SharedKeyLedger(engine)
    ledger.record(KeyRecord.from_debug_lines("good", ["[abc] gm: graph"]))
    engine.put("fx_keys/bad", json.dumps({"key": "bad", "components": ["not", "a", "dict"]}).encode())
    engine.put(SharedKeyLedger.RECENT, json.dumps(["bad", "good"]).encode())
    assert [r.key for r in ledger.recent()] == ["good"]


class _Entry:
    pass


def test_the_class_a_pickle_builds_is_read_without_running_it():
    for protocol in range(pickle.HIGHEST_PROTOCOL + 1):
        assert top_class(pickle.dumps(_Entry(), protocol=protocol)) in {
            (__name__, "_Entry"), ("copy_reg", "_reconstructor")}  # protocols 0 and 1: via copyreg
        assert top_class(pickle.dumps(42, protocol=protocol)) is None
    assert top_class(b"\x80\x05garbage") is None
    artifact = json.dumps({"data": __import__("base64").b64encode(pickle.dumps(_Entry())).decode()}).encode()
    assert artifact_class(artifact) == (__name__, "_Entry")
    assert artifact_class(b"[1]") is None and artifact_class(b'{"data": "!"}') is None


def _never(*args: object) -> None:
    raise AssertionError("not expected")


@pytest.fixture(autouse=True)
def _quiet_events():
    EVENTS.reset()
    yield
