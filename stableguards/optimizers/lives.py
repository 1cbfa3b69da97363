"""Optimizer steps under torch.compile: which guards they need, and how long their code lives.

Dynamo does not trace an optimizer's ``_init_group``: it runs it and guards
what it saw (torch/_dynamo/variables/optimizer.py).  Two things here change
what it guards and how long the result is kept.

**One version check per state dict.**  Upstream checks every state tensor by
identity (ID_MATCH): Adam has three per parameter.  The graph needs those
identities because it reads and writes the state tensors in place.  But a state
tensor is only reached through its parameter's state dict, ``opt.state[p]``,
and CPython gives every dict a version tag (PEP 509) that changes whenever one
of its values is replaced by another object and that no other dict ever shares.
So one DICT_VERSION check on ``opt.state[p]`` proves what the identity checks on
all of its values proved, with one guard instead of several.  Writing the same
object back (SGD stores each momentum buffer again every step) does not change
the tag, so a steady step keeps passing the check.

**Code dies with its optimizer.**  A compiled step is only valid for the
optimizer it was traced with (its state tensors are baked into the graph).
When that optimizer is collected, ``OptimizerLives`` hands its cache entries to
a callback that releases them, so rebuilt optimizers neither pile up dead
entries nor count towards the recompile limit.

It follows that a rebuilt optimizer, even with the same parameters and
structure, gets a step compiled for it: the old graph holds the old
optimizer's state tensors as constants, so serving it to the new one would
update tensors the new optimizer does not own.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # torch imports stableguards while it loads (entry point): no import here
    import torch


def describe(optimizer: torch.optim.Optimizer) -> str:
    """A short name for messages: class, groups and parameter count."""
    groups = optimizer.param_groups
    params = sum(len(g["params"]) for g in groups)
    return (f"{type(optimizer).__name__} at {id(optimizer):#x} "
            f"({len(groups)} group(s), {params} param(s))")


class OptimizerLives:
    """Which compiled cache entries depend on which optimizer.

    ``depend`` ties an entry (any weakly referenceable token, a guard manager
    under Dynamo) to an optimizer.  When the optimizer is collected,
    ``on_death`` receives its description and the tokens still alive.  Nothing
    here holds the optimizer or the tokens strongly.
    """

    def __init__(self, on_death: Callable[[str, list[Any]], None]) -> None:
        self._on_death = on_death
        # id(optimizer) -> weak refs to its entries; the finalizer owns the id's lifetime.
        self._entries: dict[int, list[weakref.ref[Any]]] = {}

    def depend(self, optimizer: torch.optim.Optimizer, token: Any) -> None:
        key = id(optimizer)
        if key not in self._entries:
            self._entries[key] = []
            weakref.finalize(optimizer, self._died, key, describe(optimizer))
        self._entries[key].append(weakref.ref(token))

    def tracked(self) -> int:
        """How many live optimizers have compiled entries."""
        return len(self._entries)

    def _died(self, key: int, description: str) -> None:
        refs = self._entries.pop(key, [])
        alive = [token for token in (ref() for ref in refs) if token is not None]
        self._on_death(description, alive)


# Set on the grads static_grads made static: zero_grad leaves those in place.  An
# attribute rather than a weak set, since sets compare tensors with ``==``.
_STATIC_GRAD = "_stableguards_static_grad"


def static_grads(optimizer: torch.optim.Optimizer) -> None:
    """Give every parameter's grad a fixed address, so cudagraphs need not copy it.

    Under cudagraphs, inputs that are not static are copied into the graph's
    own buffers on every call; for grads that is a full copy of the model's
    gradients per step.  This marks each grad static (allocating a zero grad
    where there is none yet, so backward accumulates into it in place) and
    makes ``optimizer.zero_grad()`` zero them in place, also with
    ``set_to_none=True`` (torch's default): freeing them would give the next
    backward new tensors at new addresses, which would make cudagraphs record
    again.  Grads keep their memory for the optimizer's life: that is the price.
    """
    import torch
    from torch._dynamo import mark_static_address

    for group in optimizer.param_groups:
        for param in group["params"]:
            if param.grad is None:
                param.grad = torch.zeros_like(param, memory_format=torch.preserve_format)
            mark_static_address(param.grad)
            setattr(param.grad, _STATIC_GRAD, True)
    if not getattr(optimizer.zero_grad, "_stableguards_static", False):
        optimizer.zero_grad = _ZeroGradKeepingStatic(optimizer)  # type: ignore[method-assign]


def has_static_grad(param: torch.Tensor) -> bool:
    """Whether ``param``'s current grad is one ``static_grads`` marked."""
    return param.grad is not None and getattr(param.grad, _STATIC_GRAD, False)


class _ZeroGradKeepingStatic:
    """``optimizer.zero_grad`` after ``static_grads``: static grads are zeroed in place.

    An object rather than a closure, so that the optimizer still copies and
    saves: ``copy.deepcopy(opt)`` gets one bound to the copy, and
    ``torch.save(opt)`` pickles it with the optimizer.  It refers back weakly,
    so the optimizer still dies as soon as its last user lets go.
    """

    _stableguards_static = True

    def __init__(self, optimizer: torch.optim.Optimizer) -> None:
        self._optimizer = weakref.ref(optimizer)

    def __call__(self, set_to_none: bool = True) -> None:
        opt = self._optimizer()
        if opt is None:
            return
        type(opt).zero_grad(opt, set_to_none=False)
        if set_to_none:
            for param in _params(opt):
                if param.grad is not None and not has_static_grad(param):
                    param.grad = None

    def __deepcopy__(self, memo: dict) -> _ZeroGradKeepingStatic:
        opt = self._optimizer()
        return _ZeroGradKeepingStatic(memo.get(id(opt), opt))  # the copy's, when copied with it

    def __reduce__(self) -> tuple:
        return _ZeroGradKeepingStatic, (self._optimizer(),)


def _params(optimizer: torch.optim.Optimizer) -> Iterable[torch.Tensor]:
    for group in optimizer.param_groups:
        yield from group["params"]
