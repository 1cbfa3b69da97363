"""Cudagraph static inputs: say which one moved when a graph is re-recorded, or refuse (strict).

A CUDAGraphNode is one recording of a compiled function; a re-record makes a
sibling node for the same function.  The addresses and names are kept by
``stableguards.cudagraphs.checks.StaticInputWatch`` (plain logic); here is
where they are taken from torch.
"""

from __future__ import annotations

import functools
import inspect
from typing import Any

import stableguards.cudagraphs as settings
from stableguards.cudagraphs import messages
from stableguards.cudagraphs.checks import input_names
from stableguards.cudagraphs.state import STATE
from stableguards.hooks.core import Hook
from stableguards.hooks.seams import fills
_TREES = "torch._inductor.cudagraph_trees"


def _call_user_compiler(call: Any, self: Any, gm: Any, *args: Any, **kwargs: Any) -> Any:
    """Keep the names of the graph's flat inputs, in AOTAutograd's order: the graph
    module's own parameters and buffers (lifted first), then Dynamo's graph inputs
    by source.  The graph cudagraphs records later has only inductor's names."""
    from torch._guards import CompileContext

    lifted = [*dict(gm.named_parameters(remove_duplicate=False)),
              *dict(gm.named_buffers(remove_duplicate=False))]
    graph_args = [n.meta.get("grapharg") for n in gm.graph.find_nodes(op="placeholder")]
    STATE.note_input_sources(CompileContext.current_compile_id(),
                             lifted + [a.source.name if a is not None and a.source is not None else "?"
                                       for a in graph_args])
    return call(self, gm, *args, **kwargs)


@functools.cache
def _signature(fn: Any) -> inspect.Signature:
    return inspect.signature(fn)


def _record(call: Any, self: Any, *args: Any, **kwargs: Any) -> None:
    """Record the static inputs' addresses of a new recording.

    Taken from a copy of the inputs made before torch runs: the node's
    ``__init__`` consumes its ``inputs`` list (``inputs.clear()``).
    """
    bound = _signature(call.fn).bind(self, *args, **kwargs).arguments
    inputs = list(bound["inputs"])
    call(self, *args, **kwargs)
    function = bound["wrapped_function"]
    names = input_names([p.name for p in function.placeholders],
                        STATE.input_sources.get(bound.get("compile_id")))
    # Before opaque (non-tensor) inputs existed, every static input was a tensor.
    static = getattr(self, "tensor_static_input_idxs", None)
    STATE.static_inputs.record(function.id, inputs, self.static_input_idxs if static is None else static,
                               names)


def _check_invariants(call: Any, self: Any, inputs: Any, *args: Any, **kwargs: Any) -> Any:
    """torch re-records silently when a static input moved: say which, or refuse (strict)."""
    from torch._inductor.cudagraph_trees import CheckInvariantStatus

    status, logger = call(self, inputs, *args, **kwargs)
    if status == CheckInvariantStatus.StaticInputIdxMismatch:
        report = STATE.static_inputs.check(self.wrapped_function.id, inputs,
                                           strict=settings.strict_static_inputs)
        if report is not None:
            messages.static_inputs_moved(report.describe())
    return status, logger


def _forget_recordings(call: Any, *args: Any, **kwargs: Any) -> None:
    """Resetting the trees restarts torch's function ids: the old recordings would
    answer for new graphs."""
    call(*args, **kwargs)
    STATE.static_inputs.clear()


@fills("optimizer_sources.after", "cudagraphs")
def warn_copied_grads(self: Any, tx: Any) -> None:
    """Dynamo mapped an optimizer's sources (``hooks.seams``): say once per optimizer which
    grads cudagraphs will copy (upstream: only under perf_hints)."""
    from torch._dynamo.variables.optimizer import _is_static_for_cudagraphs

    copied = [source.name for grad, source in self.grad_to_source.items()
              if not _is_static_for_cudagraphs(grad)]
    if copied:
        STATE.copied_grads_told.get(self.value, lambda: messages.copied_grads(copied))


HOOKS = [
    Hook("torch._dynamo.output_graph", "OutputGraph.call_user_compiler", "cudagraphs", _call_user_compiler,
         params=("gm",)),
    Hook(_TREES, "CUDAGraphNode.__init__", "cudagraphs", _record,
         params=("wrapped_function", "inputs", "compile_id"), lazy=True),
    Hook(_TREES, "CUDAGraphNode.check_invariants", "cudagraphs", _check_invariants,
         params=("inputs",), lazy=True),
    Hook(_TREES, "reset_cudagraph_trees", "cudagraphs", _forget_recordings, lazy=True),
]
