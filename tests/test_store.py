"""The shared store's protocol (stableguards.storage), on a directory and on a real redis-server:
entries by digest, verified and signed, atomic, with leases.  No torch here."""

from __future__ import annotations

import hashlib
import json
import os
import socket
import threading
import time

import pytest

from stableguards.storage import open_store
from stableguards.storage.content import ContentStore, Unusable
from stableguards.storage.engines import DirectoryEngine, RedisEngine, Unavailable


@pytest.fixture(params=["directory", "redis"])
def location(request, tmp_path):
    if request.param == "directory":
        return str(tmp_path / "store")
    url = request.getfixturevalue("redis_url")
    RedisEngine(url)._client.flushdb()
    return url


def test_an_entry_comes_back_whole(location):
    store = open_store(None, location, key="")
    digest = store.publish("ns", "a", b"payload")
    assert digest == hashlib.sha256(b"payload").hexdigest()
    assert store.fetch("ns", "a") == b"payload"
    assert store.fetch("ns", "absent") is None
    store.publish("ns", "a", b"second")
    assert store.fetch("ns", "a") == b"second"


def _corrupt(store: ContentStore, digest: str, data: bytes) -> None:
    store.engine.put(f"blobs/{digest}", data)


@pytest.mark.parametrize("damage", ["flipped", "truncated", "missing", "foreign record", "other format"])
def test_a_damaged_entry_is_refused_and_kept(location, damage):
    store = open_store(None, location, key="")
    digest = store.publish("ns", "a", b"x" * 100)
    if damage == "flipped":
        _corrupt(store, digest, b"y" + b"x" * 99)
    elif damage == "truncated":
        _corrupt(store, digest, b"x" * 50)
    elif damage == "missing":
        store.engine.put("refs/ns/a", store.engine.get("refs/ns/a").replace(digest.encode(), b"0" * 64))
    elif damage == "foreign record":
        store.engine.put("refs/ns/a", b"\x80\x04pickle")
    else:
        store.engine.put("refs/ns/a", json.dumps({"format": 99, "digest": digest}).encode())
    with pytest.raises(Unusable):
        store.fetch("ns", "a")
    assert store.engine.get("refs/ns/a") is not None  # nothing stored is removed
    store.publish("ns", "a", b"x" * 100)  # a fresh publish repairs it
    assert store.fetch("ns", "a") == b"x" * 100


def test_with_a_key_only_entries_signed_with_it_are_read(location):
    signed = open_store(None, location, key="k1")
    signed.publish("ns", "a", b"one")
    assert signed.fetch("ns", "a") == b"one"
    with pytest.raises(Unusable, match="signature"):
        open_store(None, location, key="k2").fetch("ns", "a")
    unsigned = open_store(None, location, key="")
    unsigned.publish("ns", "b", b"two")
    with pytest.raises(Unusable, match="not signed"):
        signed.fetch("ns", "b")
    # A signature binds the bytes to their name: a record copied to another name is refused.
    signed.engine.put("refs/ns/c", signed.engine.get("refs/ns/a"))
    with pytest.raises(Unusable, match="signature"):
        signed.fetch("ns", "c")
    # Bytes swapped under a signed record: their digest no longer matches.
    digest = json.loads(signed.engine.get("refs/ns/a"))["digest"]
    signed.engine.put(f"blobs/{digest}", b"evil")
    with pytest.raises(Unusable, match="corrupt"):
        signed.fetch("ns", "a")
    assert unsigned.fetch("ns", "b") == b"two"  # without a key the store is trusted like code


def _writer(location: str, index: int, rounds: int) -> None:
    store = open_store(None, location, key="k")
    for round_ in range(rounds):
        store.publish("ns", "shared", f"shared {index} {round_}".encode() * 1000)
        store.publish("ns", f"own-{index}", f"own {index} {round_}".encode() * 1000)


def test_eight_concurrent_writers_lose_nothing(location, processes):
    writers = [processes.Process(target=_writer, args=(location, i, 20)) for i in range(8)]
    for w in writers:
        w.start()
    reader = open_store(None, location, key="k")
    while any(w.is_alive() for w in writers):  # every read while they write is whole, or none
        data = reader.fetch("ns", "shared")
        assert data is None or data.startswith(b"shared ")
    for w in writers:
        w.join()
        assert w.exitcode == 0
    assert reader.fetch("ns", "shared").startswith(b"shared ")
    for i in range(8):
        assert reader.fetch("ns", f"own-{i}") == f"own {i} 19".encode() * 1000


def _killed_writer(location: str) -> None:
    store = open_store(None, location, key="k")
    for i in range(10**6):
        store.publish("ns", "victim", os.urandom(64) + str(i).encode() * 5000)


def test_a_writer_killed_mid_publish_leaves_a_whole_entry(location, processes):
    writer = processes.Process(target=_killed_writer, args=(location,))
    writer.start()
    store = open_store(None, location, key="k")
    deadline = time.monotonic() + 30
    while store.engine.get("refs/ns/victim") is None and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.3)
    writer.kill()
    writer.join()
    assert store.fetch("ns", "victim") is not None  # whole: it verified


def test_a_swap_happens_only_over_the_bytes_it_expects(location):
    engine = open_store(None, location, key="").engine
    assert not engine.swap("pgo/a.json", b"old", b"new")  # nothing there, something expected
    assert engine.swap("pgo/a.json", None, b"one") and engine.get("pgo/a.json") == b"one"
    assert not engine.swap("pgo/a.json", None, b"two")  # something there, nothing expected
    assert not engine.swap("pgo/a.json", b"on", b"two") and engine.get("pgo/a.json") == b"one"
    assert engine.swap("pgo/a.json", b"one", b"two") and engine.get("pgo/a.json") == b"two"
    engine.put("pgo/deeper/b.json", b"x")
    engine.put("pgo*/c.json", b"x")  # a glob character in a name matches only itself
    assert engine.names("pgo/") == ["pgo/a.json"]
    assert engine.swap("pgo/a.json", b"two", None) and engine.get("pgo/a.json") is None
    assert engine.names("pgo/") == []


def test_a_lease_is_held_by_one_and_given_back_only_by_its_holder(location):
    store = open_store(None, location, key="")
    engine = store.engine
    assert engine.claim("leases/x", b"a", 30) and engine.get("leases/x") == b"a"
    assert not engine.claim("leases/x", b"b", 30)
    engine.release("leases/x", b"b")  # not b's
    assert not engine.renew("leases/x", b"b", b"b2", 30) and engine.get("leases/x") == b"a"
    assert engine.renew("leases/x", b"a", b"a2", 30) and engine.get("leases/x") == b"a2"
    engine.release("leases/x", b"a2")
    assert engine.get("leases/x") is None and engine.claim("leases/x", b"b", 30)
    assert not engine.claim("leases/x", b"c", 30, replacing=b"other")  # not the lease found dead
    assert engine.claim("leases/x", b"c", 30, replacing=b"b") and engine.get("leases/x") == b"c"
    assert store.claim("ns", "y") and store.held("ns", "y")
    assert not store.claim("ns", "y")  # this process holds it already
    store.release("ns", "y")
    assert not store.held("ns", "y")


def test_waiting_ends_when_the_lease_goes_or_its_holder_stops_beating(location, monkeypatch):
    monkeypatch.setenv("STABLEGUARDS_STORE_LEASE_S", "0.6")
    holder, waiter = open_store(None, location, key=""), open_store(None, location, key="")
    assert holder.claim("ns", "e")
    threading.Timer(1.5, holder.release, ("ns", "e")).start()
    start, told = time.monotonic(), []
    assert waiter.wait("ns", "e", told.append, told.append) is None  # given back: nothing to replace
    assert 1.4 < time.monotonic() - start < 5 and len(told) == 1  # it beat past its 0.6 s all along
    assert holder.claim("ns", "f", renewed=False)  # a holder that died: no beat
    dead = holder.engine.get("leases/ns/f")
    start = time.monotonic()
    found = waiter.wait("ns", "f", told.append, told.append)
    assert found in (dead, None)  # None: Redis expired it first
    assert time.monotonic() - start < 3
    assert waiter.claim("ns", "f", replacing=found) and waiter.held("ns", "f")
    waiter.release("ns", "f")


def test_a_dead_directory_lease_goes_to_one_claimant(tmp_path):
    engine = DirectoryEngine(tmp_path)
    assert engine.claim("leases/x", b"dead", 30)
    winners = [owner for owner in (b"a", b"b", b"c") if engine.claim("leases/x", owner, 30, replacing=b"dead")]
    assert winners == [b"a"]


def test_a_late_claimant_never_removes_the_fresh_lease_another_made(tmp_path):
    """The interleaving two claimants of a dead lease can meet: b read the dead lease, a broke
    it and made its own, then b breaks what it read: a's fresh lease stays."""
    from stableguards.storage.engines import _break

    engine = DirectoryEngine(tmp_path)
    assert engine.claim("leases/x", b"dead", 30)
    assert engine.claim("leases/x", b"a", 30, replacing=b"dead")
    _break(engine, "leases/x", b"dead")
    assert engine.get("leases/x") == b"a" and not engine.claim("leases/x", b"b", 30, replacing=b"dead")
    assert not (tmp_path / "leases" / "x.break").exists()


def test_an_unreachable_redis_is_unavailable_quickly():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens here
    pytest.importorskip("redis")
    engine = RedisEngine(f"redis://127.0.0.1:{port}/0", timeout_s=0.5)
    start = time.monotonic()
    with pytest.raises(Unavailable):
        engine.get("refs/x")
    assert time.monotonic() - start < 5


def test_store_names_stay_inside_the_directory(tmp_path):
    with pytest.raises(ValueError):
        DirectoryEngine(tmp_path).get("../outside")


def test_an_entry_variant_is_what_its_folded_calls_return_in_this_process(monkeypatch):
    """warm_start.variants: the calls are stored, a loader calls them again; equal answers,
    equal variant; another answer (another rank), another variant."""
    import math

    from stableguards.warm_start import variants

    calls = variants.dumps([("math", "floor", (2.5,), ()), ("math", "floor", (2.5,), ()),
                            ("math", "copysign", (1, -2), ())])
    assert json.loads(calls) == [["math", "copysign", [1, -2], []], ["math", "floor", [2.5], []]]
    here = variants.variant(calls)
    assert variants.variant(calls) == here
    monkeypatch.setattr(math, "floor", lambda x: 7)
    assert variants.variant(calls) != here
    with pytest.raises(KeyError):
        variants.variant(variants.dumps([("no_such_module", "f", (), ())]))
