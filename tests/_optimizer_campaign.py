"""The grammar of the optimizer warm-start campaign (tests/test_optimizer_campaign.py).

A case is a training step (forward, ``loss.backward()``, ``opt.step()``,
``opt.zero_grad()``), a function of its own, and the optimizer it runs in the
cold process and in the warm one: its class, learning rate, one option, a
step hook, one or two param groups, an lr scheduler, whether its state is
restored from a checkpoint (as a restarted job does) before the first step, in
full or for the first layer only (the second one added since),
and whether the warm process makes another optimizer object from the second
step on.  At most one of them changes between the processes.  A case may also
split its model between two optimizers made the same way, one per layer, each
stepped in turn (a GAN's generator and discriminator): both processes do.
"""

from __future__ import annotations

import dataclasses
import textwrap
from dataclasses import dataclass

from hypothesis import strategies as st

OPTIMIZERS = ("SGD", "Adam", "AdamW", "RMSprop", "Adagrad")
OPTIONS = ("none", "momentum", "weight_decay", "maximize")
HOOKS = ("none", "pre", "post")  # pre: halves every gradient; post: does nothing
LRS = (0.01, 0.05)


@dataclass(frozen=True)
class Config:
    optimizer: str = "SGD"
    lr: float = 0.01
    option: str = "none"
    hook: str = "none"
    groups: int = 1
    scheduler: bool = False  # an lr scheduler (StepLR, halving) stepped after each step
    # State loaded from a checkpoint (two eager steps) before the first step: "all", or "part":
    # the second layer's state as a fresh optimizer has it (a layer added since the checkpoint).
    restored: str = "none"
    rebuilt: bool = False  # another optimizer object, made as the first was, from the second step
    # Each Linear its own optimizer, made as above: two of one class stepped in one step, through
    # one function (``Optimizer.step``'s wrapper), whose saved entries pass each other's guards.
    split: bool = False

    def stateful(self) -> bool:
        """Whether the optimizer keeps per-parameter state (SGD only with momentum)."""
        return self.optimizer != "SGD" or self.option == "momentum"

    def whole_step_warm(self) -> bool:
        """Whether its step's own graph and the optimizer's other frames surely start warm:
        unless it has a step hook.  A fresh optimizer's first step is served the state its
        cold trace made (warm_start/hooks/optimizer_init.py).  Dynamo checks a step hook's
        handle id, a per-process counter, which a batch of cases in one process (compiling
        in one, not in the other) moves apart: a miss, not a wrong hit."""
        return self.hook == "none"


@dataclass(frozen=True)
class OptimizerCase:
    name: str
    cold: Config
    warm: Config

    def change(self) -> str:
        """The field that differs between the processes, or "none"."""
        return next((f.name for f in dataclasses.fields(Config)
                     if getattr(self.cold, f.name) != getattr(self.warm, f.name)), "none")

    def observable(self) -> bool:
        """Whether the change must show in the eager results (three steps, rounded): a hook
        that does nothing, a hook that scales gradients for an optimizer that normalizes
        them, and another object made the same way need not."""
        change = self.change()
        if change == "hook":  # halved gradients: Adam, AdamW, RMSprop and Adagrad divide the scale out
            return "pre" in (self.cold.hook, self.warm.hook) and self.cold.optimizer == "SGD"
        if change == "option":
            return "maximize" in (self.cold.option, self.warm.option)
        if change == "restored":
            return self.cold.stateful()
        return change in ("optimizer", "lr", "groups", "scheduler")


_CHOICES = {"optimizer": OPTIMIZERS, "lr": LRS, "option": OPTIONS, "hook": HOOKS, "groups": (1, 2),
            "scheduler": (False, True), "restored": ("none", "all", "part"), "rebuilt": (False, True)}


@st.composite
def configs(draw: st.DrawFn) -> Config:
    return Config(**{name: draw(st.sampled_from(values)) for name, values in _CHOICES.items() if name != "rebuilt"},
                  split=draw(st.booleans()))


@st.composite
def optimizer_cases(draw: st.DrawFn) -> OptimizerCase:
    cold = draw(configs())  # split is the step's shape, not a change: both processes share it
    field = draw(st.one_of(st.none(), st.sampled_from(sorted(_CHOICES))))  # about a third unchanged
    warm = cold
    if field is not None:
        other = [v for v in _CHOICES[field] if v != getattr(cold, field)]
        warm = dataclasses.replace(cold, **{field: draw(st.sampled_from(other))})
    return OptimizerCase("case", cold, warm)


def steps_module(batch: list[OptimizerCase]) -> str:
    """One training step function per case (each its own code, its own entry); a split
    case's takes its two optimizers as a tuple."""
    return "".join(textwrap.dedent(f"""
        def step_{case.name}(model, opt, x):
            loss = model(x).pow(2).mean()
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            return loss.detach()

        """ if not case.cold.split else f"""
        def step_{case.name}(model, opts, x):
            loss = model(x).pow(2).mean()
            loss.backward()
            first, second = opts
            first.step()
            second.step()
            first.zero_grad(set_to_none=True)
            second.zero_grad(set_to_none=True)
            return loss.detach()

        """) for case in batch)


def own_frames(name: str, traced: list[str]) -> list[str]:
    """The frames of case ``name``'s step function and its resume functions."""
    return [t for t in traced if t == f"step_{name}" or f"step_{name}_at_" in t]
