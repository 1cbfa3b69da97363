"""A graph with nothing to compute, in a form a bundled AOTAutograd entry can hold.

For a graph without calls (``return loss.detach()`` after AOTAutograd moved the
alias out) inductor compiles nothing and returns ``make_boxed_func(gm.forward)``,
which is not an ``OutputCode``, so torch cannot bundle it and the frame had no
warm-start entry.  ``GraphModuleCode`` holds that graph module and runs it as
inductor's return value does: the same module, pickled by its generated code.
Imported when inductor is (it subclasses inductor's ``OutputCode``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import torch
from torch._inductor.output_code import OutputCode


def unwrapped(fn: Any) -> Any:
    """What AOTAutograd's wrappers (``functools.wraps`` and the like) wrap."""
    while hasattr(fn, "__wrapped__"):
        fn = fn.__wrapped__
    return fn


def graph_without_calls(fn: Any) -> torch.fx.GraphModule | None:
    """The graph module whose ``forward`` ``fn`` is, unwrapped, if its graph calls nothing."""
    fn = unwrapped(fn)
    gm = getattr(fn, "__self__", None)
    if not isinstance(gm, torch.fx.GraphModule) or fn != gm.forward:
        return None
    if any(node.op.startswith("call_") for node in gm.graph.nodes):
        return None
    return gm


@dataclasses.dataclass
class GraphModuleCode(OutputCode):
    """An uncompiled graph module as inductor's output: called boxed, like ``make_boxed_func``.

    While serialized, ``gm`` is the module's reduced form without its ``meta`` (which
    holds fake tensors and the shape environment; the generated code does not read it)."""

    gm: Any = None

    def __post_init__(self) -> None:
        self._boxed_call = True
        # No compile time: torch adds it up when an AOTAutograd entry holding this loads as a
        # cache hit (OutputCode's default, None, failed that load).
        self._time_taken_ns = 0

    def __call__(self, inputs: Sequence[Any]) -> Any:
        return self.gm(*inputs)

    def prepare_for_serialization(self) -> None:
        rebuild, (body, *rest) = self.gm.__reduce__()
        self.gm = (rebuild, ({k: v for k, v in body.items() if k != "meta"}, *rest))

    def post_compile(self, example_inputs: Sequence[Any], constants: Any, graph_kwargs: Any) -> None:
        if isinstance(self.gm, tuple):
            rebuild, args = self.gm
            self.gm = rebuild(*args)

    def set_triton_bundle(self, triton_bundle: Any) -> None:
        pass
