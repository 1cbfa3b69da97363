"""Kernel binaries in the store: the names they are usable under, plain (no torch)."""

from __future__ import annotations

from stableguards.components import Components
from stableguards.events import EVENTS
from stableguards.storage import open_store
from stableguards.store import binaries
from stableguards.store.hooks import _fetched, _publish

COMMAND = "g++ /home/a/cache/ab/cab.main.cpp -I/home/a/venv/torch/include -mavx2 -o /home/a/cache/ab/cab.main.so"
DIRS = {"cache": "/home/a/cache", "torch": "/home/a/venv/torch", "prefix": "/home/a/venv"}


def key(**changes) -> Components:
    values = dict(command=COMMAND, sources={"/home/a/cache/ab/cab.main.cpp": b"int f() { return 1; }"},
                  directories=DIRS, compiler="g++ (GCC) 11.4.0", torch_version="2.15.0 abc", platform="linux x86_64")
    values.update(changes)
    return binaries.binary_key(**values)


def test_two_machines_with_the_same_build_under_other_roots_share_a_name():
    elsewhere = key(command=COMMAND.replace("/home/a", "/srv/b"), sources={"/srv/b/cache/ab/cab.main.cpp":
                                                                            b"int f() { return 1; }"},
                    directories={name: path.replace("/home/a", "/srv/b") for name, path in DIRS.items()})
    assert elsewhere == key()
    assert "<cache>/ab/cab.main.cpp" in key().get("command") and "<torch>/include" in key().get("command")


def test_anything_that_makes_another_binary_makes_another_name():
    source = "/home/a/cache/ab/cab.main.cpp"
    changed = {"command": key(command=COMMAND.replace("-mavx2", "-mavx512f")),
               "source <cache>/ab/cab.main.cpp": key(sources={source: b"int f() { return 2; }"}),
               "compiler": key(compiler="g++ (GCC) 12.1.0"), "torch": key(torch_version="2.15.1 def"),
               "platform": key(platform="linux aarch64")}
    for component, other in changed.items():
        assert other.differing(key()) == [component]
        assert other.digest != key().digest


def test_a_binary_built_by_another_compiler_is_a_miss_said_once_by_its_component(tmp_path, caplog):
    EVENTS.reset()
    store = open_store(None, str(tmp_path))
    theirs = tmp_path / "theirs.so"
    theirs.write_bytes(b"\x7fELF theirs")
    _publish(store, key(compiler="clang 17"), theirs)
    assert _fetched(store, key(compiler="clang 17")) == b"\x7fELF theirs"
    assert _fetched(store, key()) is None and _fetched(store, key()) is None
    assert EVENTS.counters["store_kernel_binary_unusable"] == 2
    assert "built with another compiler" in EVENTS.explain()
    assert sum("kernel binaries" in r.getMessage() for r in caplog.records) == 1
    EVENTS.reset()
