"""Profile stores: round trips, merges, concurrent writers, and every kind of bad input."""

from __future__ import annotations

import json
import logging
import socket
import threading
from pathlib import Path

import pytest

from stableguards.profiles.profile import DYNAMIC, CodeKey, Profile, SourceEntry, specialized, static
from stableguards.profiles.store import EngineStore, encode
from stableguards.storage import redis_engine
from stableguards.storage import engines
from stableguards.storage.engines import DirectoryEngine

CODE = CodeKey("0badc0de", 10, "f", None, "train.py")


def profile_of(*names: str, code: CodeKey = CODE) -> Profile:
    return Profile({code: {n: SourceEntry(DYNAMIC, (DYNAMIC, static(3)), (static(3), static(1)))
                           for n in names}})


def dir_profiles(directory) -> EngineStore:
    """A directory of profile files, as ``--dir`` names one."""
    return EngineStore(DirectoryEngine(directory), prefix="")


def redis_profiles(url: str) -> EngineStore:
    return EngineStore(redis_engine(url))


def path_of(store: EngineStore, key: str) -> Path:
    return store.engine.directory / store.name(key)


def warnings_of(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "stableguards"]


# --- local directory ----------------------------------------------------------


def test_local_round_trip_and_merge(tmp_path):
    store = dir_profiles(tmp_path)
    assert store.read("job") is None
    store.merge_write("job", profile_of("L['x']"))
    store.merge_write("job", profile_of("L['y']"))
    assert store.read("job") == profile_of("L['x']", "L['y']")
    assert store.keys() == ["job"]
    assert store.clear("job") and store.read("job") is None
    assert sorted(p.name for p in tmp_path.iterdir()) == ["job.json.lock"]  # nothing else left behind


def test_local_profile_is_readable_json(tmp_path):
    store = dir_profiles(tmp_path)
    store.merge_write("job:rank0", profile_of("L['x']"))
    data = json.loads(path_of(store, "job:rank0").read_text())
    assert data["format"] == "stableguards-pgo" and data["version"] == 1
    assert data["frames"][0]["sources"]["L['x']"]["size"] == ["dynamic", {"static": 3}]


BAD_CONTENT = {
    "truncated": lambda good: good[: len(good) // 2],
    "garbage": lambda good: b"\x80\x04\x95 not json \xff",
    "wrong schema": lambda good: json.dumps({"format": "stableguards-pgo", "version": 1,
                                             "frames": [{"code": 1}]}).encode(),
    "a pickle": lambda good: b"\x80\x04\x95\x0b\x00\x00\x00\x00\x00\x00\x00}\x94.",
}


@pytest.mark.parametrize("kind", sorted(BAD_CONTENT))
def test_bad_local_profile_warns_once_moves_aside_and_is_replaced(tmp_path, caplog, kind):
    store = dir_profiles(tmp_path)
    path = path_of(store, "job")
    bad = BAD_CONTENT[kind](encode(profile_of("L['x']")))
    path.write_bytes(bad)
    with caplog.at_level(logging.WARNING, logger="stableguards"):
        assert store.read("job") is None
        assert store.read("job") is None
    assert len(warnings_of(caplog)) == 1 and "moved it to" in warnings_of(caplog)[0]
    aside = [p for p in tmp_path.iterdir() if ".bad-" in p.name]
    assert len(aside) == 1 and aside[0].read_bytes() == bad  # kept, byte for byte
    store.merge_write("job", profile_of("L['y']"))
    assert store.read("job") == profile_of("L['y']")
    assert store.keys() == ["job"]


def test_future_version_is_left_untouched(tmp_path, caplog):
    store = dir_profiles(tmp_path)
    future = json.dumps({"format": "stableguards-pgo", "version": 99, "frames": "new"}).encode()
    path_of(store, "job").write_bytes(future)
    with caplog.at_level(logging.WARNING, logger="stableguards"):
        assert store.read("job") is None
        assert store.merge_write("job", profile_of("L['x']")) is None
    assert path_of(store, "job").read_bytes() == future
    assert len(warnings_of(caplog)) == 1 and "newer stableguards" in warnings_of(caplog)[0]


def test_directory_where_the_file_should_be(tmp_path, caplog):
    store = dir_profiles(tmp_path)
    path_of(store, "job").mkdir(parents=True)
    with caplog.at_level(logging.WARNING, logger="stableguards"):
        assert store.read("job") is None
        assert store.merge_write("job", profile_of("L['x']")) is None
    assert path_of(store, "job").is_dir()
    assert len(warnings_of(caplog)) == 1 and "not a regular file" in warnings_of(caplog)[0]


def test_unreadable_file_is_left_untouched(tmp_path, caplog, monkeypatch):
    store = dir_profiles(tmp_path)
    store.merge_write("job", profile_of("L['x']"))
    before = path_of(store, "job").read_bytes()
    real_read = engines._read

    def read(directory, name, limit):  # chmod 000 does not stop root, so refuse like the kernel would
        if Path(directory) / name == path_of(store, "job"):
            raise PermissionError(13, "Permission denied", name)
        return real_read(directory, name, limit)

    monkeypatch.setattr(engines, "_read", read)
    with caplog.at_level(logging.WARNING, logger="stableguards"):
        assert store.read("job") is None
        assert store.merge_write("job", profile_of("L['y']")) is None
    monkeypatch.undo()
    assert path_of(store, "job").read_bytes() == before
    assert "Permission denied" in warnings_of(caplog)[0]


def test_unwritable_directory_warns(tmp_path, caplog):
    (tmp_path / "file").write_text("")
    store = dir_profiles(tmp_path / "file" / "pgo")
    with caplog.at_level(logging.WARNING, logger="stableguards"):
        assert store.merge_write("job", profile_of("L['x']")) is None
    assert "could not be read or saved" in warnings_of(caplog)[0] and "Not a directory" in warnings_of(caplog)[0]


def _write_entries(args: tuple[str, str, int]) -> None:
    kind, target, worker = args
    store = dir_profiles(target) if kind == "local" else redis_profiles(target)
    for i in range(10):
        store.merge_write("shared", profile_of(f"L['w{worker}_{i}']"))


def _run_writers(processes, kind: str, target: str) -> None:
    with processes.Pool(8) as pool:
        pool.map(_write_entries, [(kind, target, w) for w in range(8)])


def test_eight_concurrent_local_writers_lose_nothing(tmp_path, processes):
    _run_writers(processes, "local", str(tmp_path))
    stored = dir_profiles(tmp_path).read("shared")
    assert len(stored) == 80
    assert stored == Profile({CODE: {f"L['w{w}_{i}']": profile_of("x").frames[CODE]["x"]
                                     for w in range(8) for i in range(10)}})


# --- Redis --------------------------------------------------------------------


@pytest.fixture
def redis_store(redis_url):
    store = redis_profiles(redis_url)
    store.engine._client.flushdb()
    return store


def redis_set(store: EngineStore, key: str, raw: bytes) -> None:
    store.engine._client.set(store.engine.PREFIX + store.name(key), raw)


def test_redis_round_trip_and_merge(redis_store):
    assert redis_store.read("job") is None
    redis_store.merge_write("job", profile_of("L['x']"))
    redis_store.merge_write("job", Profile({CODE: {"L['x']": SourceEntry(specialized("solve"))}}))
    stored = redis_store.read("job")
    assert stored.frames[CODE]["L['x']"].scalar == DYNAMIC  # dynamic outranks specialized
    assert redis_store.keys() == ["job"]
    assert redis_store.clear("job") and redis_store.read("job") is None


def test_a_merge_that_keeps_losing_the_race_warns_and_keeps_what_is_stored(redis_store, monkeypatch, caplog):
    redis_store.merge_write("job", profile_of("L['x']"))
    swaps = []

    def losing_swap(name, expected, new):  # every swap finds the value changed by another writer
        swaps.append(name)
        return False

    monkeypatch.setattr(redis_store.engine, "swap", losing_swap)
    monkeypatch.setattr(EngineStore, "MERGE_BUDGET_S", 0.05)
    with caplog.at_level(logging.WARNING, logger="stableguards"):
        assert redis_store.merge_write("job", profile_of("L['y']")) is None
    assert any("kept changing" in r.getMessage() for r in caplog.records) and len(swaps) > 1
    monkeypatch.undo()
    assert redis_store.read("job") == profile_of("L['x']")


def test_a_merge_that_lost_one_race_merges_on_top_of_the_winner(tmp_path):
    """The compare-and-swap itself: a writer that got in between is merged, not overwritten."""
    store = dir_profiles(tmp_path)
    store.merge_write("job", profile_of("L['x']"))
    real_swap = store.engine.swap
    raced = []

    def swap_after_another_writer(name, expected, new):
        if not raced:
            raced.append(True)
            dir_profiles(tmp_path).merge_write("job", profile_of("L['other']"))
        return real_swap(name, expected, new)

    store.engine.swap = swap_after_another_writer
    assert store.merge_write("job", profile_of("L['y']")) == profile_of("L['x']", "L['other']", "L['y']")
    assert dir_profiles(tmp_path).read("job") == profile_of("L['x']", "L['other']", "L['y']")


def test_bad_redis_value_is_moved_aside(redis_store, caplog):
    redis_set(redis_store, "job", b"\x80\x04garbage")
    with caplog.at_level(logging.WARNING, logger="stableguards"):
        assert redis_store.read("job") is None
    aside = [k for k in redis_store.engine._client.keys("*") if b".bad-" in k]
    assert len(aside) == 1 and redis_store.engine._client.get(aside[0]) == b"\x80\x04garbage"
    assert redis_store.keys() == []
    redis_store.merge_write("job", profile_of("L['y']"))
    assert redis_store.read("job") == profile_of("L['y']")
    assert len(warnings_of(caplog)) == 1


def test_future_redis_value_is_left_untouched(redis_store, caplog):
    future = json.dumps({"format": "stableguards-pgo", "version": 2, "frames": []}).encode()
    redis_set(redis_store, "job", future)
    with caplog.at_level(logging.WARNING, logger="stableguards"):
        assert redis_store.read("job") is None
        assert redis_store.merge_write("job", profile_of("L['x']")) is None
    assert redis_store.engine._client.get(redis_store.engine.PREFIX + redis_store.name("job")) == future


def test_eight_concurrent_redis_writers_lose_nothing(redis_store, redis_url, processes):
    _run_writers(processes, "redis", redis_url)
    assert len(redis_store.read("shared")) == 80


def test_redis_that_refuses_connections_warns_once(caplog):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there
    store = redis_profiles(f"redis://127.0.0.1:{port}/0")
    with caplog.at_level(logging.WARNING, logger="stableguards"):
        assert store.read("job") is None
        assert store.merge_write("job", profile_of("L['x']")) is None
    assert len(warnings_of(caplog)) == 1 and "(unreachable" in warnings_of(caplog)[0]


def test_redis_that_never_answers_times_out(caplog):
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    accepted = []
    stop = threading.Event()

    def accept_and_stay_silent():
        listener.settimeout(0.1)
        while not stop.is_set():
            try:
                accepted.append(listener.accept()[0])
            except OSError:
                pass

    thread = threading.Thread(target=accept_and_stay_silent, daemon=True)
    thread.start()
    try:
        from stableguards.storage.engines import RedisEngine

        store = EngineStore(RedisEngine(f"redis://127.0.0.1:{listener.getsockname()[1]}/0", timeout_s=0.3))
        with caplog.at_level(logging.WARNING, logger="stableguards"):
            assert store.read("job") is None
        assert "Timeout" in warnings_of(caplog)[0]
    finally:
        stop.set()
        thread.join()
        for conn in accepted:
            conn.close()
        listener.close()


def test_redis_urls_are_shown_without_credentials():
    from stableguards.storage.engines import redacted

    assert redacted("redis://user:s3cret@cache.internal:6380/2") == "redis://***@cache.internal:6380/2"
    assert redacted("rediss://:s3cret@[::1]/0") == "rediss://***@[::1]/0"
    assert redacted("redis://cache.internal:6379/0") == "redis://cache.internal:6379/0"


def test_tiers_read_the_first_that_has_a_profile_and_write_to_all(tmp_path):
    from stableguards.profiles.store import TieredStore

    local, remote = dir_profiles(tmp_path / "local"), dir_profiles(tmp_path / "remote")
    tiers = TieredStore([local, remote])
    assert tiers.read("job") is None
    remote.merge_write("job", profile_of("L['y']"))
    assert tiers.read("job") == profile_of("L['y']")  # local has none: the remote one
    merged = tiers.merge_write("job", profile_of("L['x']"))
    assert local.read("job") == profile_of("L['x']")
    assert remote.read("job") == profile_of("L['x']") | profile_of("L['y']") == merged
    assert tiers.read("job") == profile_of("L['x']")  # local first, as torch
    assert tiers.keys() == ["job"] and tiers.clear("job") and tiers.read("job") is None


def test_the_shared_store_holds_profiles_under_torchs_local_switch(tmp_path, monkeypatch):
    """STABLEGUARDS_STORE stands where torch's local profiles would, and follows their switch:
    ``automatic_dynamic_local_pgo = False`` keeps profiles out of it too."""
    import torch._dynamo.config as dynamo_config

    from stableguards.profiles.hooks import profile_store

    monkeypatch.setenv("STABLEGUARDS_STORE", str(tmp_path / "shared"))
    with dynamo_config.patch(automatic_dynamic_local_pgo=True):
        store = profile_store()
        store.merge_write("job", profile_of("L['x']"))
        assert (tmp_path / "shared" / "pgo" / "job.json").is_file()
    with dynamo_config.patch(automatic_dynamic_local_pgo=False):
        assert profile_store() is None
