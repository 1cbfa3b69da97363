"""Real restarts: fresh processes, one shared cache directory, inductor on CPU.

These are the slow tests of the suite (about half a minute per cold+warm pair);
they prove the product promise end to end, where the others test the parts.
"""

from __future__ import annotations

import pytest

from restart_ab import measure
from workloads import WORKLOADS


@pytest.mark.parametrize("workload, config", [(w, "on") for w in sorted(WORKLOADS)]
                         + [("seed", "on, symbols off")])
def test_flag_on_warm_restart_hits_both_caches_and_matches_eager(workload, config):
    """Flag on; once more with the allocator left to torch, where the profiles alone must do it."""
    warm = measure(workload, "inductor", config, "set")["warm"]
    assert warm["compiles"] >= 1
    assert warm["fxgraph_cache_miss"] == 0 and warm["autograd_cache_miss"] == 0, warm
    assert warm["fxgraph_cache_hit"] == warm["compiles"], warm
    assert warm["autograd_cache_hit"] == warm["compiles"], warm
    assert warm["matches_eager"]


def test_flag_off_the_seed_case_misses_on_restart():
    """The A side of the A/B: without the flag, torch 2.13 misses on this workload.

    If this starts passing with zero misses, upstream changed its allocator and
    the seed workload no longer shows the problem it was written for.
    """
    warm = measure("seed", "inductor", "off", "set")["warm"]
    assert warm["fxgraph_cache_miss"] >= 1, warm
    assert warm["matches_eager"]


def test_artifacts_never_cross_backend_configurations_after_a_restart():
    """Why the backend fingerprint is not added to the persisted cache keys.

    Inductor's FX-graph and AOTAutograd keys already contain inductor's config,
    so a restarted process with other options finds nothing of the first one's.
    """
    import tempfile

    from restart_ab import run_child

    with tempfile.TemporaryDirectory() as cache_dir:
        run_child("seed", "inductor", cache_dir, {"TORCHDYNAMO_STABLE_GUARDS": "1"})
        other = run_child("seed", "inductor", cache_dir, {"TORCHDYNAMO_STABLE_GUARDS": "1",
                                                          "TORCHINDUCTOR_MAX_AUTOTUNE": "1"})
    assert other["fxgraph_cache_hit"] == 0 and other["autograd_cache_hit"] == 0
    assert other["matches_eager"]


def test_a_restart_miss_is_explained_by_the_key_component_and_symbol():
    """With the stable parts off, the seed case misses; explain() says which component differs."""
    warm = measure("seed", "inductor", "on", "set", {"STABLEGUARDS_DISABLE": "symbols,pgo,backend"})["warm"]
    assert warm["fxgraph_cache_miss"] >= 1
    miss = next(line for line in warm["explain"].splitlines() if "FX-graph cache miss" in line)
    assert "example_inputs" in miss and "s68" in miss and "s69" in miss
