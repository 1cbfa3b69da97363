"""torch's PGO settings keep their meaning with the flag on (issue 11)."""

from __future__ import annotations

import json
import os

import pytest
import torch
import torch._dynamo
import torch._inductor.mock_cache as mock_cache
from torch._dynamo.testing import CompileCounter

import stableguards  # noqa: F401 - registers the flag


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    """A fresh inductor cache dir, a job id, the flag on; torch's caches reset around."""
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    torch._dynamo.reset()
    with torch._dynamo.config.patch(stable_guards=True), torch.compiler.config.patch(job_id="contracts"):
        yield tmp_path
    torch._dynamo.reset()


def restart() -> None:
    """What a new process starts from: no compiled frames, no profile in memory."""
    torch._dynamo.reset()


def run(sizes, counter=None) -> CompileCounter:
    counter = counter or CompileCounter()

    @torch.compile(backend=counter, fullgraph=True)
    def f(x):
        return x * 2

    for n in sizes:
        assert torch.equal(f(torch.ones(2, n)), torch.ones(2, n) * 2)
    return counter


def profile_files(root) -> list[str]:
    return [os.path.join(d, name) for d, _, names in os.walk(root) for name in names
            if "pgo" in d or name.startswith("code_state")]


def test_local_pgo_off_reads_and_writes_no_local_profile(cache_dir):
    with torch._dynamo.config.patch(automatic_dynamic_local_pgo=False):
        assert run([3, 4]).frame_count == 2
        restart()
        assert run([5, 6]).frame_count == 2  # nothing carried over
    assert profile_files(cache_dir) == []


def test_local_pgo_on_carries_dynamism_across_a_restart(cache_dir):
    run([3, 4])
    restart()
    assert run([5, 6]).frame_count == 1


def test_remote_pgo_goes_through_torchs_remote_cache_as_json(cache_dir):
    with torch._dynamo.config.patch(automatic_dynamic_local_pgo=False, automatic_dynamic_remote_pgo=True), \
            mock_cache.PatchCaches():
        assert run([3, 4]).frame_count == 2
        restart()
        assert run([5, 6]).frame_count == 1
        stats = mock_cache.global_stats.dynamo_pgo
        assert (stats.num_put, stats.num_get_hit, stats.num_get_miss) == (2, 1, 1)
        stored = mock_cache.global_stats.dynamo_pgo.cache
        [(key, value)] = stored.items()
        assert "stableguards:contracts:" in key
        stored_json = json.loads(value) if isinstance(value, (str, bytes)) else value
        payload = json.loads(stored_json["stableguards_profile"])  # JSON, never a pickle
        assert payload["frames"]
    assert profile_files(cache_dir) == []


def test_extra_keys_hand_a_profile_from_one_job_to_another(cache_dir):
    with torch.compiler.config.patch(job_id="writer", pgo_extra_write_key="shared"):
        assert run([3, 4]).frame_count == 2
    restart()
    with torch.compiler.config.patch(job_id="reader", pgo_extra_read_key="shared"):
        assert run([5, 6]).frame_count == 1  # starts from the shared profile
    restart()
    with torch.compiler.config.patch(job_id="stranger"):
        assert run([5, 6]).frame_count == 2


def test_cache_artifacts_carry_the_profile_to_an_empty_cache_dir(cache_dir, tmp_path_factory, monkeypatch):
    run([3, 4])
    artifacts = torch.compiler.save_cache_artifacts()
    assert artifacts is not None
    payload, info = artifacts
    assert len(info.pgo_artifacts) >= 1
    restart()
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path_factory.mktemp("elsewhere")))
    from torch._inductor.utils import clear_caches

    clear_caches()
    info = torch.compiler.load_cache_artifacts(payload)
    assert len(info.pgo_artifacts) >= 1
    assert run([5, 6]).frame_count == 1  # the dynamic graph first, as the bundle says
