"""Optimizer steps with the flag on: fewer guards, no O(N^2) write-back, scheduled
hyperparameters that still cost one recompile and none on restart, static grads, and
code that dies with its optimizer.

Every compiled result is compared with an eager twin on the same grads.
"""

from __future__ import annotations

import collections
import gc
import os
import subprocess
import sys
import weakref
from pathlib import Path

import pytest
import torch

import stableguards
from stableguards.optimizers.lives import OptimizerLives, has_static_grad, static_grads

ROOT = Path(__file__).resolve().parent.parent


# --- plain logic ---------------------------------------------------------------------


def test_optimizer_lives_reports_live_entries_when_the_optimizer_dies():
    class Token:
        pass

    deaths = []
    lives = OptimizerLives(lambda description, tokens: deaths.append((description, tokens)))
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(2))], lr=0.1)
    kept, dropped = Token(), Token()
    lives.depend(opt, kept)
    lives.depend(opt, dropped)
    del dropped
    assert lives.tracked() == 1 and deaths == []
    del opt
    gc.collect()
    assert lives.tracked() == 0
    [(description, tokens)] = deaths
    assert description.startswith("SGD at 0x") and "1 param(s)" in description
    assert tokens == [kept]


def test_static_grads_keeps_addresses_through_zero_grad():
    a, b = torch.nn.Parameter(torch.ones(3)), torch.nn.Parameter(torch.ones(3))
    opt = torch.optim.SGD([a], lr=0.1)
    a.grad = torch.full((3,), 2.0)
    static_grads(opt)
    opt.add_param_group({"params": [b]})
    b.grad = torch.ones(3)
    address = a.grad.data_ptr()
    opt.zero_grad()  # set_to_none=True by default
    assert a.grad is not None and a.grad.data_ptr() == address and a.grad.eq(0).all()
    assert b.grad is None  # not made static: torch's behaviour
    assert has_static_grad(a) and not has_static_grad(b)
    static_grads(opt)  # twice: zero_grad is wrapped once
    opt.zero_grad(set_to_none=True)
    assert b.grad is not None and b.grad.eq(0).all()
    alive = weakref.ref(opt)
    gc.disable()  # the wrapped zero_grad must not make a cycle that only gc can break
    try:
        del opt
        assert alive() is None
    finally:
        gc.enable()


class SGDKeepingItsDict(torch.optim.SGD):
    """An optimizer whose copies and pickles carry every instance attribute."""

    def __getstate__(self):
        return dict(self.__dict__)


@pytest.mark.parametrize("cls", [torch.optim.SGD, SGDKeepingItsDict])
def test_static_grads_survive_deepcopy_and_torch_save(cls):
    import copy
    import io

    a = torch.nn.Parameter(torch.ones(3))
    opt = cls([a], lr=0.1)
    a.grad = torch.full((3,), 2.0)
    static_grads(opt)
    twin = copy.deepcopy(opt)
    twin.zero_grad()
    assert a.grad.eq(2).all()  # the original's grads are the original's business
    buffer = io.BytesIO()
    torch.save(opt, buffer)
    buffer.seek(0)
    loaded = torch.load(buffer, weights_only=False)
    loaded.zero_grad()
    assert a.grad.eq(2).all()
    if cls is SGDKeepingItsDict:  # the in-place zero_grad came along, bound to its new owner
        assert twin.zero_grad._optimizer() is twin and loaded.zero_grad._optimizer() is loaded


# --- under Dynamo ------------------------------------------------------------------


def _params(n, shape=(4,)):
    torch.manual_seed(0)
    return [torch.nn.Parameter(torch.randn(shape)) for _ in range(n)]


def _twins(cls, n, **kwargs):
    ps = _params(n)
    twin = [torch.nn.Parameter(p.detach().clone()) for p in ps]
    return cls(ps, **kwargs), cls(twin, **kwargs)


def _set_grads(*opts, seed):
    g = torch.Generator().manual_seed(seed)
    for group in zip(*(o.param_groups[0]["params"] for o in opts), strict=True):
        grad = torch.randn(group[0].shape, generator=g)
        for p in group:
            p.grad = grad.clone()


def _assert_same(opt, twin):
    for p, q in zip(opt.param_groups[0]["params"], twin.param_groups[0]["params"], strict=True):
        torch.testing.assert_close(p, q, rtol=1e-4, atol=1e-5)
        for key, value in opt.state[p].items():
            torch.testing.assert_close(value, twin.state[q][key], rtol=1e-4, atol=1e-5)


def _leaf_guards(code_name="step"):
    """C++ leaf guards, by kind, of the live cache entries of optimizer step frames."""
    import torch._C._dynamo.eval_frame as c_eval_frame
    from stableguards.hooks.guard_tree import leaf_guard_kinds
    from torch._dynamo.convert_frame import input_codes

    kinds = collections.Counter()
    for ref in list(input_codes.seen):
        code = ref()
        if code is not None and code.co_name == code_name and "optim" in code.co_filename:
            for entry in c_eval_frame._debug_get_cache_entry_list(code):
                if entry.code is not None:
                    kinds += leaf_guard_kinds(entry.guard_manager.root)
    return kinds


def _run_adam(flag, n=6, steps=4):
    opt, twin = _twins(torch.optim.Adam, n, lr=0.01)
    with torch._dynamo.config.patch(stable_guards=flag):
        step = torch.compile(opt.step, backend="eager")
        for i in range(steps):
            _set_grads(opt, twin, seed=i)
            step()
            twin.step()
            _assert_same(opt, twin)
    return _leaf_guards()


def test_state_tensors_are_guarded_by_their_dicts_version(fresh_dynamo):
    off = _run_adam(False)
    torch._dynamo.reset()
    stableguards.reset()
    on = _run_adam(True)
    n = 6
    # Upstream: ID_MATCH on the param and its exp_avg, exp_avg_sq and step.
    assert off["ID_MATCH"] - on["ID_MATCH"] == 3 * n
    assert on["DICT_VERSION"] == n
    assert sum(on.values()) < sum(off.values())
    assert stableguards.EVENTS.counters["optimizer_state_dicts_versioned"] == n


@pytest.mark.parametrize("backend", ["eager", "inductor"])
def test_replacing_a_state_tensor_recompiles_and_stays_correct(fresh_dynamo, backend):
    """The version check is what stands between a replaced state tensor and a graph
    that updates the old one in place; inductor bakes the old one in, so it must hold."""
    stableguards.reset()
    opt, twin = _twins(torch.optim.Adam, 3, lr=0.01)
    with torch._dynamo.config.patch(stable_guards=True):
        step = torch.compile(opt.step, backend=backend)
        for i in range(5):
            _set_grads(opt, twin, seed=i)
            if i == 3:  # a new object in opt.state[p]: the dict's version changes
                for o in (opt, twin):
                    p = o.param_groups[0]["params"][1]
                    o.state[p]["exp_avg"] = torch.full_like(o.state[p]["exp_avg"], 0.5)
            step()
            twin.step()
            _assert_same(opt, twin)
    assert stableguards.EVENTS.counters["optimizer_state_dicts_versioned"] > 0


def test_sgd_momentum_write_back_does_not_walk_the_state_dict(fresh_dynamo, monkeypatch):
    import torch._dynamo.utils as dynamo_utils

    walks = []
    original = dynamo_utils.dict_keys_getitem
    monkeypatch.setattr(dynamo_utils, "dict_keys_getitem", lambda d, n: walks.append(n) or original(d, n))

    def steady_walks(flag):
        torch._dynamo.reset()
        opt, twin = _twins(torch.optim.SGD, 8, lr=0.1, momentum=0.9)
        with torch._dynamo.config.patch(stable_guards=flag):
            step = torch.compile(opt.step, backend="eager")
            for i in range(4):
                _set_grads(opt, twin, seed=i)
                walks.clear()
                step()
                twin.step()
                _assert_same(opt, twin)
        return len(walks)

    # Upstream writes every momentum buffer back, finding opt.state[p] by position.
    assert steady_walks(False) >= 8
    assert steady_walks(True) == 0


def _schedule(flag, cls, backend="eager", cycle_momentum=True, **kwargs):
    from torch._dynamo.utils import counters

    opt, twin = _twins(cls, 3, lr=0.01, **kwargs)
    schedules = [torch.optim.lr_scheduler.OneCycleLR(o, max_lr=0.1, total_steps=20, cycle_momentum=cycle_momentum)
                 for o in (opt, twin)]
    # A compiled function that calls opt.step(), as training loops do.  (Compiling
    # opt.step itself specializes differently: upstream does not recompile there.)
    step = torch.compile(lambda: opt.step(), backend=backend)
    with torch._dynamo.config.patch(stable_guards=flag):
        for i in range(12):
            _set_grads(opt, twin, seed=i)
            step()
            twin.step()
            for s in schedules:
                s.step()
            _assert_same(opt, twin)
            # What the scheduler wrote stays what it wrote: the graph's copy is stableguards'.
            assert all(type(g["lr"]) is float for g in opt.param_groups)
    assert opt.state_dict()["param_groups"] == twin.state_dict()["param_groups"]
    return counters["stats"]["unique_graphs"]


@pytest.mark.parametrize("cls, kwargs", [(torch.optim.SGD, {"momentum": 0.9}), (torch.optim.AdamW, {})])
def test_scheduled_hyperparameters_cost_one_recompile(fresh_dynamo, cls, kwargs):
    from torch._dynamo.utils import counters

    counters.clear()
    off = _schedule(False, cls, **kwargs)
    torch._dynamo.reset()
    counters.clear()
    on = _schedule(True, cls, **kwargs)
    assert on == off == 2  # the first step, and one recompile (torch 2.13 to 2.15)


@pytest.mark.parametrize("cls, kwargs", [
    (torch.optim.SGD, {"momentum": 0.9}),  # alpha=-lr, momentum cycled
    (torch.optim.Adam, {}),  # beta1 cycled: lerp weight, beta1 ** step
    (torch.optim.AdamW, {"foreach": True}),  # foreach ops, beta1 cycled: foreach lerp
])
def test_scheduled_hyperparameters_under_inductor_cost_one_recompile(fresh_dynamo, cls, kwargs):
    """Upstream specializes these floats under inductor (a recompile per change: 8 graphs
    in 12 steps, then eager).  Flag on, the step stays compiled and equals eager: its first
    graph, and at most one recompile (SGD's momentum buffers appear after the first step;
    Adam's and AdamW's count is 1 alone and 2 after the tests before it in one process)."""
    from torch._dynamo.utils import counters

    counters.clear()
    assert _schedule(True, cls, backend="inductor", **kwargs) <= 2
    assert stableguards.EVENTS.counters["hyperparameter_uses_lifted"] >= 1


@pytest.mark.parametrize("fallback_random", [False, True])
def test_a_hyperparameter_guarded_inside_aot_is_specialized_not_cached(fresh_dynamo, fallback_random):
    """Inductor's own foreach-lerp decomposition pins beta1 with a guard AOTAutograd's
    cache would drop: a later compile hit that entry and ran every step with the first
    beta1 (1e-3 off after 5 steps).  stableguards decomposes it without the pin, except
    under ``fallback_random`` (another table): there the float is specialized, each change
    recompiles (as upstream), and either way every step equals eager."""
    import torch._inductor.config as inductor_config
    from torch._dynamo.utils import counters

    counters.clear()
    stableguards.reset()
    opt, twin = _twins(torch.optim.Adam, 3, lr=0.01, foreach=True)
    step = torch.compile(lambda: opt.step(), backend="inductor")
    with torch._dynamo.config.patch(stable_guards=True), inductor_config.patch(fallback_random=fallback_random):
        for i in range(6):
            _set_grads(opt, twin, seed=i)
            step()
            twin.step()
            _assert_same(opt, twin)
            for o in (opt, twin):
                o.param_groups[0]["betas"] = (0.9 - 0.01 * i, 0.999)
    graphs = counters["stats"]["unique_graphs"]
    if fallback_random and stableguards.EVENTS.counters["hyperparameters_specialized"]:
        # torch 2.14's and 2.15's decomposition pins the weight: specialized, a graph per beta1 (5)
        assert graphs == 5
    else:  # unpinned (2.13's decomposition), or decomposed without the pin: no graph per change
        assert graphs <= 2  # the first, and at most one recompile (as the tests before it left Dynamo)


@pytest.mark.parametrize("backend", ["eager", "inductor"])
def test_scheduled_hyperparameters_do_not_recompile_on_a_warm_restart(tmp_path, backend):
    env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=str(tmp_path), TORCH_COMPILE_JOB_ID="optimizer-warm",
               TORCHDYNAMO_STABLE_GUARDS="1")
    runs = [subprocess.run([sys.executable, str(ROOT / "tests" / "_optimizer_child.py"), backend], env=env,
                           capture_output=True, text=True, timeout=300) for _ in range(2)]
    for run in runs:
        assert run.returncode == 0, run.stderr[-3000:]
    cold, warm = (int(r.stdout.split("recompiles=")[1].split()[0]) for r in runs)
    assert cold == 1
    assert warm == 0
    assert "equal=True" in runs[1].stdout


def test_optimizer_state_and_graph_are_freed_without_reset(fresh_dynamo):
    holder, graphs = {}, []

    def backend(gm, example_inputs):
        graphs.append(weakref.ref(gm))
        return gm.forward

    ps = _params(3)
    with torch._dynamo.config.patch(stable_guards=True):

        @torch.compile(backend=backend)
        def train_step():
            holder["opt"].step()

        holder["opt"] = torch.optim.Adam(ps, lr=0.01)
        for p in ps:
            p.grad = torch.ones_like(p)
        train_step()
        train_step()
        opt = holder.pop("opt")
        dead = [weakref.ref(opt)] + [weakref.ref(t) for s in opt.state.values() for t in s.values()]
        held = [r() for r in graphs if r() is not None]  # something else holds the graphs
        assert held
        del opt
        gc.collect()
        assert all(r() is None for r in dead)  # state freed although the graphs live
        assert stableguards.EVENTS.counters["optimizer_entries_released"] >= 1
        del held
        gc.collect()
        assert all(r() is None for r in graphs)
        assert train_step is not None  # the compiled function lives on


def test_rebuilt_optimizers_never_reach_the_recompile_limit(fresh_dynamo):
    from torch._dynamo.utils import counters

    holder = {}

    @torch.compile(backend="eager")
    def train_step():
        holder["opt"].step()

    ps = _params(3)
    twin_ps = [torch.nn.Parameter(p.detach().clone()) for p in ps]
    counters.clear()
    with torch._dynamo.config.patch(stable_guards=True, recompile_limit=8):
        for i in range(20):
            holder["opt"] = torch.optim.Adam(ps, lr=0.01)
            twin = torch.optim.Adam(twin_ps, lr=0.01)
            _set_grads(holder["opt"], twin, seed=i)
            train_step()
            twin.step()
            _assert_same(holder["opt"], twin)
    # One compile of the step per optimizer: none ran eagerly for want of cache room.
    assert counters["stats"]["unique_graphs"] == 20, stableguards.explain()
    assert stableguards.EVENTS.counters["optimizer_entries_released"] >= 19


def test_rebuilding_the_optimizer_leaves_no_fakes_behind(fresh_dynamo):
    """Each step compile's fakes and ShapeEnv form a cycle through C++ (a fake param's
    grad) that gc cannot collect unless the output graph's tracked fakes are cleared:
    torch 2.13 and 2.14 kept 50 tensors and one ShapeEnv per rebuild of Adam over 10 params."""
    from torch._subclasses.fake_tensor import FakeTensor
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    holder = {}

    @torch.compile(backend="eager")
    def train_step():
        holder["opt"].step()

    def live() -> tuple[int, int]:
        gc.collect()
        objects = gc.get_objects()
        return (sum(isinstance(o, FakeTensor) for o in objects), sum(type(o) is ShapeEnv for o in objects))

    ps = _params(10)
    counts = []
    with torch._dynamo.config.patch(stable_guards=True):
        for i in range(12):
            holder["opt"] = torch.optim.Adam(ps, lr=0.01)
            for p in ps:
                p.grad = torch.randn_like(p)
            train_step()
            train_step()
            del holder["opt"]
            counts.append(live())
    assert counts[-1] == counts[3], counts


def test_flag_off_leaves_upstream_guards(fresh_dynamo):
    """Flag off, the step keeps upstream's guards: an identity check on every parameter and
    its exp_avg, exp_avg_sq and step, and no dict-version guard."""
    stableguards.reset()
    n = 6
    guards = _run_adam(False, n=n)
    assert guards["DICT_VERSION"] == 0 and guards["ID_MATCH"] >= 4 * n, guards
    assert stableguards.EVENTS.counters["optimizer_state_dicts_versioned"] == 0


def test_grad_strides_changing_under_inductor(fresh_dynamo):
    """Upstream guards optimizer grads only for not being None; inductor's code then
    asserts the old strides.  With the flag on, the step recompiles and matches eager."""
    torch.manual_seed(0)
    p = torch.nn.Parameter(torch.randn(3, 4))
    q = torch.nn.Parameter(p.detach().clone())
    from torch._dynamo.utils import counters

    opt, twin = torch.optim.SGD([p], lr=0.1), torch.optim.SGD([q], lr=0.1)
    compiled = []
    with torch._dynamo.config.patch(stable_guards=True):
        step = torch.compile(opt.step, backend="inductor")
        for transpose in (False, False, True):
            g = torch.randn(4, 3).t() if transpose else torch.randn(3, 4)
            p.grad, q.grad = g, g.clone()
            step()
            twin.step()
            torch.testing.assert_close(p, q)
            compiled.append(counters["frames"]["ok"])
    # The same strides again: no compile; the transposed grad: a recompile.
    assert compiled[1] == compiled[0] and compiled[2] > compiled[1], compiled
