"""inductor's graphs and AOTAutograd's entries in the shared store (STABLEGUARDS_STORE): a process
with an empty local cache dir finds what another compiled, verified and signed; a torch setting
the user chose keeps its meaning; bad entries give one warning and a compile.  Fresh processes,
every torch version (warm start left to torch here: it would serve these frames before torch's
caches are asked)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from _children import last_json

CHILD = Path(__file__).with_name("_store_child.py")
KEY = "the-fleet's-key"


def _run(local: Path, store: Path, *, flag: bool = True, key: str | None = KEY, **extra: str) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("STABLEGUARDS_", "TORCHINDUCTOR_"))}
    env.update(TORCHINDUCTOR_CACHE_DIR=str(local), TORCHDYNAMO_STABLE_GUARDS="1" if flag else "0",
               STABLEGUARDS_STORE=str(store), STABLEGUARDS_DISABLE="warm_start", STORE_CHILD_TRAIN="1",
               PYTHONHASHSEED="random", **extra)
    if key:
        env["STABLEGUARDS_STORE_KEY"] = key
    proc = subprocess.run([sys.executable, str(CHILD)], env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = last_json(proc.stdout)
    result["stderr"] = proc.stderr
    assert result["ok"], result  # gradients equal eager's, whatever was found
    return result


def _aot(result: dict, what: str) -> int:
    return result["counters"]["aot_autograd"].get(f"autograd_cache_{what}", 0)


@pytest.fixture(scope="module")
def cold_store(tmp_path_factory) -> Path:
    """A store one process (machine A) filled, then left."""
    root = tmp_path_factory.mktemp("artifacts")
    cold = _run(root / "machine-a", root / "store")
    assert _aot(cold, "miss") == 1 and "store_aot_autograd_written=1" in cold["explain"]
    return root / "store"


def _copy(store: Path, tmp_path: Path) -> Path:
    shutil.copytree(store, tmp_path / "store")
    return tmp_path / "store"


def test_a_process_with_an_empty_local_dir_finds_the_graphs_another_compiled(cold_store, tmp_path):
    warm = _run(tmp_path / "machine-b", _copy(cold_store, tmp_path))
    assert _aot(warm, "hit") == 1 and _aot(warm, "miss") == 0, warm["counters"]
    assert "store_aot_autograd_read=1" in warm["explain"] and "fx_cache_misses" not in warm["explain"]
    off = _run(tmp_path / "machine-c", tmp_path / "store", flag=False)  # torch alone: no remote cache
    assert _aot(off, "miss") == 1 and _aot(off, "hit") == 0, off["counters"]
    # A machine whose CPU has another vector ISA (here: none) would run C++ written for this one's.
    other_cpu = _run(tmp_path / "machine-d", tmp_path / "store", ATEN_CPU_CAPABILITY="default")
    assert _aot(other_cpu, "hit") == 0 and _aot(other_cpu, "miss") == 1, other_cpu["counters"]


def test_a_remote_cache_setting_the_user_chose_keeps_its_meaning(cold_store, tmp_path):
    store = _copy(cold_store, tmp_path)
    refs = sorted(p.name for p in (store / "refs").rglob("*"))
    own = _run(tmp_path / "machine-b", store, TORCHINDUCTOR_FX_GRAPH_REMOTE_CACHE="0",
               TORCHINDUCTOR_AUTOGRAD_REMOTE_CACHE="0")
    assert _aot(own, "miss") == 1 and "store_fx" not in own["explain"] and "store_aot" not in own["explain"]
    assert sorted(p.name for p in (store / "refs").rglob("*")) == refs  # nothing read or written there


def test_entries_signed_with_another_key_are_refused(cold_store, tmp_path):
    wrong = _run(tmp_path / "machine-b", _copy(cold_store, tmp_path), key="another key")
    assert _aot(wrong, "hit") == 0 and "signature does not match" in wrong["stderr"]
    assert wrong["stderr"].count("could not be read (") == 1  # one warning for every refusal


def test_corrupt_entries_warn_once_compile_and_are_mended(cold_store, tmp_path):
    store = _copy(cold_store, tmp_path)
    for blob in (store / "blobs").iterdir():
        blob.write_bytes(blob.read_bytes()[: len(blob.read_bytes()) // 2])  # every blob truncated
    broken = _run(tmp_path / "machine-b", store)
    assert _aot(broken, "hit") == 0 and broken["stderr"].count("could not be read (") == 1
    assert "corrupt or truncated" in broken["stderr"]
    mended = _run(tmp_path / "machine-c", store)  # the compile saved whole entries again
    assert _aot(mended, "hit") == 1, mended["counters"]
