"""The flag never breaks a compile: edge graphs and callables, flag off vs on, cold and warm.

Graphs that compute nothing, return only aliases or an input, simplify to an
identity (``x * 1``), ``detach()``, in-place only, graph breaks, inference
mode, compiled autograd, a training step returning ``loss.detach()``, and
callables that are not plain functions (``functools.partial``, bound methods,
callable objects, lambdas): each compiles with inductor in a cold process and
a warm one on the same cache dir with the flag on, and in a process with the
flag off.  Every call succeeds, equals eager, and gives the same results with
the flag as without;
and Dynamo never takes a frame of stableguards' own code (compiled autograd
calls torch.compile, and so our hooks, while a compiled region runs).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from _children import child_env, run_child

CHILD = Path(__file__).resolve().parent / "_edge_child.py"


def _run(cache: Path, flag: bool) -> dict:
    return run_child([CHILD, "1" if flag else "0"], child_env(cache))


def test_edge_graphs_compile_with_the_flag_as_without_it_cold_and_warm(tmp_path):
    # Flag off, the cold process is the reference; its warm one would only test torch's caches.
    runs = {(False, "cold"): _run(tmp_path / "cache0", False)}
    runs |= {(True, when): _run(tmp_path / "cache1", True) for when in ("cold", "warm")}
    off = runs[(False, "cold")]["cases"]
    for (flag, when), run in runs.items():
        assert run["traced_ours"] == [], (flag, when, run["traced_ours"])  # Dynamo never traces our code
        for name, result in run["cases"].items():
            where = f"{name}, flag {'on' if flag else 'off'}, {when}: {result}\n{run['explain']}"
            assert result["error"] is None, where
            assert result["matches"], where
            assert result["eager"] == off[name]["eager"], where


def test_a_compile_that_fails_with_stableguards_in_the_way_is_compiled_again_without(tmp_path, monkeypatch,
                                                                                      caplog):
    """Bundling a graph that inductor hands back uncompiled fails torch's compile (2.15:
    "expected OutputCode"); warm start bundles the graph module itself instead.  With that
    defeated, the compile fails with our machinery in the way, and is compiled again without
    it: the call succeeds, equals eager, and one warning names the compile."""
    import logging

    import torch
    import torch._dynamo

    from stableguards.events import EVENTS
    from stableguards.hooks import STATE
    from stableguards.warm_start.hooks import bundling, no_compute

    if "warm_start" not in STATE.installed:
        pytest.skip("warm start needs torch's per-compile package bypass (torch 2.15)")
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(bundling, "_bundleable", lambda fn: True)
    monkeypatch.setattr(no_compute, "graph_without_calls", lambda fn: None)
    x = torch.randn(8, requires_grad=True)
    torch._dynamo.reset()
    with torch._dynamo.config.patch(stable_guards=True), caplog.at_level(logging.WARNING, "stableguards"):
        torch.testing.assert_close(torch.compile(lambda t: t.detach())(x), x.detach())
    torch._dynamo.reset()
    warnings = [r.getMessage() for r in caplog.records if "warm start compile" in r.getMessage()]
    assert len(warnings) == 1 and "expected OutputCode" in warnings[0], caplog.text
    assert EVENTS.counters["fallbacks"] == 1


def test_a_failing_backend_is_called_once_as_without_the_flag():
    """Only a compile for warm start is retried, and only inductor compiles are: a user's
    backend that raises is called once and its error reaches the user, as without the flag."""
    import torch
    import torch._dynamo

    calls = []

    def backend(gm, example_inputs):
        calls.append(1)
        raise ValueError("the backend's own failure")

    for flag in (False, True):
        torch._dynamo.reset()
        with torch._dynamo.config.patch(stable_guards=flag), pytest.raises(Exception, match="own failure"):
            torch.compile(lambda t: t.sin(), backend=backend)(torch.randn(4))
    torch._dynamo.reset()
    assert calls == [1, 1]
