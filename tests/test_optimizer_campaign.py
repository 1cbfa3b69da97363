"""Warm start of training steps never serves a step compiled for another optimizer.

A training step runs ``opt.step()`` and ``opt.zero_grad()`` after
``loss.backward()`` in frames where Dynamo checks the optimizer by id, which
another process cannot check: warm start proves the optimizer's identity (its
class, hyperparameters, hooks and tensors' metadata) and binds the id check
to the optimizer of the entry's first call (docs/warm_start.md).  Hypothesis
draws training steps and their optimizers from tests/_optimizer_campaign.py
(class, learning rate, an option, a step hook, param groups, state restored
from a checkpoint in full or in part, another optimizer object on a later
step), with at most one change between a cold and a warm process; both run
flag on, and again flag off.  Checked: every
loss and parameter equals eager; a change that should show does (the eager
results differ between the processes); an unchanged step starts warm: its own
frames are installed, and so is the optimizer's own step graph, a fresh
optimizer's included, unless it has a step hook.

Size: STABLEGUARDS_OPTIMIZER_CAMPAIGN_CASES cases per batch (CI: 5) and
STABLEGUARDS_OPTIMIZER_CAMPAIGN_BATCHES batches (CI: 1, the same cases each
run; with more, each from a random seed, printed on failure).
"""

from __future__ import annotations

import dataclasses
import json
import os
import random
from pathlib import Path

import pytest
from _children import child_env, requires_warm_start, run_child
from _drawing import draw
from _optimizer_campaign import Config, OptimizerCase, optimizer_cases, own_frames, steps_module

CHILD = Path(__file__).resolve().parent / "_optimizer_campaign_child.py"
CASES = int(os.environ.get("STABLEGUARDS_OPTIMIZER_CAMPAIGN_CASES", "5"))
BATCHES = int(os.environ.get("STABLEGUARDS_OPTIMIZER_CAMPAIGN_BATCHES", "1"))


def _run(src: Path, cache: Path, flag: bool, warm: bool, batch: list[OptimizerCase]) -> dict | None:
    """One process's results; None where torch itself failed with the flag off (its own
    behaviour, which the flag-off run only stands beside: it is not under test)."""
    env = child_env(cache, PYTHONHASHSEED="random")
    args = [CHILD, src, "1" if flag else "0", "1" if warm else "0", json.dumps([dataclasses.asdict(c) for c in batch])]
    try:
        return run_child(args, env)
    except AssertionError as error:
        if flag:
            raise
        print(f"flag off, {'warm' if warm else 'cold'}: torch failed: {str(error)[-600:]}")
        return None


def _cold_then_warm(root: Path, batch: list[OptimizerCase], flag: bool) -> tuple[dict, dict] | None:
    src = root / "src"
    src.mkdir(parents=True)
    (src / "opt_steps.py").write_text("import torch\n" + steps_module(batch))
    cold = _run(src, root / "cache", flag, False, batch)
    warm = _run(src, root / "cache", flag, True, batch) if cold is not None else None
    return None if warm is None else (cold, warm)


def _check(batch: list[OptimizerCase], on: tuple[dict, dict], off: tuple[dict, dict] | None = None) -> None:
    for case in batch:
        print(f"{case.name}: {case.cold} -> {case.change()}: {case.warm}: "
              + " | ".join(str(run["cases"][case.name]) for run in (*on, *(off or ()))))
    print(on[1]["explain"])
    for label, run in zip(("on, cold", "on, warm", "off, cold", "off, warm"), (*on, *(off or ()))):
        wrong = [name for name, result in run["cases"].items() if not result["matches"]]
        assert not wrong, (label, wrong, "see the captured output")
    for case in batch:
        cold, warm = on[0]["cases"][case.name], on[1]["cases"][case.name]
        if off is not None:
            assert warm["eager"] == off[1]["cases"][case.name]["eager"], case
        if case.change() == "none":
            assert warm["eager"] == cold["eager"], case
            assert not own_frames(case.name, warm["traced"]), (case, warm)  # started warm
            if case.warm.whole_step_warm():  # the optimizer's own step graph too
                # ... except a graph that guards a scheduled hyperparameter, which AOTAutograd
                # does not cache (stableguards.hyperparams): left out, and named.  Not only under
                # a scheduler: the cases of one process share their class's step code, so a
                # hyperparameter that differs between them (Adam's betas) becomes a symbol there.
                left_out = [line for line in on[1]["explain"].splitlines() if "is left out of its saved entry" in line
                            and "scheduled hyperparameter" in line]
                assert not [t for t in warm["traced"] if not any(
                    line.strip().startswith(f"warm start: {t} (") for line in left_out)], (case, warm)
        elif case.observable():
            assert warm["eager"] != cold["eager"], case  # the change shows


@requires_warm_start
def test_optimizer_steps_start_warm_unless_their_optimizer_changed(tmp_path):
    """Unchanged (with and without an lr scheduler, which wraps the optimizer's step; Adam
    restored from a checkpoint; a fresh AdamW with two param groups, a fresh SGD with momentum
    and an AdamW restored for its first layer only, whose state their first step makes; two
    Adams, one per layer, stepped in turn), and each kind of change once: another learning
    rate, class, step hook, another optimizer object from the second step, fresh state for
    restored."""
    sgd, scheduled, adam = Config(), Config(scheduler=True), Config(optimizer="Adam", restored="all")
    fresh_adamw, fresh_momentum = Config(optimizer="AdamW", groups=2), Config(option="momentum")
    part_adamw, split_adam = Config(optimizer="AdamW", restored="part"), Config(optimizer="Adam", split=True)
    pairs = [(sgd, sgd), (scheduled, scheduled), (adam, adam), (fresh_adamw, fresh_adamw),
             (fresh_momentum, fresh_momentum), (part_adamw, part_adamw), (split_adam, split_adam),
             (sgd, Config(lr=0.05)),
             (sgd, Config(optimizer="Adam")), (sgd, Config(hook="pre")), (sgd, Config(rebuilt=True)),
             (adam, Config(optimizer="Adam"))]
    batch = [OptimizerCase(f"case{i}", cold, warm) for i, (cold, warm) in enumerate(pairs)]
    on = _cold_then_warm(tmp_path, batch, flag=True)
    _check(batch, on)
    # The optimizer's step graph too (SGD's is found before any SGD is made), fresh ones
    # included: their first step is served the state the cold trace made.
    for case in batch[:7]:
        assert not on[1]["cases"][case.name]["traced"], case
    for case in batch[7:-1]:  # each change bites: the step's frames that check the optimizer compile again
        assert own_frames(case.name, on[1]["cases"][case.name]["traced"]), case
    # Fresh state where the cold process restored it: Adam's step graph compiles again.
    assert "step" in on[1]["cases"][batch[-1].name]["traced"]


def _cold_then_warm_program(program: str, cache: Path) -> tuple[dict, dict]:
    """What ``program`` prints last (JSON), cold (WARM=0) then warm (WARM=1), on one cache dir."""
    cold, warm = (run_child(["-c", program], child_env(cache, WARM=warm)) for warm in ("0", "1"))
    return cold, warm


ONE_OPTIMIZER_TWO_NAMES = """
import json, os, torch
torch._dynamo.config.stable_guards = True
import stableguards

def step(a, b, x):
    b.defaults["lr"] = 0.5
    return x * a.defaults["lr"]  # 0.5 when a is b

def optimizers():
    params = [torch.nn.Parameter(torch.ones(2))]
    a = torch.optim.SGD(params, lr=0.01)
    return (a, torch.optim.SGD(params, lr=0.01)) if os.environ["WARM"] == "1" else (a, a)

x = torch.ones(3)
ok = torch.allclose(torch.compile(step)(*optimizers(), x), step(*optimizers(), x))
print(json.dumps({"ok": bool(ok), "explain": stableguards.explain()}))
"""


@requires_warm_start
def test_two_names_for_one_optimizer_are_never_served_two_optimizers(tmp_path):
    """A frame that reached one optimizer through two arguments compiled code in which a change
    made through one shows through the other.  A warm process given two equal optimizers (each
    id check binds its own, and both identities match) must not be served that code."""
    cold, warm = _cold_then_warm_program(ONE_OPTIMIZER_TWO_NAMES, tmp_path)
    assert cold["ok"] and warm["ok"], warm["explain"]  # served the cold code, warm returned 0.5
    assert "saved entry was not used" in warm["explain"] and "(one object at L['a'], L['b'])" in warm["explain"]



ONE_OPTIMIZER_AFTER_ANOTHER = """
import gc, json, os, torch
torch._dynamo.config.stable_guards = True
torch._dynamo.config.recompile_limit = 3
torch._dynamo.config.fail_on_recompile_limit_hit = True
import stableguards

model = torch.nn.Linear(4, 2)
twin = torch.nn.Linear(4, 2)
twin.load_state_dict(model.state_dict())

def step(opt):
    opt.step()
    opt.zero_grad()

compiled, x = torch.compile(step), torch.ones(3, 4)
for i in range(6):  # each optimizer made after the last one was collected; warm, the last is new
    lr = 0.2 if i == 5 and os.environ["WARM"] == "1" else 0.1
    opt, eager = torch.optim.SGD(model.parameters(), lr=lr), torch.optim.SGD(twin.parameters(), lr=lr)
    model(x).sum().backward()
    twin(x).sum().backward()
    compiled(opt)
    step(eager)
    del opt, eager
    gc.collect()
ok = all(torch.allclose(p, q) for p, q in zip(model.parameters(), twin.parameters()))
print(json.dumps({"ok": ok, "explain": stableguards.explain()}))
"""


@requires_warm_start
def test_an_entry_served_to_an_optimizer_is_released_with_it(tmp_path):
    """A job that makes its optimizer again and again (one at a time) compiles the step's
    frames that check it once per optimizer; each entry is released when its optimizer is
    collected, so the frame never reaches its recompile limit.  Entries a warm process
    installed from its saved ones are released as well (here the limit is 3 and 6
    optimizers come in turn, the warm process's last one new, which it compiles: Dynamo
    raises if the dead ones' entries are still counted)."""
    cold, warm = _cold_then_warm_program(ONE_OPTIMIZER_AFTER_ANOTHER, tmp_path)
    assert cold["ok"] and warm["ok"], warm["explain"]
    assert "installed its saved compiled entry" in warm["explain"], warm["explain"]
    assert "was collected: released" in warm["explain"], warm["explain"]


@requires_warm_start
@pytest.mark.parametrize("batch_index", range(BATCHES))
def test_a_warm_training_step_is_never_served_another_optimizers_step(batch_index, tmp_path_factory):
    seed = None if BATCHES == 1 else random.randrange(2**32)
    print(f"seed {seed}")
    batch = draw(optimizer_cases(), CASES, seed)
    on = _cold_then_warm(tmp_path_factory.mktemp("on"), batch, flag=True)
    # Flag off, a process that makes many optimizers can fail in torch itself (seen: a
    # SpeculationLogDivergence tracing SGD's step, 1 batch in 10 of 8 cases): then only the flag-on
    # processes are compared with eager.
    off = _cold_then_warm(tmp_path_factory.mktemp("off"), batch, flag=False)
    _check(batch, on, off)
