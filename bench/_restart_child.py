"""One process of the restart A/B: run a workload's calls, print counters as JSON.

    python bench/_restart_child.py WORKLOAD[,WORKLOAD...] BACKEND

The environment (cache dir, job id, flag) is set by restart_ab.py (or by a
test).  BACKEND "record" is the eager backend that also lists the graphs
Dynamo built, in "graphs", for tests of what a warm run compiles.  Several
workloads run in turn, in one process, each counted from zero: the result is
then keyed by workload.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import torch._dynamo.utils as dynamo_utils

import stableguards

sys.path.insert(0, str(Path(__file__).resolve().parent))
from workloads import WORKLOADS  # noqa: E402


def main(workload_name: str, backend: str) -> dict:
    workload = WORKLOADS[workload_name]
    graphs: list[str] = []

    def record(gm: torch.fx.GraphModule, example_inputs: list) -> object:
        graphs.append(gm.code)
        return gm.forward

    compiled = torch.compile(workload.fn, backend=record if backend == "record" else backend)
    gen = torch.Generator().manual_seed(0)
    for call in workload.calls:
        compiled(*workload.make_args(call, gen))
    built = list(graphs)  # the workload's own graphs, before the check below compiles more

    metrics = [m for m in dynamo_utils.get_compilation_metrics() if m.has_guarded_code]
    result = {
        "compiles": len(metrics),
        "recompiles": sum(1 for m in metrics if m.recompile_reason),
        "matches_eager": matches_eager(workload, compiled),
        "explain": stableguards.explain(),
        "counters": dict(stableguards.EVENTS.counters),
        "graphs": built,
    }
    for group, names in (
        ("inductor", ("fxgraph_cache_hit", "fxgraph_cache_miss")),
        ("aot_autograd", ("autograd_cache_hit", "autograd_cache_miss")),
    ):
        for name in names:
            result[name] = dynamo_utils.counters[group][name]
    return result


def matches_eager(workload, compiled) -> bool:
    """The compiled function equals eager on fresh inputs of every call's shape."""
    gen = torch.Generator().manual_seed(1234)
    for call in workload.calls:
        args = workload.make_args(call, gen)
        got, want = compiled(*args), workload.fn(*args)
        if not all(torch.allclose(g, w, rtol=1e-4, atol=1e-5)
                   for g, w in zip(torch.utils._pytree.tree_leaves(got),
                                   torch.utils._pytree.tree_leaves(want))):
            return False
    return True


def each(workload_names: list[str], backend: str) -> dict:
    results = {}
    for name in workload_names:
        dynamo_utils.counters.clear()
        dynamo_utils.clear_compilation_metrics()
        stableguards.reset()
        results[name] = main(name, backend)
    return results


if __name__ == "__main__":
    names = sys.argv[1].split(",")
    print(json.dumps(main(names[0], sys.argv[2]) if len(names) == 1 else each(names, sys.argv[2])))
