"""A fresh optimizer's first step, served by its saved entry: the state the cold trace filled.

Dynamo does not trace an optimizer's ``_init_group``: while it traces the step it
calls it for real (``OptimizerVariable._init_group``), which fills the optimizer's
state (AdamW's ``exp_avg``, ``exp_avg_sq``, ``step``), and the entry's guards then
expect that state.  A restarted process with a fresh optimizer has none, so the
saved entry of its first step fails them, and tracing the step again is what would
fill it: every restart traced the first AdamW step.

So the cold compile notes each such call that filled state (where the optimizer
came from, the group, which of its parameters had no state yet, the arguments as
Dynamo mapped them), and the entry is saved with them.  In a restarted process, a
call that no loaded entry serves, on an optimizer whose noted groups lack state for
exactly the parameters that lacked it cold (all of them for a fresh optimizer; the
new layer's of one restored from a checkpoint and then given more parameters),
makes those calls as Dynamo made them, then checks the entry's guards and proof as
for any loaded entry.  If they pass, the entry serves; if not, the state the calls
made is removed again and the frame is traced as usual (which calls
``_init_group`` itself).

Sound as the trace it stands for: the calls are the ones the cold trace made, on
the same group of an optimizer of the same type, at the start of the frame whose
trace made them, with the frame's own arguments' state (the grads) as they are at
that call; only parameters without state get any, and it is removed again unless
the entry, checked in full afterwards, serves the call.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from stableguards.hooks.core import Hook
from stableguards.warm_start.guard_rules import Unprovable
from stableguards.warm_start.hooks import proofs
from stableguards.warm_start.state import STATE

_GROUP, _LIST, _CONSTANT = "group", "list", "constant"
_CONSTANTS = (bool, int, float, str, type(None))


@dataclass(frozen=True)
class StateInit:
    """One ``_init_group`` call the cold trace made that filled a param group's state: the
    optimizer's source and type, the group's index, the positions in the group of the
    parameters that had no state before it, and each argument as Dynamo mapped it (the
    group, a new empty list, or a constant)."""

    source: Any  # a Dynamo Source, resolved on the restarted frame
    optimizer_type: str  # module.qualname
    group: int
    args: tuple[tuple[str, Any], ...]
    kwargs: tuple[tuple[str, tuple[str, Any]], ...]
    without_state: tuple[int, ...]


@dataclass(frozen=True)
class Made:
    """State ``fill_as_cold`` made: the optimizer, and the parameters it gave state."""

    optimizer: Any
    params: tuple[Any, ...]


def _type_name(obj: Any) -> str:
    return f"{type(obj).__module__}.{type(obj).__qualname__}"


def _argument(value: Any, groups: list) -> tuple[str, Any] | None:
    for index, group in enumerate(groups):
        if value is group:
            return _GROUP, index
    if type(value) is list and not value:
        return _LIST, None
    if type(value) in _CONSTANTS:
        return _CONSTANT, value
    return None


def _without_state(optimizer: Any, group: int) -> tuple[int, ...]:
    """The positions in param group ``group`` of the parameters with no state (``in``, not
    indexing: the state is a defaultdict)."""
    return tuple(i for i, p in enumerate(optimizer.param_groups[group]["params"]) if p not in optimizer.state)


def _note_init(call: Any, self: Any, *args: Any, **kwargs: Any) -> Any:
    """Dynamo maps an ``_init_group`` call's arguments before making it for real: noted for
    the saved entry (``StateInit``) when a parameter of the group has no state yet (the call
    is what makes it)."""
    py_args, py_kwargs = call(self, *args, **kwargs)
    traced = STATE.compiling.get().traced
    optimizer, source = self.value, self.source
    if traced is None or source is None:
        return py_args, py_kwargs
    groups = optimizer.param_groups
    mapped = [_argument(value, groups) for value in py_args]
    named = [(name, _argument(value, groups)) for name, value in py_kwargs.items()]
    group = [value for kind, value in filter(None, mapped + [m for _, m in named]) if kind == _GROUP]
    if None in mapped or any(m is None for _, m in named) or len(group) != 1:
        return py_args, py_kwargs  # not a call we can make again: the entry simply stays as it is
    without_state = _without_state(optimizer, group[0])
    if not without_state:
        return py_args, py_kwargs  # this group's state was all there before the trace
    traced.state_inits.append(StateInit(source, _type_name(optimizer), group[0], tuple(mapped), tuple(named),
                                        without_state))
    return py_args, py_kwargs


def _this_format(init: Any) -> bool:
    """A note as this version writes them: one saved by another version of ``StateInit`` (a
    field missing) is not used, and the frame is traced as it would be without notes."""
    return isinstance(init, StateInit) and all(f.name in vars(init) for f in dataclasses.fields(StateInit))


def _optimizers(inits: tuple[StateInit, ...], frame: Any) -> list[Any] | None:
    """The live optimizer of each call, on this frame; None unless every one is of the cold
    type, has the group, and lacks state for exactly the group's parameters that lacked it
    cold."""
    found = []
    value = proofs._Scope(frame.f_locals, frame.f_globals).values({init.source.name: init.source for init in inits})
    for init in inits:
        try:
            optimizer = value(init.source.name)
        except Unprovable:  # a source this frame does not have
            return None
        if _type_name(optimizer) != init.optimizer_type or not hasattr(optimizer, "_init_group") \
                or init.group >= len(optimizer.param_groups) \
                or _without_state(optimizer, init.group) != init.without_state:
            return None
        found.append(optimizer)
    return found


def fill_as_cold(guards_state: Any, frame: Any) -> list[Made]:
    """Make the ``_init_group`` calls the cold trace of this entry made, on this frame's
    optimizers: the state made (none if the entry made no such call, or this frame's
    optimizers lack other state than the cold ones did).  ``empty`` it again unless the
    entry serves the call."""
    inits = tuple(getattr(guards_state, "stableguards_state_inits", ()))
    if not inits or not all(_this_format(init) for init in inits):
        return []
    from torch._dynamo.variables.optimizer import OptimizerVariable

    # The call is made as torch 2.15's Dynamo makes it (``_init_as_dynamo_does``).
    optimizers = _optimizers(inits, frame) if hasattr(OptimizerVariable, "_safe_to_set_capturable") else None
    if not optimizers:
        return []
    made: list[Made] = []
    try:
        for init, optimizer in zip(inits, optimizers):
            group = optimizer.param_groups[init.group]["params"]
            made.append(Made(optimizer, tuple(group[i] for i in init.without_state)))
            _init_as_dynamo_does(optimizer, init)
    except BaseException:
        empty(made)
        raise
    return made


def empty(made: list[Made]) -> None:
    """As they were before ``fill_as_cold``: the state it made removed, the rest kept."""
    for m in made:
        for p in m.params:
            m.optimizer.state.pop(p, None)


def _init_as_dynamo_does(optimizer: Any, init: StateInit) -> None:
    """``OptimizerVariable._init_group``'s call, made again: the same arguments, the group's
    ``capturable`` set while it runs where Dynamo sets it, under the grad mode of the step."""
    import torch
    from torch._dynamo.variables.optimizer import OptimizerVariable

    def value(kind: str, v: Any) -> Any:
        return optimizer.param_groups[v] if kind == _GROUP else [] if kind == _LIST else v

    args = [value(kind, v) for kind, v in init.args]
    kwargs = {name: value(kind, v) for name, (kind, v) in init.kwargs}
    group = optimizer.param_groups[init.group]
    as_dynamo = type("_Optimizer", (), {"value": optimizer})()
    capturable = OptimizerVariable._safe_to_set_capturable(as_dynamo, group)
    prior = group.get("capturable")
    if capturable:
        group["capturable"] = True
    try:
        with torch.set_grad_enabled(bool(optimizer.defaults.get("differentiable", False))):
            optimizer._init_group(*args, **kwargs)
    finally:
        if capturable:
            group["capturable"] = prior


HOOKS = [
    Hook("torch._dynamo.variables.optimizer", "OptimizerVariable.get_python_args", "warm_start", _note_init),
]
