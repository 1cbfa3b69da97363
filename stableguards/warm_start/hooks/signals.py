"""What other parts tell warm start about the graph being compiled (``hooks.seams`` slots), and
leaving a graph out of our package.

* ``graph.declined``: another part declines AOTAutograd's entry for the graph (a scheduled
  hyperparameter its cache entry would not check): the frame's compile is left out, or it
  would wait for that graph's artifact forever;
* ``graph.runs_untraced``: the graph runs functions Dynamo never traced (a checkpointing
  policy, an ``fx.wrap``'d function): the frame's proof checks what they read.
"""

from __future__ import annotations

from typing import Any

from stableguards.hooks.seams import fills
from stableguards.warm_start.state import STATE


@fills("graph.declined", "warm_start")
def nothing_saved(reason: str) -> None:
    """AOTAutograd saves no entry for the graph being compiled (another part declined it): if
    the graph is ours, its frame's compile is left out of the package, which would
    otherwise wait for that graph's artifact forever, saving none of its later frames."""
    if STATE.compiling.get().bundling:
        leave_out(reason)


def leave_out(reason: str) -> None:
    """Leave the graph being compiled out of our package: the frame's compile (torch's
    per-compile bypass), or the function whose backward this is."""
    backward_of = STATE.compiling.get().backward_of
    if backward_of is not None:
        STATE.unsaveable[backward_of] = reason
        return
    from torch._dynamo.symbolic_convert import InstructionTranslator

    tx = getattr(InstructionTranslator, "current_tx", lambda: None)()
    if tx is not None and tx.output.package is not None:
        tx.output.bypass_package(reason)


@fills("graph.runs_untraced", "warm_start")
def runs_untraced(functions: list[tuple[str, Any]]) -> None:
    """The graph being compiled runs ``functions`` ((label, function): a checkpointing
    policy, an fx.wrap'd function) without Dynamo tracing them, so no guard of the frame
    looks at what they read: the frame's proof checks it (``proofs.live_proof``).  A
    backward compiled on first use, whose frame's proof is written already, is left out.
    Only for a graph of ours (bundled)."""
    if not STATE.compiling.get().bundling:
        return
    traced = STATE.compiling.get().traced
    if traced is None or STATE.compiling.get().backward_of is not None:
        leave_out(f"it runs {', '.join(sorted({label for label, _ in functions}))} without Dynamo guarding what "
                  f"they read; the AOTAutograd cache key holds it instead")
        return
    traced.untraced.extend(functions)
