"""Real restarts: fresh processes, one shared cache directory, inductor on CPU.

These are the slow tests of the suite (about half a minute per cold+warm pair);
they prove the product promise end to end, where the others test the parts.
"""

from __future__ import annotations

import pytest
from _children import requires_warm_start
from bench_programs import WORKLOADS, cold_and_warm, restart_ab, restart_child


# Where warm start applies (torch 2.15) a warm process traces nothing and looks nothing
# up in the caches; the tests of the cache path leave it to torch.
WITHOUT_WARM_START = {"on": {"STABLEGUARDS_DISABLE": "warm_start"},
                      "on, symbols off": {"STABLEGUARDS_DISABLE": "symbols,warm_start"}}


@pytest.mark.parametrize("workloads, config", [(WORKLOADS, "on"), (("seed",), "on, symbols off")])
def test_flag_on_warm_restart_hits_both_caches_and_matches_eager(workloads, config):
    """Flag on, every workload (one after another in each process, each counted on its own);
    once more with the allocator left to torch, where the profiles alone must do it."""
    warm = cold_and_warm(",".join(workloads), "inductor", config, "set", WITHOUT_WARM_START[config])["warm"]
    for workload in workloads:
        counts = warm[workload] if len(workloads) > 1 else warm
        assert counts["compiles"] >= 1, workload
        assert counts["fxgraph_cache_miss"] == 0 and counts["autograd_cache_miss"] == 0, (workload, counts)
        assert counts["fxgraph_cache_hit"] == counts["compiles"], (workload, counts)
        assert counts["autograd_cache_hit"] == counts["compiles"], (workload, counts)
        assert counts["matches_eager"], workload


# The FX-graph cache alone, as with the AOTAutograd cache off or bypassed: from
# torch 2.14 on, the AOTAutograd key renames SymInt inputs by position and hides
# symbol-name misses where that cache serves the graph; the FX key still uses
# str(symbol) in every version.
FX_ONLY = {"TORCHINDUCTOR_AUTOGRAD_CACHE": "0"}


def test_flag_off_the_seed_case_misses_on_restart():
    """The A side of the A/B: without the flag, torch misses on this workload.

    If this starts passing with zero misses, upstream changed its allocator and
    the seed workload no longer shows the problem it was written for.
    """
    warm = cold_and_warm("seed", "inductor", "off", "set", FX_ONLY)["warm"]
    assert warm["fxgraph_cache_miss"] >= 1, warm
    assert warm["matches_eager"]
    fixed = cold_and_warm("seed", "inductor", "on", "set", {**FX_ONLY, **WITHOUT_WARM_START["on"]})["warm"]
    assert fixed["fxgraph_cache_miss"] == 0 and fixed["fxgraph_cache_hit"] == fixed["compiles"], fixed


def test_without_a_job_id_only_the_flag_carries_dynamism_across_a_restart():
    """torch's PGO needs a job id (the open-source default has none): the warm run compiles
    the static graph again, then recompiles; with the flag it starts from the dynamic one."""
    off = cold_and_warm("closure", "inductor", "off", "unset")["warm"]
    on = cold_and_warm("closure", "inductor", "on", "unset", WITHOUT_WARM_START["on"])["warm"]
    assert off["recompiles"] >= 1 and on["recompiles"] == 0, (off, on)
    assert on["compiles"] < off["compiles"]
    assert off["matches_eager"] and on["matches_eager"]


def test_artifacts_never_cross_backend_configurations_after_a_restart():
    """Why the backend fingerprint is not added to the persisted cache keys.

    Inductor's FX-graph and AOTAutograd keys already contain inductor's config,
    so a restarted process with other options finds nothing of the first one's.
    """
    import tempfile

    with tempfile.TemporaryDirectory() as cache_dir:
        flag_on = {"TORCHDYNAMO_STABLE_GUARDS": "1", **WITHOUT_WARM_START["on"]}
        restart_child("seed", "inductor", cache_dir, flag_on)
        other = restart_child("seed", "inductor", cache_dir, {**flag_on, "TORCHINDUCTOR_MAX_AUTOTUNE": "1"})
    assert other["fxgraph_cache_hit"] == 0 and other["autograd_cache_hit"] == 0
    assert other["matches_eager"]


def test_a_restart_miss_is_explained_by_the_key_component_and_symbol():
    """With the stable parts off, the seed case misses; explain() says which component differs."""
    warm = cold_and_warm("seed", "inductor", "on", "set",
                   {"STABLEGUARDS_DISABLE": "symbols,profiles,backends,warm_start", **FX_ONLY})["warm"]
    assert warm["fxgraph_cache_miss"] >= 1
    miss = next(line for line in warm["explain"].splitlines() if "FX-graph cache miss" in line)
    assert "example_inputs" in miss and "s68" in miss and "s69" in miss


@requires_warm_start
def test_warm_start_traces_nothing_on_a_restart_where_torch_supports_it():
    """torch 2.15: the warm process installs every frame the cold one compiled (no job id:
    the open-source default)."""
    warm = restart_ab("seed", "inductor", "on", "unset")["warm"]  # the demo's command line
    assert warm["compiles"] == 0 and warm["matches_eager"], warm
    assert "installed its saved compiled entry" in warm["explain"]
