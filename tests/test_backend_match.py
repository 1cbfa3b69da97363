"""BACKEND_MATCH through real Dynamo compiles: share when equal, never cross-serve, no leaks."""

from __future__ import annotations

import gc
import logging
import os
import re
import subprocess
import sys
import weakref
from pathlib import Path

import pytest
import torch
import torch._C._dynamo.eval_frame as c_eval_frame
import torch._dynamo
from torch._dynamo.backends.common import aot_autograd

import stableguards
from stableguards.backends import hooks as backends


@pytest.fixture
def flag_on(fresh_dynamo):
    with torch._dynamo.config.patch(stable_guards=True):
        yield


def compiles() -> int:
    # Not get_compilation_metrics(): it keeps only the most recent 64.
    return torch._dynamo.utils.counters["stats"]["unique_graphs"]


def live_entries(fn) -> list:
    return [e for e in c_eval_frame._debug_get_cache_entry_list(fn.__code__) if e.code is not None]


class Scaled:
    """A backend whose output shows which backend compiled the code, with a loose __eq__."""

    def __init__(self, scale):
        self.scale = scale

    def __call__(self, gm, example_inputs):
        scale = self.scale
        return lambda *args: [out * scale for out in gm.forward(*args)]

    def __eq__(self, other):  # what a careless backend author writes
        return isinstance(other, Scaled)

    __hash__ = None


def double(x):
    return x + x


def test_user_objects_never_share_even_with_a_loose_eq(flag_on):
    x = torch.ones(3)
    two, three, again = Scaled(2), Scaled(3), Scaled(2)
    assert torch.equal(torch.compile(double, backend=two)(x), x * 4)
    assert torch.equal(torch.compile(double, backend=three)(x), x * 6)
    assert torch.equal(torch.compile(double, backend=again)(x), x * 4)  # looks equal: still its own
    assert torch.equal(torch.compile(double, backend=two)(x), x * 4)  # the same object: shares
    assert len(live_entries(double)) == 3


class ScaledHashable(Scaled):
    """The common pattern: a loose __eq__ with a __hash__ to match."""

    def __hash__(self):
        return hash(type(self))


def make_factory_backend(scale):
    class Factory:
        def __call__(self, gm, example_inputs):
            return lambda *args: [out * scale for out in gm.forward(*args)]

    return Factory()


@pytest.mark.parametrize("make", [ScaledHashable, make_factory_backend], ids=["loose-eq-and-hash", "factory"])
def test_lookalike_backends_get_their_own_code(flag_on, make):
    x = torch.ones(3)
    assert torch.equal(torch.compile(double, backend=make(2))(x), x * 4)
    assert torch.equal(torch.compile(double, backend=make(3))(x), x * 6)


def test_a_stateful_backend_sees_its_own_compiles(flag_on):
    from torch._dynamo.testing import CompileCounter

    first, second = CompileCounter(), CompileCounter()
    torch.compile(double, backend=first)(torch.ones(2))
    torch.compile(double, backend=second)(torch.ones(2))
    assert (first.frame_count, second.frame_count) == (1, 1)


class Keyed(Scaled):
    """Opts in: backends with the same key compile alike (the key decides the scale)."""

    def __init__(self, key):
        super().__init__({"two": 2, "three": 3}.get(key, 5))
        self._torchdynamo_cache_key = key


def test_an_explicit_key_shares_code_and_a_falsy_one_does_not(flag_on):
    x = torch.ones(2)
    before = compiles()
    backends = [Keyed(key) for key in ("two", "two", "three", "two")]  # alive: their code is kept
    for backend in backends:
        assert torch.equal(torch.compile(double, backend=backend)(x), x * 2 * backend.scale)
    assert compiles() - before == 2
    backends = [Keyed(key) for key in (None, None, "", "", 0, 0)]
    for backend in backends:
        torch.compile(double, backend=backend)(x)
    assert compiles() - before == 8


@torch._dynamo.backends.registry.register_backend(name="stableguards_test_scaled")
def registered_scaled(gm, example_inputs, options=None):
    scale = (options or {}).get("scale", 1)
    return lambda *args: [out * scale for out in gm.forward(*args)]


def test_a_registered_name_with_equal_options_shares(flag_on):
    x = torch.ones(2)
    before = compiles()
    for scale in (2, 2, 3, 2):
        out = torch.compile(double, backend="stableguards_test_scaled", options={"scale": scale})(x)
        assert torch.equal(out, x * 2 * scale)
    assert compiles() - before == 2
    assert "differs in kwargs['options']['scale']: 3 vs 2" in stableguards.explain()


def test_flag_off_shows_the_false_hit_this_prevents(fresh_dynamo):
    x = torch.ones(3)
    two, three = Scaled(2), Scaled(3)
    torch.compile(double, backend=two)(x)
    assert torch.equal(torch.compile(double, backend=three)(x), x * 4)  # upstream served scale 2


def test_equal_configurations_share_and_switching_back_reuses(flag_on):
    x = torch.randn(4)
    before = compiles()
    torch.compile(double, backend="eager")(x)
    torch.compile(double, backend="eager")(x)
    assert compiles() - before == 1
    torch.compile(double, backend="aot_eager")(x)
    torch.compile(double, backend="eager")(x)
    assert compiles() - before == 2
    assert "compiled for backend" in stableguards.explain()


def nop_compiler(gm, example_inputs):
    return gm.forward


def test_rebuilt_aot_autograd_backend_shares_while_an_equal_one_lives(flag_on):
    x = torch.randn(4)
    before = compiles()
    backends = [aot_autograd(fw_compiler=nop_compiler) for _ in range(3)]
    for backend in backends:
        torch.compile(double, backend=backend)(x)
        torch.compile(double, backend=backend)(x)  # the same object, after it rewrote its options
    assert compiles() - before == 1


def test_dropped_backend_and_its_compiled_code_are_collected(flag_on):
    def local(x):
        return x.sin() + 1

    graphs = []

    class Recording:
        def __call__(self, gm, example_inputs):
            graphs.append(weakref.ref(gm))
            return gm.forward

    backend = Recording()
    backend_ref = weakref.ref(backend)
    compiled = torch.compile(local, backend=backend)
    compiled(torch.randn(3))
    del compiled, backend
    gc.collect()
    assert backend_ref() is None
    assert graphs and graphs[0]() is None
    assert live_entries(local) == []
    assert "released 1 cache entry" in stableguards.explain()


def test_rebuilding_backends_twenty_times_leaks_nothing(flag_on):
    refs = []
    for _ in range(20):
        backend = aot_autograd(fw_compiler=nop_compiler)
        refs.append(weakref.ref(backend))
        torch.compile(double, backend=backend)(torch.randn(3))
        del backend
    gc.collect()
    assert all(r() is None for r in refs)
    assert live_entries(double) == []


def test_recompile_limit_counts_per_backend(flag_on):
    x = torch.ones(2)
    with torch._dynamo.config.patch(recompile_limit=2):
        backends = [Scaled(s) for s in (2, 3, 5, 7)]
        outs = [torch.compile(double, backend=b)(x) for b in backends]
    assert [o[0].item() for o in outs] == [4.0, 6.0, 10.0, 14.0]
    assert len(live_entries(double)) == 4


def test_fingerprint_failure_falls_back_to_upstream(flag_on, monkeypatch, caplog):
    def broken(backend):
        raise RuntimeError("injected")

    monkeypatch.setattr(backends, "backend_fingerprint", broken)
    with caplog.at_level(logging.WARNING, logger="stableguards"):
        assert torch.equal(torch.compile(double, backend="eager")(torch.ones(2)), torch.ones(2) * 2)
    assert "injected" in caplog.text
    assert type(live_entries(double)[0].backend).__name__ == "_TorchCompileWrapper"


def test_flag_off_leaves_cache_entries_to_torch(fresh_dynamo):
    torch.compile(double, backend="eager")(torch.ones(2))
    assert type(live_entries(double)[0].backend).__name__ == "_TorchCompileWrapper"


def test_torch_wrappers_fingerprint_the_same_in_every_process():
    script = ("import torch, stableguards.backends.hooks as i\n"
              "print(i.backend_fingerprint(torch._TorchCompileWrapper('aot_eager', None, {}, None)).digest,"
              " i.backend_fingerprint(torch._TorchCompileInductorWrapper('max-autotune', None, None)).digest)")
    outs = {tuple(subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True,
                                 env=dict(os.environ, PYTHONHASHSEED=seed)).stdout.split()[-2:])
            for seed in ("1", "2")}
    # Both wrappers' digests, compared across the two processes.
    assert len(outs) == 1, outs
    (generic, inductor), = outs
    assert generic != inductor


def test_torch_logs_artifact_prints_explanations():
    script = ("import torch\n"
              "def f(x): return x * 2\n"
              "torch._dynamo.config.stable_guards = True\n"
              "torch.compile(f, backend='eager')(torch.ones(2))\n"
              "torch.compile(f, backend='aot_eager')(torch.ones(2))\n")
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True,
                          env=dict(os.environ, TORCH_LOGS="stableguards"))
    assert "[__stableguards]" in proc.stderr and "compiled for backend" in proc.stderr


def test_explain_names_the_guard_and_source_of_a_recompile(flag_on):
    compiled = torch.compile(double, backend="eager", dynamic=False)
    compiled(torch.ones(2))
    compiled(torch.ones(3))
    text = stableguards.explain()
    assert "double" in text and "recompiled" in text and "tensor 'x' size mismatch" in text


def test_a_backend_that_dies_inside_reset_does_not_crash():
    """reset() can drop the last reference to a backend while it tears down cache
    entries; releasing entries right there touched freed memory.  bench/backend_switch.py
    found it (a segfault), and is the reproducer: it resets between scenarios whose
    compiled code holds its backend."""
    bench = Path(__file__).resolve().parent.parent / "bench" / "backend_switch.py"
    proc = subprocess.run([sys.executable, "-X", "faulthandler", str(bench)], capture_output=True,
                          text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = {cells[0]: cells[1:] for cells in (re.split(r"\s{2,}", line.strip())
                                              for line in proc.stdout.splitlines()[1:])}
    assert rows["backend after del + gc (no reset)"] == ["alive", "collected"], rows
    assert not [name for name, (off, on) in rows.items() if "wrong" in on], rows  # never a wrong result
    assert "wrong" in rows["Scaled(2), Scaled(3), Scaled(2) (loose __eq__)"][0], rows  # flag off: it bites


@pytest.mark.parametrize("backend, registered", [("eager", True), ("aot_eager", True), (Scaled(2), False)])
def test_dynamo_still_sees_whether_the_backend_is_registered(flag_on, backend, registered):
    """Dynamo clears compile-time weakrefs after compiling for registered backends only;
    it asks its own copy of _is_registered_backend about the end of the backend chain."""
    import torch._dynamo.convert_frame as convert_frame

    torch.compile(double, backend=backend)(torch.ones(2))
    [entry] = live_entries(double)
    assert convert_frame._is_registered_backend(entry.backend) is registered


def test_swap_tensors_after_a_compile_works_as_with_the_flag_off(flag_on):
    """Compile-context weakrefs are cleared for registered backends, so a parameter can be swapped."""
    model = torch.nn.Linear(2, 2)
    torch.compile(model, backend="eager")(torch.ones(2))
    torch.utils.swap_tensors(model.weight, torch.nn.Parameter(torch.zeros(2, 2)))
    assert torch.equal(model.weight, torch.zeros(2, 2))


def test_ahead_of_time_compile_calls_the_backend_behind_the_key(flag_on):
    """torch's aot_compile calls the end of the backend chain, the key: it compiles with the
    backend keyed to it, as without the flag (upstream's test_package failed here)."""
    def f(x):
        return x.sin() + 1

    x = torch.randn(4)
    compiled = torch.compile(f, fullgraph=True, backend="eager").aot_compile(((x,), {}))
    torch.testing.assert_close(compiled(x), f(x))
