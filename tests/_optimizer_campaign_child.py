"""One process of the optimizer warm-start campaign (tests/test_optimizer_campaign.py).

    python tests/_optimizer_campaign_child.py SRC_DIR FLAG WARM CASES_JSON

``SRC_DIR/opt_steps.py`` holds each case's step function; CASES_JSON each
case's name and its cold and warm optimizer (tests/_optimizer_campaign.py).
Each case trains a small model three steps compiled and a copy of it eagerly,
each with its own optimizer (and lr scheduler) made the same way, its state
restored from the same checkpoint where the case says so (in full, or for the
first layer), and compares every loss and the final parameters.  Prints one
JSON line: per case, whether compiled equalled eager, the frames Dynamo traced
for it, and a digest of the eager results.
"""

from __future__ import annotations

import copy
import hashlib
import importlib
import json
import sys

import torch

import stableguards
from _traced import TRACED


def halve_grads(optimizer, args, kwargs):
    for group in optimizer.param_groups:
        for p in group["params"]:
            p.grad.mul_(0.5)


def nothing(optimizer, args, kwargs):
    return None


_OPTIONS = {
    "momentum": {"SGD": {"momentum": 0.9}, "RMSprop": {"momentum": 0.9}, "Adam": {"betas": (0.8, 0.95)},
                 "AdamW": {"betas": (0.8, 0.95)}, "Adagrad": {"lr_decay": 0.5}},
    "weight_decay": {"*": {"weight_decay": 0.05}},
    "maximize": {"*": {"maximize": True}},
}


def optimizer(model: torch.nn.Module, config: dict) -> torch.optim.Optimizer | tuple[torch.optim.Optimizer, ...]:
    """The case's optimizer; a split case's two, one per Linear."""
    made = _made(model, config)
    if config["restored"] != "none":
        second_layer = set(model[2].parameters())
        for opt, checkpoint in zip(made, _checkpoint(config), strict=True):
            if config["restored"] == "part":  # the second Linear added since: its state is a fresh optimizer's
                fresh = opt.state_dict()["state"]
                params = [p for group in opt.param_groups for p in group["params"]]
                for index in (i for i, p in enumerate(params) if p in second_layer):
                    checkpoint["state"].pop(index, None)
                    if index in fresh:  # Adagrad makes its state when it is made
                        checkpoint["state"][index] = fresh[index]
            opt.load_state_dict(checkpoint)
    return made if config["split"] else made[0]


def _checkpoint(config: dict) -> list[dict]:
    """The state of each optimizer made the same way after two eager steps on a model of its
    own: what a restarted job loads from its checkpoint."""
    torch.manual_seed(2)
    scratch = _model()
    made = _made(scratch, config)
    for _ in range(2):
        scratch(torch.randn(4, 8)).pow(2).mean().backward()
        for opt in made:
            opt.step()
            opt.zero_grad()
    return [opt.state_dict() for opt in made]


def _model() -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 4))


def _made(model: torch.nn.Module, config: dict) -> tuple[torch.optim.Optimizer, ...]:
    layers = [model[0], model[2]] if config["split"] else [model]
    return tuple(_one(list(layer.parameters()), config) for layer in layers)


def _one(params: list[torch.nn.Parameter], config: dict) -> torch.optim.Optimizer:
    half = len(params) // 2
    groups = [{"params": params}] if config["groups"] == 1 else \
        [{"params": params[:half]}, {"params": params[half:], "lr": config["lr"] / 2}]
    options = _OPTIONS.get(config["option"], {})
    options = options.get(config["optimizer"], options.get("*", {}))
    opt = getattr(torch.optim, config["optimizer"])(groups, lr=config["lr"], **options)
    if config["hook"] == "pre":
        opt.register_step_pre_hook(halve_grads)
    elif config["hook"] == "post":
        opt.register_step_post_hook(nothing)
    return opt


def run_case(step, config: dict) -> dict:
    torch.manual_seed(0)
    model = _model()
    twin = copy.deepcopy(model)
    compiled, seen = torch.compile(step), len(TRACED)
    x = torch.randn(4, 8, generator=torch.Generator().manual_seed(1))
    got, want = [], []
    for i in range(3):
        if i == 0 or (config["rebuilt"] and i == 1):  # rebuilt: another object, made the same way
            opts = [optimizer(model, config), optimizer(twin, config)]
            schedulers = [torch.optim.lr_scheduler.StepLR(opt, 1, gamma=0.5) for opt in _each(opts)
                          if config["scheduler"]]
        got.append(compiled(model, opts[0], x))
        want.append(step(twin, opts[1], x))
        for scheduler in schedulers:
            scheduler.step()
    got += [p.detach() for p in model.parameters()]
    want += [p.detach() for p in twin.parameters()]
    # Compiled and eager optimizers round differently (RMSprop divides by a square root of small
    # values); a stale step differs by far more (another learning rate or class).
    matches = all(torch.allclose(g, w, rtol=1e-3, atol=1e-4) for g, w in zip(got, want, strict=True))
    digest = hashlib.sha256(b"".join(w.round(decimals=3).numpy().tobytes() for w in want)).hexdigest()[:16]
    return {"matches": bool(matches), "traced": [code.co_name for code in TRACED[seen:]], "eager": digest}


def _each(opts: list) -> list[torch.optim.Optimizer]:
    return [opt for made in opts for opt in (made if isinstance(made, tuple) else (made,))]


def _patch_every_step() -> None:
    """Make one optimizer of each class, in one order, before any case runs.  The first
    optimizer of a class wraps its class's ``step`` (``Optimizer._patch_step_function``),
    or inherits its base's wrapper (AdamW after Adam): what a class holds depends on which
    class's optimizer came first.  Cases in one process whose classes change between the
    processes (AdamW cold, Adam warm) would change that for the other cases, whose
    optimizers' identities would then differ: a miss a single restarted job never sees."""
    for name in ("SGD", "Adam", "AdamW", "RMSprop", "Adagrad"):
        getattr(torch.optim, name)([torch.nn.Parameter(torch.zeros(1))])


def main(src: str, flag: bool, warm: bool, cases: list[dict]) -> dict:
    sys.path.insert(0, src)
    _patch_every_step()
    torch._dynamo.config.stable_guards = flag
    steps = importlib.import_module("opt_steps")
    results = {c["name"]: run_case(getattr(steps, f"step_{c['name']}"), c["warm" if warm else "cold"])
               for c in cases}
    return {"cases": results, "explain": stableguards.explain()}


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1], sys.argv[2] == "1", sys.argv[3] == "1", json.loads(sys.argv[4]))))
