"""Fail open by construction: an exception injected into any installed hook, or into any
feature's step at a shared seam, leaves the compile working, equal to eager, with one
warning naming it."""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import gc
import itertools
import logging
import os
import random
import threading
import weakref
from collections import OrderedDict, namedtuple
from pathlib import Path

import pytest
import torch
import torch._C._dynamo.eval_frame as c_eval_frame
import torch._dynamo

import stableguards  # noqa: F401 - registers the flag and installs the hooks
from stableguards.events import EVENTS
from stableguards.hooks import RECORDING, SHARED, STATE, hook_tables, seams
from stableguards.warm_start.hooks import folds
from stableguards.hooks.core import HookDoesNotFit, installed_hooks
from stableguards.warm_start.state import STATE as WARM

ALL_HOOKS = [h for hooks in hook_tables().values() for h in hooks]


def train_steps(backend: str) -> None:
    """A train step whose optimizer step is compiled after a graph break, over three batch
    sizes (a recompile, dynamic shapes), checked against an eager twin after each step."""
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    twin = copy.deepcopy(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    twin_opt = torch.optim.SGD(twin.parameters(), lr=0.1, momentum=0.9)

    @torch.compile(backend=backend)
    def step(x, w):
        loss = (model(x) * w).square().sum()  # w's size unified with x's: a symbol replaced
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss

    for n in (3, 5, 7):
        x, w = torch.randn(n, 4), torch.randn(n, 2)
        loss = step(x, w)
        expected = (twin(x) * w).square().sum()
        expected.backward()
        twin_opt.step()
        twin_opt.zero_grad()
        torch.testing.assert_close(loss, expected)
        for p, q in zip(model.parameters(), twin.parameters(), strict=True):
            torch.testing.assert_close(p, q)


def inductor_call() -> None:
    x = torch.randn(8)
    torch.testing.assert_close(torch.compile(lambda t: t.sin() + 1, backend="inductor")(x), x.sin() + 1)


_WARM_RUNS = itertools.count(2)


def _inlined(t):
    return t + 0.5


class _Getter:
    @property
    def scale(self):
        torch._dynamo.graph_break()  # the getter's frame is compiled on its own
        return torch.ones(8).cos() * 2


def warm_start_calls() -> None:
    """Compile for inductor (entries saved; compiles left out: a local class cannot be checked
    by name, random.random() reads a function torch installs per process), then forget this
    process saved them and compile again, as a restarted process would: the entry is loaded
    and installed, and first called under a stance that never compiles.  A new constant
    each run in the saved graph: a kernel this process has not built yet, so inductor's C++
    build path is reached (once: the other graphs' kernels are built once per process).  An
    OrderedDict built again after the graph loads its module by an alias; a property's getter
    compiled on its own is found through its property; a namedtuple's ``__new__`` reads its
    globals through the function."""

    class Local:
        pass

    local = Local()
    scale = float(next(_WARM_RUNS))

    def saved(t):
        return _inlined(t.cos()) * scale

    def left_out(t):
        return t + 1 if isinstance(local, Local) else t - 1

    def rebuilt(t):
        return OrderedDict(a=t * 3.0)

    def drawn(t):
        return t + random.random()

    def broken(t):
        y = t.sin()
        torch._dynamo.graph_break()  # a resume function, which the entry restores
        return y * 3.0

    x = torch.randn(8)
    for run in range(2):
        compiled = torch.compile(saved)
        with torch.compiler.set_stance("eager_on_recompile" if run else "default"):
            torch.testing.assert_close(compiled(x), (x.cos() + 0.5) * scale)
        torch.testing.assert_close(torch.compile(left_out)(x), x + 1)
        torch.testing.assert_close(torch.compile(rebuilt)(x)["a"], x * 3.0)
        random.seed(run)
        got = torch.compile(drawn)(x)
        random.seed(run)
        torch.testing.assert_close(got, x + random.random())
        torch.testing.assert_close(torch.compile(broken)(x), x.sin() * 3.0)
        torch.testing.assert_close(torch.compile(lambda t: t * _Getter().scale)(x), x * torch.ones(8).cos() * 2)
        torch.testing.assert_close(torch.compile(lambda t: t * _Pair(1.0).hi)(x), x * 2.0)
        torch._dynamo.reset()
        WARM.reset()


# A namedtuple with a default: Dynamo inlines its __new__, whose globals are a namespace of its own.
_Pair = namedtuple("_Pair", ["lo", "hi"], defaults=[2.0])


class _Held:
    """An object whose default repr and hash name its address."""


_HELD = _Held()


def warm_start_folds() -> None:
    """Compiles for saved entries that fold values which differ between processes: a string's
    hash and a set constant iterated (the hash seed), a set's repr, an object's default repr
    and hash, an id's repr and an id as a key and as a number, a random generator's state
    (each leaves its entry out, or is a fact of it)."""

    def folded(t):
        for word in {"alpha", "beta", "gamma"}:
            t = t * 2 + len(word)
        first, _ = {1, 2}  # unpacked
        return t + first + hash("abc") % 7 + len(repr({"x", "y"})) + len(repr(frozenset(("x", "y"))))

    def addressed(t):
        return t + len(repr(_HELD)) + len(str(hash(_HELD)))

    def keyed(t):  # an id as a memo key (copy.deepcopy's), and one read as a number
        memo = {id(_HELD): 2.0}
        return t * memo[id(_HELD)] + id(_HELD) % 7

    def shuffled(t):
        order = [1.0, 2.0, 3.0]
        random.shuffle(order)
        return t + order[0] + len(str(id([])))

    x = torch.randn(4)
    torch.testing.assert_close(torch.compile(folded)(x), folded(x))
    torch.testing.assert_close(torch.compile(addressed)(x), addressed(x))
    torch.testing.assert_close(torch.compile(keyed)(x), keyed(x))
    # Dynamo replays the generator's state, and folds the id of an object of its own: not eager's.
    assert torch.compile(shuffled)(x).shape == x.shape
    torch._dynamo.reset()


def warm_start_training() -> None:
    """A training step compiled for a saved entry: its backward compiles on first use."""
    model = torch.nn.Linear(4, 2)
    compiled = torch.compile(lambda x: model(x).sum())
    x = torch.randn(3, 4, requires_grad=True)
    compiled(x).backward()
    expected = x.grad.clone()
    x.grad = None
    model(x).sum().backward()
    torch.testing.assert_close(x.grad, expected)


def warm_start_optimizer_step() -> None:
    """A fresh optimizer's step compiled for a saved entry: Dynamo makes its state while tracing."""
    def make():
        torch.manual_seed(0)
        model = torch.nn.Linear(4, 2)
        model(torch.ones(3, 4)).sum().backward()
        return model, torch.optim.AdamW(model.parameters(), lr=0.1)

    (model, opt), (eager_model, eager_opt) = make(), make()
    torch.compile(opt.step)()
    eager_opt.step()
    torch.testing.assert_close(model.weight, eager_model.weight)


def warm_start_compiled_autograd() -> None:
    """A training step under compiled autograd: compiled autograd traces its backward, and its
    own graph is compiled with flat inputs."""
    model = torch.nn.Linear(4, 2)

    def step(x):
        loss = model(x).sum()
        loss.backward()
        return loss.detach()

    x = torch.randn(3, 4)
    with torch._dynamo.config.patch(compiled_autograd=True):
        torch.compile(step)(x)
    expected = model.weight.grad.clone()
    model.weight.grad = None
    step(x)
    torch.testing.assert_close(model.weight.grad, expected)


@torch._dynamo.assume_constant_result
def _constant():
    return 3.0


def warm_start_constants() -> None:
    x = torch.randn(4)
    torch.testing.assert_close(torch.compile(lambda t: t * _constant())(x), x * 3.0)


class _Twice(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x * 2

    @staticmethod
    def backward(ctx, grad):
        return grad * 2


@torch.fx.wrap
def _halved(t):
    return t * 0.5


def _sac_context():
    from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

    return create_selective_checkpoint_contexts(lambda ctx, op, *a, **k: CheckpointPolicy.PREFER_RECOMPUTE)


def autograd_cache_calls() -> None:
    """Graphs torch's AOTAutograd cache would bypass: a custom autograd.Function, a checkpointing
    policy, saved-tensor hook graphs with a wrapped function and a method."""
    from torch.utils.checkpoint import checkpoint

    pack, unpack = torch.fx.symbolic_trace(lambda t: _halved(t)), torch.fx.symbolic_trace(lambda t: t.mul(2.0))
    cases = [lambda t: _Twice.apply(t).sin().sum(),
             lambda t: checkpoint(torch.sin, t, use_reentrant=False, context_fn=_sac_context).sum(),
             lambda t: (t.sin() * t).sum()]
    for i, fn in enumerate(cases):
        x = torch.randn(8, requires_grad=True)
        hooks = torch.autograd.graph.saved_tensors_hooks(pack, unpack) if i == 2 else contextlib.nullcontext()
        with hooks:
            torch.compile(fn)(x).backward()
            expected, x.grad = x.grad, None
            fn(x).backward()
        torch.testing.assert_close(x.grad, expected)


def _inductor_unsaved(gm, example_inputs):
    """inductor under another name: a backend warm start does not save, so that AOTAutograd's
    entries are not bundled and load their graphs through inductor's cache."""
    from torch._inductor.compile_fx import compile_fx

    return compile_fx(gm, example_inputs)


def store_calls() -> None:
    """With a shared store named, a training step compiled twice: the second time from
    AOTAutograd's cache, whose entry loads its graphs through inductor's."""
    from unittest import mock

    model = torch.nn.Linear(4, 2)
    x = torch.randn(3, 4, requires_grad=True)
    store = str(Path(os.environ["TORCHINDUCTOR_CACHE_DIR"]) / "store")
    with mock.patch.dict("os.environ", {"STABLEGUARDS_STORE": store}):
        for _ in range(2):
            torch._dynamo.reset()
            torch.compile(lambda t: model(t).sum(), backend=_inductor_unsaved)(x).backward()
            expected, x.grad = x.grad, None
            model(x).sum().backward()
            torch.testing.assert_close(x.grad, expected)
            x.grad = None


def kernel_build_calls() -> None:
    """With a shared store named, a kernel this process has not built (a size of its own, static)."""
    from unittest import mock

    x = torch.randn(random.randrange(1000, 100_000))
    store = str(Path(os.environ["TORCHINDUCTOR_CACHE_DIR"]) / "store")
    with mock.patch.dict("os.environ", {"STABLEGUARDS_STORE": store}):
        torch._dynamo.reset()
        torch.testing.assert_close(torch.compile(lambda t: t * 3 + 1, backend="inductor", dynamic=False)(x),
                                   x * 3 + 1)


_LIBRARIES = []


def custom_operator_registration() -> None:
    """A custom operator defined and given a kernel (a namespace of its own each time)."""
    lib = torch.library.Library(f"sg_fail_open_{len(_LIBRARIES)}", "DEF")
    _LIBRARIES.append(lib)
    lib.define("twice(Tensor x) -> Tensor")
    lib.impl("twice", lambda t: t * 2, "CompositeImplicitAutograd")
    assert getattr(torch.ops, lib.ns).twice(torch.ones(2)).tolist() == [2.0, 2.0]


def distributed_calls() -> None:
    """In a one-rank gloo group: a DDP model compiled under DDPOptimizer (torch's default), and
    a function that reads its process group's rank."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        model = DistributedDataParallel(torch.nn.Linear(4, 2))
        torch.compile(model, backend="eager")(torch.randn(3, 4)).sum().backward()
        x = torch.ones(2)
        assert torch.equal(torch.compile(lambda t: t * (dist.group.WORLD.rank() + 1))(x), x)
    finally:
        dist.destroy_process_group()


def workload_for(hook) -> None:
    if hook.target in ("ConvertFrame._clone_with_backend", "CustomClassObjectVariable.call_method"):
        distributed_calls()
    elif hook.target == "Library.impl":
        custom_operator_registration()
    elif hook.target in ("CppBuilder.__init__", "CppBuilder.build"):
        kernel_build_calls()
    elif hook.part == "store":
        store_calls()
    elif hook.part == "autograd_cache" or hook.target == "CheckpointHigherOrderVariable._call_function":
        autograd_cache_calls()
    elif hook.target == "_AutogradBackwardCompiler.get_or_compile":
        warm_start_training()
    elif hook.target in ("GmWrapper.__init__", "_aot_stage2c_make_autograd_function",
                         "AutogradCompilerInstance.proxy_call_aot_backward"):
        warm_start_compiled_autograd()
    elif hook.target == "OptimizerVariable.get_python_args":
        warm_start_optimizer_step()
    elif hook in folds.HOOKS:
        warm_start_folds()
    elif hook.target == "invoke_and_store_as_constant":
        warm_start_constants()
    elif hook.part == "warm_start":
        warm_start_calls()
    elif hook.module.startswith(("torch._inductor", "torch._functorch")):
        inductor_call()
    else:
        train_steps("eager")


@pytest.mark.parametrize("hook", ALL_HOOKS, ids=lambda h: h.name)
def test_an_exception_in_any_hook_falls_back_to_torch(hook, monkeypatch, caplog, tmp_path):
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "preload"))
    if hook.lazy and hook not in installed_hooks():
        inductor_call()  # loads inductor, and with it the lazy hook points
    # A cache the workload has not filled: hooks on cache saves must be reached.
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "run"))
    if hook not in installed_hooks():
        pytest.skip(f"{hook.name} is not installed in this torch")
    calls = []

    def injected(call, *args, **kwargs):
        calls.append(1)
        raise RuntimeError(f"injected into {hook.name}")

    monkeypatch.setattr(hook, "impl", injected)
    torch._dynamo.reset()
    with torch._dynamo.config.patch(stable_guards=True), caplog.at_level(logging.WARNING, "stableguards"):
        workload_for(hook)
    torch._dynamo.reset()
    warnings = [r for r in caplog.records if "injected" in r.getMessage()]
    if not calls:
        # Only cudagraph recordings are never reached on a machine without CUDA.
        assert hook.module == "torch._inductor.cudagraph_trees", f"{hook.name} was never called"
        return
    assert len(warnings) == 1 and hook.name in warnings[0].getMessage()
    assert EVENTS.counters["fallbacks"] == len(calls)


# The steps torch's seams run (the signals between parts are reached through those).
SEAM_STEPS = [step for slot in seams.SLOTS if not slot.name.startswith(("graph.", "entry."))
              for step in seams.steps(slot.name)]


@pytest.mark.parametrize("step", SEAM_STEPS, ids=lambda s: f"{s.name} ({s.part})")
def test_an_exception_in_any_step_at_a_shared_seam_falls_back_to_torch(step, monkeypatch, caplog, tmp_path):
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    if step.part not in STATE.installed:
        pytest.skip(f"{step.part} is not installed in this torch")
    calls = []

    def injected(*args, **kwargs):
        calls.append(1)
        raise RuntimeError(f"injected into {step.name}")

    monkeypatch.setitem(seams.FILLED[step.slot], step.part, dataclasses.replace(step, fn=injected))
    torch._dynamo.reset()
    with torch._dynamo.config.patch(stable_guards=True), caplog.at_level(logging.WARNING, "stableguards"):
        warm_start_calls() if step.part == "warm_start" else train_steps("eager")
    torch._dynamo.reset()
    warnings = [r.getMessage() for r in caplog.records if "injected" in r.getMessage()]
    assert calls, f"{step.name} was never called"
    assert len(warnings) == 1 and f"{step.name} ({step.part})" in warnings[0]
    assert EVENTS.counters["fallbacks"] == len(calls)


def test_every_slot_is_filled_by_the_parts_it_lists_and_a_missing_step_fails_install(monkeypatch):
    seams.check_slots()
    slot = seams.SLOTS[0]
    monkeypatch.setitem(seams.FILLED, slot.name, {})
    with pytest.raises(HookDoesNotFit, match=slot.name):
        seams.check_slots()


def test_every_hook_point_is_declared_in_a_table():
    installed = installed_hooks()
    assert installed and all(h in ALL_HOOKS for h in installed)
    tables = hook_tables()
    assert all(h.part == part for part, hooks in tables.items() if part not in (SHARED, RECORDING) for h in hooks)
    assert all(h.part is None for h in tables[SHARED] + tables[RECORDING])
    assert all(h.records for h in tables[RECORDING]) and not any(h.records for h in ALL_HOOKS
                                                                  if h not in tables[RECORDING])
    # A seam has one hook: the shared ones' owner, or one part's.
    assert all(len(seam.hooks) == 1 for seam in STATE.seams.values())


def test_releases_wait_while_another_thread_compiles(fresh_dynamo):
    """A backend collected on one thread while another holds Dynamo's compile lock: its
    entries are released only once no thread is compiling."""
    import torch._dynamo.convert_frame as convert_frame

    def f(x):
        return x * 3

    class Backend:
        def __call__(self, gm, example_inputs):
            return gm.forward

    backend = Backend()
    backend_ref = weakref.ref(backend)
    with torch._dynamo.config.patch(stable_guards=True):
        torch.compile(f, backend=backend)(torch.ones(2))
    live = lambda: [e for e in c_eval_frame._debug_get_cache_entry_list(f.__code__) if e.code is not None]  # noqa: E731
    assert len(live()) == 1

    holding, done = threading.Event(), threading.Event()

    def compiling():
        with convert_frame.compile_lock:
            holding.set()
            done.wait(timeout=30)

    other = threading.Thread(target=compiling)
    other.start()
    holding.wait(timeout=30)
    try:
        del backend
        gc.collect()
        assert backend_ref() is None
        assert STATE.pending_releases == 1 and len(live()) == 1  # the other thread is compiling
        STATE.release_pending()
        assert len(live()) == 1
    finally:
        done.set()
        other.join()
    STATE.release_pending()
    assert STATE.pending_releases == 0 and live() == []
