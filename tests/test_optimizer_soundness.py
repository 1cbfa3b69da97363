"""Compiled optimizer steps stay equal to eager ones with stable_guards on.

A compiled optimizer and its eager twin (copies of the same parameters, the same
class and hyperparameters) go through the same steps, grad changes, state-dict
round trips, state and hyperparameter mutations; after every change both must
hold equal parameters and equal optimizer state.  A guard that lets a stale
compiled step run after such a change shows up here as a mismatch.

STABLEGUARDS_STATEFUL_EXAMPLES=200 runs the state machines longer.
"""

from __future__ import annotations

import contextlib
import copy
import inspect
import itertools
import os
import warnings

import pytest
import torch
import torch._dynamo
import torch._dynamo.testing
from hypothesis import HealthCheck, reject, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

import stableguards  # noqa: F401  (registers the flag)

# Upstream compiled steps compute step-dependent scalars (bias corrections, RAdam's
# rectification) in float32 tensors where eager uses Python floats: flag off, 40 steps drift
# up to 4e-5 relative (RAdam), 7e-6 (Adam).  A stale guard is off by far more (1e-3 and up).
RTOL, ATOL = 1e-4, 1e-5
LONG = os.environ.get("STABLEGUARDS_STATEFUL_EXAMPLES")
EXAMPLES = int(LONG or 20)
SHAPES = [(3,), (2, 3)]
MAX_PARAMS = 4

# name -> (class, constructor arguments); every class here has ``_init_group``.
OPTIMIZERS = {
    "SGD": (torch.optim.SGD, {"lr": 0.1}),
    "SGD-momentum": (torch.optim.SGD, {"lr": 0.1, "momentum": 0.9, "weight_decay": 0.01}),
    "SGD-nesterov": (torch.optim.SGD, {"lr": 0.1, "momentum": 0.9, "nesterov": True}),
    "Adam": (torch.optim.Adam, {"lr": 0.01}),
    "Adam-amsgrad": (torch.optim.Adam, {"lr": 0.01, "amsgrad": True, "weight_decay": 0.01}),
    "AdamW": (torch.optim.AdamW, {"lr": 0.01}),
    "RMSprop": (torch.optim.RMSprop, {"lr": 0.01}),
    "RMSprop-centered": (torch.optim.RMSprop, {"lr": 0.01, "momentum": 0.5, "centered": True}),
    "Adagrad": (torch.optim.Adagrad, {"lr": 0.1}),
    "Adamax": (torch.optim.Adamax, {"lr": 0.01}),
    "NAdam": (torch.optim.NAdam, {"lr": 0.01}),
    "RAdam": (torch.optim.RAdam, {"lr": 0.01}),
    "Adadelta": (torch.optim.Adadelta, {}),
    "ASGD": (torch.optim.ASGD, {"lr": 0.01, "t0": 2}),
    "Rprop": (torch.optim.Rprop, {"lr": 0.01}),
}
SCHEDULERS = [None, "step", "exponential", "onecycle"]
GRAD_MODES = ["replace", "accumulate", "transposed", "strided"]
STATE_CHANGES = ["clone", "changed", "inplace"]
SEEDS = st.integers(0, 2**16)


class EagerRaised(Exception):
    """The eager twin refused the operation: the sequence is invalid, not the compile."""


def make_grad(g: torch.Tensor, mode: str) -> torch.Tensor:
    if mode == "transposed" and g.dim() == 2:
        return g.t().contiguous().t()  # same values, strides that differ from a fresh tensor
    if mode == "strided":
        return torch.stack([g, g], dim=-1)[..., 0]  # a non-contiguous view
    return g.clone()


def make_scheduler(kind, opt):
    if kind is None:
        return None
    if kind == "step":
        return torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
    if kind == "exponential":
        return torch.optim.lr_scheduler.ExponentialLR(opt, gamma=0.9)
    cycle = "momentum" in opt.defaults or "betas" in opt.defaults
    return torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=0.05, total_steps=1000, cycle_momentum=cycle)


def assert_same(a, b, where: str) -> None:
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        assert isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor), f"{where}: {a!r} vs {b!r}"
        torch.testing.assert_close(a, b, rtol=RTOL, atol=ATOL, msg=lambda m: f"{where}: {m}")
    elif isinstance(a, (tuple, list)):
        assert type(a) is type(b) and len(a) == len(b), f"{where}: {a!r} vs {b!r}"
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same(x, y, f"{where}[{i}]")
    else:
        assert a == b, f"{where}: {a!r} vs {b!r}"


class Twins:
    """A compiled optimizer and its eager twin, only ever changed together."""

    def __init__(self, name="Adam", shapes=((3,), (2, 3)), *, seed=0, foreach=None, maximize=False,
                 tensor_lr=False, scheduler=None, backend="eager"):
        self.name = name
        self.cls, kwargs = OPTIMIZERS[name]
        self.kwargs = dict(kwargs)
        if foreach is not None:
            self.kwargs["foreach"] = foreach
        if maximize:
            self.kwargs["maximize"] = True
        self.tensor_lr = tensor_lr
        gen = torch.Generator().manual_seed(seed)
        self.params = [torch.nn.Parameter(torch.randn(s, generator=gen)) for s in shapes]
        self.twin_params = [torch.nn.Parameter(p.detach().clone()) for p in self.params]
        try:
            self.twin = self._build(self.twin_params)
            self.twin_sched = make_scheduler(scheduler, self.twin)
        except (ValueError, RuntimeError) as e:  # e.g. a tensor lr with foreach=True
            raise EagerRaised(e) from e
        self.opt = self._build(self.params)
        self.sched = make_scheduler(scheduler, self.opt)
        # The compiled function finds the optimizer through the holder, so it sees rebuilds.
        self.holder = {"opt": self.opt}
        holder = self.holder
        self.step_fn = torch.compile(lambda: holder["opt"].step(), backend=backend)

    def _build(self, params, groups=None):
        kwargs = dict(self.kwargs)
        if self.tensor_lr:
            kwargs["lr"] = torch.tensor(kwargs.get("lr", 1.0))
        return self.cls(groups if groups is not None else params, **kwargs)

    def _both(self):
        return ((self.opt, self.params, self.sched), (self.twin, self.twin_params, self.twin_sched))

    # --- the operations -------------------------------------------------------------
    def step(self) -> None:
        try:
            self.twin.step()
        except Exception as e:
            with contextlib.suppress(Exception):
                self.step_fn()
            raise EagerRaised(e) from e
        try:
            self.step_fn()
        except Exception as e:
            raise AssertionError(f"the compiled step raised but the eager one did not: {e!r}") from e

    def set_grads(self, seed: int, mode: str = "replace") -> None:
        gen = torch.Generator().manual_seed(seed)
        for p, q in zip(self.params, self.twin_params):
            g = torch.randn(p.shape, generator=gen)
            for t in (p, q):
                if mode == "accumulate" and t.grad is not None:
                    t.grad += g
                else:
                    t.grad = make_grad(g, mode)

    def drop_grad(self, i: int) -> None:
        self.params[i].grad = None
        self.twin_params[i].grad = None

    def zero_grad(self, set_to_none: bool) -> None:
        self.opt.zero_grad(set_to_none=set_to_none)
        self.twin.zero_grad(set_to_none=set_to_none)

    def add_param_group(self, shape, seed: int, lr=None) -> None:
        p = torch.nn.Parameter(torch.randn(shape, generator=torch.Generator().manual_seed(seed)))
        q = torch.nn.Parameter(p.detach().clone())
        for opt, params, new in ((self.opt, self.params, p), (self.twin, self.twin_params, q)):
            group = {"params": [new]}
            if lr is not None:
                group["lr"] = torch.tensor(lr) if self.tensor_lr else lr
            opt.add_param_group(group)
            params.append(new)

    def round_trip(self) -> None:
        self.opt.load_state_dict(self.opt.state_dict())
        self.twin.load_state_dict(self.twin.state_dict())

    def load_twin_copy(self) -> None:
        self.opt.load_state_dict(copy.deepcopy(self.twin.state_dict()))
        self.twin.load_state_dict(copy.deepcopy(self.twin.state_dict()))

    def rebuild(self) -> None:
        """A new optimizer over the same groups, loaded from the old one; schedulers go."""
        for old_name, params in (("opt", self.params), ("twin", self.twin_params)):
            old = getattr(self, old_name)
            new = self._build(params, [{"params": list(g["params"])} for g in old.param_groups])
            new.load_state_dict(old.state_dict())
            setattr(self, old_name, new)
        self.holder["opt"] = self.opt
        self.sched = self.twin_sched = None

    def state_keys(self) -> list[tuple[int, str]]:
        """(param index, key) of every tensor in the state."""
        return [(i, k) for i, p in enumerate(self.params) for k, v in self.opt.state.get(p, {}).items()
                if isinstance(v, torch.Tensor)]

    def set_state(self, i: int, key: str, how: str) -> None:
        """Assign a clone or a changed copy of a state tensor, or change it in place."""
        for opt, params, _ in self._both():
            old = opt.state[params[i]][key]
            if how == "clone":
                opt.state[params[i]][key] = old.clone()
            elif how == "inplace" and key == "step":
                old.add_(1)
            elif how == "inplace":
                old.mul_(0.5)
            else:  # halving keeps signs, so square averages stay valid
                opt.state[params[i]][key] = old + 1 if key == "step" else old * 0.5

    def drop_state(self, i: int) -> None:
        for opt, params, _ in self._both():
            opt.state.pop(params[i], None)

    def reorder_state(self, inner: bool) -> None:
        """Same keys and values in reverse insertion order, in the same dict objects."""
        for opt, _, _ in self._both():
            dicts = list(opt.state.values()) if inner else [opt.state]
            for d in dicts:
                items = list(d.items())
                d.clear()
                d.update(reversed(items))

    def set_lr(self, group: int, value: float, new_tensor: bool = False) -> None:
        for opt, _, _ in self._both():
            g = opt.param_groups[group]
            if isinstance(g["lr"], torch.Tensor) and not new_tensor:
                g["lr"].fill_(value)
            elif isinstance(g["lr"], torch.Tensor):
                g["lr"] = torch.tensor(value)
            else:
                g["lr"] = value

    def scheduler_step(self) -> None:
        errors = []
        for _, _, sched in self._both():
            try:
                with warnings.catch_warnings():  # "lr_scheduler.step() before optimizer.step()"
                    warnings.simplefilter("ignore", UserWarning)
                    sched.step()
                errors.append(None)
            except Exception as e:  # noqa: BLE001  (e.g. a group added after the scheduler)
                errors.append(type(e))
        assert errors[0] == errors[1], errors

    def hypers(self) -> list[str]:
        return [k for k in ("momentum", "betas", "weight_decay") if k in self.opt.defaults]

    def set_hyper(self, group: int, key: str, value: float) -> None:
        for opt, _, _ in self._both():
            g = opt.param_groups[group]
            if key == "betas":
                g["betas"] = (value, g["betas"][1])
            elif key == "momentum":
                if g["momentum"] > 0:  # RMSprop only makes a momentum buffer when it starts > 0
                    g["momentum"] = value
            else:
                g[key] = value

    # --- the invariant --------------------------------------------------------------
    def assert_equal(self) -> None:
        for i, (p, q) in enumerate(zip(self.params, self.twin_params)):
            assert_same(p.detach(), q.detach(), f"param {i}")
            assert (p.grad is None) == (q.grad is None), f"grad {i}"
            if p.grad is not None:
                assert_same(p.grad, q.grad, f"grad {i}")
        mine, theirs = self.opt.state_dict(), self.twin.state_dict()
        assert mine["state"].keys() == theirs["state"].keys(), (mine["state"].keys(), theirs["state"].keys())
        for i, s in mine["state"].items():
            assert s.keys() == theirs["state"][i].keys(), (i, s.keys(), theirs["state"][i].keys())
            for k, v in s.items():
                assert_same(v, theirs["state"][i][k], f"state[{i}][{k!r}]")
        assert len(mine["param_groups"]) == len(theirs["param_groups"])
        for n, (g, h) in enumerate(zip(mine["param_groups"], theirs["param_groups"])):
            assert g.keys() == h.keys(), (g.keys(), h.keys())
            for k in g:
                assert_same(g[k], h[k], f"param_groups[{n}][{k!r}]")


@contextlib.contextmanager
def flag_on():
    """The flag on, and a PGO profile of its own: what an earlier run learned does not leak in."""
    job = f"optimizer-soundness-{os.getpid()}-{next(_JOBS)}"
    with torch._dynamo.config.patch(stable_guards=True), torch.compiler.config.patch(job_id=job):
        yield


_JOBS = itertools.count()


# --- the state machine ---------------------------------------------------------------
class OptimizerSoundness(RuleBasedStateMachine):
    backend = "eager"

    def __init__(self):
        super().__init__()
        self._flag = flag_on()
        self._flag.__enter__()
        torch._dynamo.reset()
        self.t: Twins | None = None

    def teardown(self):
        self._flag.__exit__(None, None, None)
        torch._dynamo.reset()

    def _step(self) -> None:
        try:
            self.t.step()
        except EagerRaised:
            reject()  # the eager twin refused it: not a sequence a program could run

    def _then(self, then_step: bool) -> None:
        if then_step:
            self._step()

    @initialize(
        name=st.sampled_from(sorted(OPTIMIZERS)),
        shapes=st.lists(st.sampled_from(SHAPES), min_size=2, max_size=3),
        seed=SEEDS,
        foreach=st.sampled_from([None, False, True]),
        maximize=st.booleans(),
        tensor_lr=st.booleans(),
        scheduler=st.sampled_from(SCHEDULERS),
    )
    def build(self, name, shapes, seed, foreach, maximize, tensor_lr, scheduler):
        try:
            self.t = Twins(name, shapes, seed=seed, foreach=foreach, maximize=maximize,
                           tensor_lr=tensor_lr, scheduler=scheduler, backend=self.backend)
        except EagerRaised:
            reject()

    # Every change may be followed by a step at once, so most runs step often.
    @rule()
    def step(self):
        self._step()

    @rule(seed=SEEDS, mode=st.sampled_from(GRAD_MODES), then_step=st.booleans())
    def set_grads(self, seed, mode, then_step):
        self.t.set_grads(seed, mode)
        self._then(then_step)

    @rule(data=st.data(), then_step=st.booleans())
    def drop_grad(self, data, then_step):
        self.t.drop_grad(data.draw(st.integers(0, len(self.t.params) - 1)))
        self._then(then_step)

    @rule(set_to_none=st.booleans(), then_step=st.booleans())
    def zero_grad(self, set_to_none, then_step):
        self.t.zero_grad(set_to_none)
        self._then(then_step)

    @precondition(lambda self: len(self.t.params) < MAX_PARAMS)
    @rule(shape=st.sampled_from(SHAPES), seed=SEEDS, lr=st.none() | st.sampled_from([0.001, 0.02]),
          then_step=st.booleans())
    def add_param_group(self, shape, seed, lr, then_step):
        self.t.add_param_group(shape, seed, lr)
        self._then(then_step)

    @rule(then_step=st.booleans())
    def round_trip(self, then_step):
        self.t.round_trip()
        self._then(then_step)

    @rule(then_step=st.booleans())
    def load_twin_copy(self, then_step):
        self.t.load_twin_copy()
        self._then(then_step)

    @rule(then_step=st.booleans())
    def rebuild(self, then_step):
        self.t.rebuild()
        self._then(then_step)

    @precondition(lambda self: self.t.state_keys())
    @rule(data=st.data(), how=st.sampled_from(STATE_CHANGES), then_step=st.booleans())
    def set_state(self, data, how, then_step):
        i, key = data.draw(st.sampled_from(self.t.state_keys()))
        self.t.set_state(i, key, how)
        self._then(then_step)

    @rule(data=st.data(), then_step=st.booleans())
    def drop_state(self, data, then_step):
        self.t.drop_state(data.draw(st.integers(0, len(self.t.params) - 1)))
        self._then(then_step)

    @rule(inner=st.booleans(), then_step=st.booleans())
    def reorder_state(self, inner, then_step):
        self.t.reorder_state(inner)
        self._then(then_step)

    @rule(data=st.data(), value=st.sampled_from([0.001, 0.005, 0.03]), new_tensor=st.booleans(),
          then_step=st.booleans())
    def set_lr(self, data, value, new_tensor, then_step):
        self.t.set_lr(data.draw(st.integers(0, len(self.t.opt.param_groups) - 1)), value, new_tensor)
        self._then(then_step)

    @precondition(lambda self: self.t.sched is not None)
    @rule(then_step=st.booleans())
    def scheduler_step(self, then_step):
        self.t.scheduler_step()
        self._then(then_step)

    @precondition(lambda self: self.t.hypers())
    @rule(data=st.data(), value=st.sampled_from([0.0, 0.5, 0.8]), then_step=st.booleans())
    def set_hyper(self, data, value, then_step):
        key = data.draw(st.sampled_from(self.t.hypers()))
        group = data.draw(st.integers(0, len(self.t.opt.param_groups) - 1))
        self.t.set_hyper(group, key, value if key == "weight_decay" else value or 0.3)
        self._then(then_step)

    @invariant()
    def twins_equal(self):
        if self.t is not None:
            self.t.assert_equal()


class OptimizerSoundnessAot(OptimizerSoundness):
    backend = "aot_eager"


class OptimizerSoundnessInductor(OptimizerSoundness):
    """Inductor: hyperparameters reach the graph through stableguards.hyperparams' rewrite."""

    backend = "inductor"


# CI runs the same examples every time; a longer local run explores new ones.
_SETTINGS = {"deadline": None, "database": None, "derandomize": LONG is None,
             "suppress_health_check": [HealthCheck.too_slow, HealthCheck.filter_too_much]}

TestOptimizerSoundnessEager = OptimizerSoundness.TestCase
TestOptimizerSoundnessEager.settings = settings(max_examples=EXAMPLES, stateful_step_count=25, **_SETTINGS)
TestOptimizerSoundnessAotEager = OptimizerSoundnessAot.TestCase
TestOptimizerSoundnessAotEager.settings = settings(
    max_examples=max(1, EXAMPLES // 3), stateful_step_count=12, **_SETTINGS)
TestOptimizerSoundnessInductor = OptimizerSoundnessInductor.TestCase
TestOptimizerSoundnessInductor.settings = settings(
    max_examples=max(1, EXAMPLES // 10), stateful_step_count=8, **_SETTINGS)


# --- one cheap regression test per rule ------------------------------------------------
@pytest.fixture
def twins(fresh_dynamo):
    with flag_on():
        yield Twins


def steps(t: Twins, n: int = 2, seed: int = 0, mode: str = "replace") -> None:
    for k in range(n):
        t.set_grads(seed + k, mode)
        t.step()
        t.assert_equal()


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_plain_steps(twins, name):
    steps(twins(name), 3)


def test_accumulated_grads(twins):
    t = twins("Adam")
    steps(t)
    t.set_grads(7, "accumulate")
    t.step()
    t.assert_equal()


@pytest.mark.parametrize("set_to_none", [True, False])
def test_zero_grad(twins, set_to_none):
    t = twins("SGD-momentum")
    steps(t)
    t.zero_grad(set_to_none)
    t.step()
    t.assert_equal()
    steps(t, seed=5)


def test_a_grad_that_stays_none(twins):
    t = twins("Adam", [(3,), (2, 3), (3,)])
    t.set_grads(0)
    t.drop_grad(1)
    t.step()
    t.assert_equal()
    steps(t, seed=3)


@pytest.mark.parametrize("mode", ["transposed", "strided"])
def test_grads_whose_strides_change(twins, mode):
    t = twins("Adam")
    steps(t)
    steps(t, seed=4, mode=mode)
    steps(t, seed=8)


def test_add_param_group(twins):
    t = twins("Adam")
    steps(t)
    t.add_param_group((2, 3), seed=11, lr=0.02)
    steps(t, seed=3)


def test_state_dict_round_trip(twins):
    t = twins("Adam")
    steps(t)
    t.round_trip()
    steps(t, seed=3)


def test_load_a_deep_copy_of_the_twins_state(twins):
    t = twins("RMSprop-centered")
    steps(t)
    t.load_twin_copy()
    steps(t, seed=3)


def test_rebuilt_optimizer_is_seen(twins):
    t = twins("SGD-momentum")
    steps(t)
    t.rebuild()
    steps(t, seed=3)


@pytest.mark.parametrize("how", STATE_CHANGES)
@pytest.mark.parametrize("key", ["step", "exp_avg"])
def test_changing_a_state_tensor(twins, key, how):
    t = twins("Adam")
    steps(t)
    t.set_state(1, key, how)
    steps(t, seed=3)


def test_dropped_state_is_initialized_again(twins):
    t = twins("Adam")
    steps(t)
    t.drop_state(0)
    steps(t, seed=3)


@pytest.mark.parametrize("inner", [False, True])
def test_reordered_state_dicts(twins, inner):
    t = twins("Adam", [(3,), (2, 3), (3,)])
    steps(t)
    t.reorder_state(inner)
    steps(t, seed=3)


def test_the_step_is_really_compiled(twins):
    counter = torch._dynamo.testing.CompileCounter()
    t = twins("Adam", backend=counter)
    steps(t)
    assert counter.frame_count >= 1 and counter.op_count > 0


@pytest.mark.parametrize("new_tensor", [False, True])
@pytest.mark.parametrize("tensor_lr", [False, True])
def test_lr_changes(twins, tensor_lr, new_tensor):
    t = twins("Adam", tensor_lr=tensor_lr)
    steps(t)
    t.set_lr(0, 0.05, new_tensor)
    steps(t, seed=3)


@pytest.mark.parametrize("scheduler", SCHEDULERS[1:])
def test_scheduler_steps(twins, scheduler):
    t = twins("Adam", scheduler=scheduler)
    for k in range(3):
        steps(t, 1, seed=k)
        t.scheduler_step()
        t.assert_equal()


def test_tensor_lr_with_foreach_is_refused_by_eager_too(twins):
    with pytest.raises(EagerRaised):
        twins("Adam", tensor_lr=True, foreach=True)


@pytest.mark.parametrize(("name", "key"), [("SGD-momentum", "momentum"), ("RMSprop-centered", "momentum"),
                                           ("Adam", "betas"), ("NAdam", "betas"), ("Adam", "weight_decay")])
def test_hyperparameter_changes(twins, name, key):
    t = twins(name)
    steps(t)
    t.set_hyper(0, key, 0.5)
    steps(t, seed=3)


def test_a_profile_with_dynamic_weight_decay_under_aot_eager(twins):
    """Found by the state machine when profiles leaked from one example into the next.

    Upstream (flag off too, with its own PGO) raises SpeculationLogDivergence at sgd.py
    ``state['momentum_buffer'] = momentum_buffer`` when a second group gets grads for the
    first time: tensorify could not lift ``alpha=weight_decay`` and restarted the
    analysis.  With the flag on the float is lifted (stableguards.hyperparams), no
    restart happens, and the step equals eager."""
    from stableguards.profiles import hooks as integration
    from stableguards.profiles.profile import FORMAT, VERSION, from_json

    step = inspect.unwrap(torch.optim.SGD.step).__code__
    code = {"closure": None, "file_hash": torch._dynamo.pgo._hash_containing_file(step.co_filename),
            "filename": step.co_filename, "firstlineno": step.co_firstlineno, "name": step.co_name}
    dynamic = {"scalar": "dynamic", "size": "dynamic", "stride": "dynamic"}
    profile = from_json({"format": FORMAT, "version": VERSION, "frames": [
        {"code": code, "sources": {"L['self'].param_groups[0]['weight_decay']": dynamic}}]})
    assert integration.profile_store().merge_write(integration.profile_key(), profile) is not None
    torch._dynamo.reset()  # the next compile loads the profile, as after a restart

    t = twins("SGD-momentum", backend="aot_eager")
    t.set_hyper(0, "weight_decay", 0.0)
    t.add_param_group((2, 3), seed=1)
    t.step()  # no grads anywhere
    t.set_hyper(0, "weight_decay", 0.8)
    t.set_grads(1)
    t.step()
    t.assert_equal()
