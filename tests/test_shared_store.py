"""Warm start from one shared store (STABLEGUARDS_STORE): a replica with an empty local cache
dir starts warm, signed entries, ranks that wait for the one compiling, and faults (an
unreachable Redis, a lease holder that died).  Fresh processes, torch 2.15."""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from stableguards.storage import open_store
from stableguards.storage.engines import RedisEngine
from stableguards.storage.leases import Lease
from _children import last_json

pytestmark = pytest.mark.skipif(not hasattr(torch._dynamo.package.CompilePackage, "bypass_current_compile"),
                                reason="warm start needs torch 2.15")

CHILD = Path(__file__).with_name("_store_child.py")


def _env(local: Path, store: str, key: str | None = None, **extra: str) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("STABLEGUARDS_")}
    env.update(TORCHINDUCTOR_CACHE_DIR=str(local), TORCHDYNAMO_STABLE_GUARDS="1", STABLEGUARDS_STORE=store,
               PYTHONHASHSEED="random")
    env.update(extra)
    if key:
        env["STABLEGUARDS_STORE_KEY"] = key
    return env


def _start(local: Path, store: str, key: str | None = None, **extra: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, str(CHILD)], env=_env(local, store, key, **extra),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _result(proc: subprocess.Popen) -> dict:
    out, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err[-3000:]
    result = last_json(out)
    result["stderr"] = err
    assert result["ok"], result
    return result


def _run(local: Path, store: str, key: str | None = None, **extra: str) -> dict:
    return _result(_start(local, store, key, **extra))


@pytest.fixture
def store(redis_url):
    """A fleet's store: a real redis-server (the directory engine is every other warm-start
    test's default store, and tests/test_store.py runs the protocol on both)."""
    RedisEngine(redis_url)._client.flushdb()
    return redis_url


def test_a_replica_with_an_empty_local_dir_starts_warm_from_the_store(tmp_path, store):
    cold = _run(tmp_path / "machine-a", store)
    assert cold["traced"] > 0
    warm = _run(tmp_path / "machine-b", store)
    assert warm["traced"] == 0, warm["explain"]
    assert not (tmp_path / "machine-b" / "stableguards" / "store").exists()  # nothing local needed


def test_entries_signed_with_another_key_are_refused(tmp_path):
    """(The protocol is the same on every engine: tests/test_store.py.)"""
    store = str(tmp_path / "shared")
    _run(tmp_path / "a", store, key="right")
    wrong = _run(tmp_path / "b", store, key="wrong")
    assert wrong["traced"] > 0 and "signature does not match" in wrong["stderr"]
    assert wrong["stderr"].count("could not be read") == 1  # one warning
    unsigned = _run(tmp_path / "c", store)  # no key: the store is trusted as it is
    assert unsigned["traced"] == 0
    # A CPU with another vector ISA (here: none) would otherwise run C++ written for this one's.
    # (Its own cache dir, with the cold one's index of keys, which names the difference.)
    shutil.copytree(tmp_path / "a" / "stableguards" / "warm_start", tmp_path / "d" / "stableguards" / "warm_start")
    other_cpu = _run(tmp_path / "d", store, key="right", ATEN_CPU_CAPABILITY="default")
    assert other_cpu["traced"] > 0 and "cpu_isa" in other_cpu["explain"], other_cpu["explain"]


def test_a_lease_whose_holder_died_expires(tmp_path, store):
    first = _run(tmp_path / "probe", str(tmp_path / "probe-store"))  # learn the entry's key digest
    digest = next(p.name for p in (tmp_path / "probe-store" / "refs" / "warm_start").iterdir())
    gate = tmp_path / "gate"
    proc = _start(tmp_path / "a", store, STABLEGUARDS_STORE_LEASE_S="60", STORE_CHILD_GATE=str(gate))
    while not Path(f"{gate}.ready").exists():  # claimed once the child has started (a slow start is no expiry)
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        time.sleep(0.05)
    dead = Lease("dead-host:1:x", 4).dumps()  # a holder that never beats
    open_store(None, store, key="").engine.claim(f"leases/warm_start/{digest}", dead, 4)
    gate.touch()
    result = _result(proc)
    assert result["traced"] == first["traced"] and result["waited_s"] >= 2  # waited, then compiled
    assert "waited for it" in result["explain"]


def test_an_unreachable_redis_warns_once_and_compiles(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    result = _run(tmp_path / "a", f"redis://127.0.0.1:{port}/0")
    assert result["traced"] > 0
    assert result["stderr"].count("(unreachable: redis://") == 1, result["stderr"][-2000:]


RANK_CHILD = Path(__file__).with_name("_rank_child.py")


def _ranks(tmp_path: Path, store: str, world: int, run: str) -> list[dict]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = [subprocess.Popen([sys.executable, str(RANK_CHILD)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, env=_env(tmp_path / f"{run}-rank{rank}", store, RANK=str(rank),
                                                  WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1",
                                                  MASTER_PORT=str(port)))
             for rank in range(world)]
    return [_result(p) for p in procs]


def test_ranks_share_what_is_the_same_and_keep_what_bakes_in_their_rank(tmp_path, store):
    """torch.distributed (gloo, CPU), 3 ranks started together, each with its own empty local
    cache dir, one store.  ``per_rank`` folds get_rank() into its graph (no guard in Dynamo):
    each rank keeps its own entry; ``shared`` is compiled by every rank that did not find it
    saved, none waiting on another's lease (a rank's compiles run between collectives: the
    holder could be waiting on it).  A restart traces nothing."""
    cold = _ranks(tmp_path, store, 3, "cold")
    assert 1 <= sum(r["traced"].count("shared") for r in cold) <= 3
    assert sum(r["traced"].count("per_rank") for r in cold) == 3
    assert not any("waited for it" in r["explain"] for r in cold)
    warm = _ranks(tmp_path, store, 3, "warm")
    assert all(r["traced"] == [] for r in warm), [r["explain"] for r in warm]
    # Rank 1's entry replaced by rank 0's (a store that lies): the folded rank is checked
    # before the entry serves, so rank 1 compiles its own and is right.
    engine = open_store(None, store, key="").engine
    calls = [k.decode() for k in engine._client.keys(engine.PREFIX + "refs/warm_start/*.*")]
    assert len(calls) == 3
    refs = sorted(calls)
    for name in refs[1:]:
        engine._client.set(name, engine._client.get(refs[0]))
    lied = _ranks(tmp_path, store, 3, "lied")
    assert sum(bool(r["traced"]) for r in lied) == 2
    assert all("get_rank" in r["explain"] for r in lied if r["traced"]), [r["explain"] for r in lied]


def test_redis_stopped_mid_run_warns_once_and_every_call_is_right(redis_server, monkeypatch, caplog):
    """In one process: a function compiled and saved while Redis runs; Redis stops; a new
    function's load and save fail (one warning for both), it compiles and runs, and the first
    function's saved entry was whole."""
    import logging

    import torch._dynamo

    from stableguards.warm_start.state import STATE

    proc, url = redis_server
    monkeypatch.setenv("STABLEGUARDS_STORE", url)
    x = torch.randn(8)

    def before(x):
        return x.sin() + 1

    def after(x):
        return x.cos() * 2

    with torch._dynamo.config.patch(stable_guards=True), caplog.at_level(logging.WARNING):
        torch._dynamo.reset()
        STATE.reset()
        torch.testing.assert_close(torch.compile(before)(x), before(x))
        assert open_store(None, url, key="").fetch("warm_start", next(iter(STATE.saved_here))) is not None
        proc.kill()
        proc.wait(timeout=10)
        for _ in range(2):
            torch.testing.assert_close(torch.compile(after)(x), after(x))
        torch._dynamo.reset()
        STATE.reset()
    warnings = [r.getMessage() for r in caplog.records if "stableguards" in r.getMessage()]
    assert sum("(unreachable: redis://" in w for w in warnings) == 1, warnings  # one cause, one warning


def test_an_entry_waiting_for_a_backward_that_never_comes_holds_others_briefly(tmp_path, store):
    """A process that runs a forward with grad and never a backward: its entry waits for the
    backward forever, its lease only for a tenth of the lease period; another process waits
    that long at most, then compiles."""
    env = {"STABLEGUARDS_STORE_LEASE_S": "30", "STORE_CHILD_GRAD": "1", "STORE_CHILD_LINGER_S": "25"}
    gate = tmp_path / "gate"  # the waiter, started beside the holder, compiles once the lease is there
    holder = _start(tmp_path / "a", store, **env)
    waiter = _start(tmp_path / "b", store, STORE_CHILD_GATE=str(gate), **env)
    deadline = time.monotonic() + 120
    engine = open_store(None, store, key="").engine
    while not engine._client.keys(engine.PREFIX + "leases/*") and time.monotonic() < deadline:
        time.sleep(0.05)
    gate.touch()
    waiter = _result(waiter)
    # Waited while the holder compiled its forward, then 3 s at most, never the 30 s lease.
    assert "waited for it" in waiter["explain"] and waiter["traced"] > 0
    assert waiter["waited_s"] < 20, waiter["waited_s"]
    holder.kill()
    holder.wait()


def _counter(result: dict, name: str) -> int:
    found = re.search(rf"\b{name}=(\d+)", result["explain"])
    return int(found.group(1)) if found else 0


def test_a_new_machine_loads_the_kernel_binaries_another_built_and_refuses_altered_ones(tmp_path):
    """Each machine its own cache dir and temporary dir (where inductor keeps precompiled
    headers): the second builds no kernel; a third, after every stored binary was altered, is
    warned once, builds its own, and is right."""
    store = str(tmp_path / "store")

    def machine(name: str, **extra: str) -> dict:
        (tmp_path / name / "tmp").mkdir(parents=True)
        return _run(tmp_path / name / "cache", store, TMPDIR=str(tmp_path / name / "tmp"), **extra)

    cold = machine("a")
    assert "store_kernel_binary_written=" in cold["explain"]
    # The flag set with config.patch in the compiling thread: inductor's build threads still serve.
    warm = machine("b", TORCHDYNAMO_STABLE_GUARDS="0", STORE_CHILD_PATCH_FLAG="1")
    # Every binary the first machine built, probes and kernels, is fetched: none is built here.
    assert _counter(warm, "store_kernel_binary_read") == _counter(cold, "store_kernel_binary_written") > 0
    assert "store_kernel_binary_unusable" not in warm["explain"]
    assert not list((tmp_path / "b" / "tmp").rglob("*.gch"))  # no kernel built: no header precompiled
    for ref in (Path(store) / "refs" / "kernel_binary").iterdir():
        blob = Path(store) / "blobs" / json.loads(ref.read_text())["digest"]
        blob.write_bytes(b"altered" + blob.read_bytes()[7:])
    altered = machine("c")
    assert "store_kernel_binary_read" not in altered["explain"]
    assert altered["stderr"].count("a compiled kernel binary") == 1, altered["stderr"]
