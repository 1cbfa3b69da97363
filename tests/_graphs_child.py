"""Run a bench workload under the eager backend; print the graphs Dynamo built, as JSON.

    python tests/_graphs_child.py WORKLOAD

Environment (cache dir, flag, job id) comes from the test.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
import stableguards  # noqa: E402
from workloads import WORKLOADS  # noqa: E402

graphs: list[str] = []


def recording_backend(gm, example_inputs):
    graphs.append(gm.code)
    return gm.forward


workload = WORKLOADS[sys.argv[1]]
compiled = torch.compile(workload.fn, backend=recording_backend)
gen = torch.Generator().manual_seed(0)
matches = True
for call in workload.calls:
    args = workload.make_args(call, gen)
    matches &= bool(torch.allclose(torch.as_tensor(compiled(*args)), torch.as_tensor(workload.fn(*args))))
print(json.dumps({
    "graphs": graphs,
    "matches_eager": matches,
    "counters": dict(stableguards.manager.counters),
    "explain": stableguards.explain(),
}))
