"""Graphs that hold tensors checked by id (an optimizer's parameters and state): saved, and
given the tensors of the call they serve in a restarted process.

Dynamo makes a tensor with a static address (what an optimizer step reads of
its parameters and state) an attribute of the graph, checked by id, and
AOTAutograd passes the graph's attributes to the compiled code as its leading
inputs.  torch leaves such a graph out of a package ("Graph contains named
parameters due to static addresses"; its loader passes no attributes), so a
restarted process traced the optimizer's step again.

Kept here (``rebindable``) when every attribute is a tensor with a source:

* the cold compile records, for each graph, the sources of the tensors
  AOTAutograd passes in front of the graph's inputs, in AOTAutograd's own
  order (``record``: the list the compiled code closes over);
* when the entry's guards are saved, each of them must be checked by id, or
  sit in a dict checked by its version (an optimizer's per-parameter state,
  ``stableguards.optimizers``); those checks are saved as checks bound on the
  entry's first call (``rebuilt_checks.ID_ON_FIRST_CALL``, ``VERSION_ON_FIRST_CALL``),
  and the proof compares what is found there with the cold tensors by what
  compiled code sees of them (``identity.graph_tensor``) and by which of
  them are one tensor or share a storage (``facts.GRAPH_TENSORS``);
* a restarted process installs the graph with the bound tensors passed in
  front of its inputs (``serve_bound``): from the first call on, the bound
  checks make them the tensors at their sources, as the cold graph's
  attributes were.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from stableguards.warm_start.state import STATE

# torch's reason (torch/_dynamo/output_graph.py) for leaving such a graph out of a package.
STATIC_ADDRESSES = "Graph contains named parameters due to static addresses."


def rebindable(output_graph: Any) -> bool:
    """Whether every attribute of the graph being compiled is a tensor Dynamo checks by id,
    at a source: then its compiled code can be given the tensors of another process."""
    import torch
    from torch._dynamo.utils import get_static_address_type

    sources = output_graph.param_name_to_source or {}
    for node in output_graph.graph.find_nodes(op="get_attr"):
        value = output_graph.nn_modules.get(node.target)
        if not isinstance(value, torch.Tensor) or get_static_address_type(value) != "guarded" \
                or node.target not in sources:
            return False
    return True


def record(backend_id: str) -> None:
    """A graph compiled for a saved entry got its backend: the sources of the tensors its
    compiled code takes in front of its inputs, in that order (None: one has no source, and
    the compile is left out when its guards are saved), and those tensors."""
    traced = STATE.compiling.get().traced
    if traced is None:
        return
    from torch._dynamo.symbolic_convert import InstructionTranslator
    from torch._guards import TracingContext

    context, tx = TracingContext.try_get(), InstructionTranslator.current_tx()
    flat = getattr(context, "params_flat", None)
    if not flat:
        return
    traced.graph_tensors.update(id(tensor) for tensor in flat)
    output = tx.output if tx is not None else None
    names = {id(value): name for name, value in output.nn_modules.items()} if output is not None else {}
    sources = []
    for tensor in flat:
        name = names.get(id(tensor))
        source = (output.param_name_to_source or {}).get(name) if name is not None else None
        if source is None:
            traced.graph_params[backend_id] = None
            return
        sources.append(source)
    traced.graph_params[backend_id] = tuple(sources)


def serve_bound(scope: dict, backend_id: str, bound: list[Callable[[], Any]]) -> None:
    """Install a loaded graph so that it is called with the tensors ``bound`` returns (the
    objects its id checks were bound to) in front of the inputs the frame passes."""
    import torch
    from torch._dynamo.eval_frame import innermost_fn

    compiled = innermost_fn(scope[backend_id])

    def with_bound_tensors(*args: Any) -> Any:
        return compiled(*[get() for get in bound], *args)

    scope[backend_id] = torch._dynamo.disable(with_bound_tensors)
