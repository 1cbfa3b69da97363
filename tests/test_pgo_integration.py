"""Specialization-aware profiles through real Dynamo compiles in fresh processes (eager backend)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from bench_programs import restart_child

from stableguards.profiles.store import EngineStore
from stableguards.storage.engines import DirectoryEngine


def run(workload: str, cache_dir: Path, **env: str) -> dict:
    """One process of the demo under the recording eager backend, flag on unless env says."""
    return restart_child(workload, "record", cache_dir, {"TORCHDYNAMO_STABLE_GUARDS": "1", **env})


def profiles(cache_dir: Path) -> list[Path]:
    return sorted(p for p in (cache_dir / "stableguards" / "store" / "pgo").glob("*.json") if ".bad-" not in p.name)


WORKLOADS = ("seed", "dict_collide", "list_overmarked", "closure")


@pytest.fixture(scope="module")
def restarts(tmp_path_factory) -> tuple[Path, dict, dict]:
    """Flag on, no job id: every workload, one after another, in a cold process and then a warm
    one on one cache dir (each workload counted on its own).  They share the process's
    profile (named by the entry point): read once, at the first compile."""
    cache = tmp_path_factory.mktemp("restarts")
    return cache, run(",".join(WORKLOADS), cache), run(",".join(WORKLOADS), cache)


def _compiles_only_graphs_the_cold_run_produced(workloads: tuple[str, ...], cold: dict, warm: dict) -> None:
    for workload in workloads:
        before, after = cold[workload], warm[workload]
        assert after["graphs"] and set(after["graphs"]) <= set(before["graphs"]), workload
        assert len(after["graphs"]) < len(before["graphs"]), workload
        assert after["matches_eager"] and before["matches_eager"], workload
    assert warm[workloads[0]]["counters"]["pgo_profiles_loaded"] == 1


def test_warm_run_compiles_only_graphs_the_cold_run_produced(restarts):
    _, cold, warm = restarts
    _compiles_only_graphs_the_cold_run_produced(WORKLOADS, cold, warm)


def test_warm_run_compiles_only_graphs_the_cold_run_produced_without_the_stable_allocator(tmp_path):
    workloads = WORKLOADS[:3]
    cold = run(",".join(workloads), tmp_path, STABLEGUARDS_DISABLE="symbols")
    warm = run(",".join(workloads), tmp_path, STABLEGUARDS_DISABLE="symbols")
    _compiles_only_graphs_the_cold_run_produced(workloads, cold, warm)


def test_specialized_source_is_explained_on_both_sides_of_the_restart(restarts):
    _, cold, warm = restarts
    assert "L['repeat']\" of seed_fn" in cold["seed"]["explain"]
    assert "recorded as specialized, not dynamic" in cold["seed"]["explain"]
    assert "range_refined_to_singleton" in cold["seed"]["explain"]
    assert "starts static (was specialized)" in warm["seed"]["explain"]


def test_a_closure_finds_its_profile_after_a_restart(restarts):
    cache, cold, warm = restarts
    assert len(cold["closure"]["graphs"]) == 2  # static, then dynamic
    assert warm["closure"]["graphs"] == cold["closure"]["graphs"][1:]  # straight to the dynamic graph
    [path] = profiles(cache)
    frames = EngineStore(DirectoryEngine(path.parent), prefix="").read(path.stem).frames
    assert [code.closure is not None for code in frames if code.name == "closure_fn"] == [True]


def test_job_id_names_the_profile(tmp_path):
    run("seed", tmp_path, TORCH_COMPILE_JOB_ID="my-job")
    assert [p.name for p in profiles(tmp_path)] == ["my-job_rank0.json"]


def test_default_key_names_the_entry_point_and_rank(tmp_path):
    run("seed", tmp_path, RANK="3")
    [path] = profiles(tmp_path)
    assert path.name.startswith("_restart_child-") and path.name.endswith("_rank3.json")


def test_flag_off_writes_no_stableguards_profile(tmp_path):
    cold = run("seed", tmp_path, TORCHDYNAMO_STABLE_GUARDS="0", TORCH_COMPILE_JOB_ID="j")
    assert profiles(tmp_path) == []
    assert list((tmp_path / "dynamo").glob("code_state_*.pkl"))  # upstream's own, untouched
    assert cold["counters"] == {}


def test_corrupt_profile_compiles_as_if_cold_and_is_kept(tmp_path):
    run("seed", tmp_path)
    [path] = profiles(tmp_path)
    path.write_bytes(path.read_bytes()[:100])
    warm = run("seed", tmp_path)
    assert warm["stderr"].count("moved it to") == 1
    assert warm["matches_eager"] and len(warm["graphs"]) == 3  # cold again
    assert len(list(path.parent.glob("*.bad-*.json"))) == 1
    assert len(profiles(tmp_path)) == 1  # rewritten fresh; the bad one is set aside


def test_profile_of_code_that_changed_is_ignored_with_a_warning(tmp_path):
    run("seed", tmp_path)
    [path] = profiles(tmp_path)
    data = json.loads(path.read_text())
    data["frames"][0]["code"]["file_hash"] = "deadbeef"  # as if the file had been edited
    path.write_text(json.dumps(data))
    warm = run("seed", tmp_path)
    assert "source file changed or is gone" in warm["stderr"]
    assert len(warm["graphs"]) == 3 and warm["matches_eager"]
    stored = EngineStore(DirectoryEngine(path.parent), prefix="").read(path.stem)
    assert len(stored.frames) == 2  # the stale frame is kept alongside the new one


def test_unreachable_redis_compiles_without_a_profile(tmp_path):
    result = run("seed", tmp_path, STABLEGUARDS_PGO_REDIS_URL="redis://127.0.0.1:1/0")
    assert result["stderr"].count("the store redis://127.0.0.1:1/0: a profile could not be read or saved "
                                  "(unreachable") == 1
    assert result["matches_eager"] and len(result["graphs"]) == 3


def test_profiles_shared_through_redis(tmp_path, redis_url):
    cold = run("seed", tmp_path / "machine-a", STABLEGUARDS_PGO_REDIS_URL=redis_url,
               TORCH_COMPILE_JOB_ID="fleet")
    warm = run("seed", tmp_path / "machine-b", STABLEGUARDS_PGO_REDIS_URL=redis_url,
               TORCH_COMPILE_JOB_ID="fleet")
    assert set(warm["graphs"]) <= set(cold["graphs"]) and len(warm["graphs"]) == 2


def test_an_internal_error_in_the_profile_path_falls_back(tmp_path, monkeypatch):
    import torch
    import torch._dynamo

    from stableguards.events import EVENTS
    from stableguards.profiles.state import STATE

    def broken(observed):
        raise RuntimeError("injected")

    monkeypatch.setattr(STATE, "save", broken)
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    torch._dynamo.reset()
    with torch._dynamo.config.patch(stable_guards=True):
        f = torch.compile(lambda x: x * 2, backend="eager")
        assert torch.equal(f(torch.ones(3)), torch.ones(3) * 2)
        assert torch.equal(f(torch.ones(4)), torch.ones(4) * 2)
    torch._dynamo.reset()
    assert EVENTS.warned("put_code_state (profiles)")
