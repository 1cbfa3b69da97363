"""Rebuilding an optimizer under one compiled train step, 20 times: flag off vs on.

Sweeps and per-phase training loops build a new optimizer over the same
parameters and keep calling the same compiled function.  Each configuration
runs in a fresh process (eager backend, default recompile limit of 8) and
reports: step compiles, whether the recompile limit was hit (after which torch
runs the step eagerly without a word), the live cache entries left for the
step, live tensor objects (fake ones included) after rebuilds 1, 10 and 20,
and whether the last optimizer's parameters equal an eager twin's.

    python bench/optimizer_rebuild.py

Writes bench/out/optimizer_rebuild.json.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import report
from columns import aligned

HERE = Path(__file__).resolve().parent
REBUILDS = 20

CHILD = r"""
import gc, json, logging, sys
import torch
import stableguards
from torch._dynamo.utils import counters

limit_hits = []
class Hits(logging.Handler):
    def emit(self, record):
        if "recompile_limit" in record.getMessage():
            limit_hits.append(record.getMessage())
logging.getLogger("torch._dynamo").addHandler(Hits())

def live_tensors():
    for _ in range(3):
        gc.collect()
    return sum(1 for o in gc.get_objects() if isinstance(o, torch.Tensor))

torch.manual_seed(0)
params = [torch.nn.Parameter(torch.randn(8)) for _ in range(4)]
twin_params = [torch.nn.Parameter(p.detach().clone()) for p in params]
holder = {}

@torch.compile(backend="eager")
def train_step():
    holder["opt"].step()

live, equal = {}, True
for i in range(1, REBUILDS + 1):
    holder["opt"] = torch.optim.Adam(params, lr=0.01)
    twin = torch.optim.Adam(twin_params, lr=0.01)
    for _ in range(2):
        for p, q in zip(params, twin_params):
            p.grad = torch.randn(8)
            q.grad = p.grad.clone()
        train_step()
        twin.step()
    equal = equal and all(torch.allclose(p, q, rtol=1e-4, atol=1e-5) for p, q in zip(params, twin_params))
    if i in (1, 10, REBUILDS):
        live[i] = live_tensors()

import torch._C._dynamo.eval_frame as c_eval_frame
from torch._dynamo.convert_frame import input_codes
entries = sum(1 for r in list(input_codes.seen) if r() is not None and r().co_name == "step"
              for e in c_eval_frame._debug_get_cache_entry_list(r()) if e.code is not None)
print(json.dumps({"compiles": counters["stats"]["unique_graphs"], "limit_hit": bool(limit_hits),
                  "live_step_entries": entries, "live_tensors": live, "equal": equal,
                  "released": stableguards.EVENTS.counters["optimizer_entries_released"]}))
""".replace("REBUILDS", str(REBUILDS))


def run(flag: bool) -> dict:
    env = dict(os.environ, TORCHDYNAMO_STABLE_GUARDS="1" if flag else "0")
    proc = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True, text=True,
                          timeout=1200, check=True)
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _live(r: dict) -> str:
    return " / ".join(str(r["live_tensors"][k]) for k in sorted(r["live_tensors"], key=int))


COLUMNS = (
    ("flag", lambda r: r["flag"]),
    ("step compiles", lambda r: r["compiles"]),
    ("recompile limit hit", lambda r: "yes" if r["limit_hit"] else "no"),
    ("live step entries", lambda r: r["live_step_entries"]),
    ("live tensors after 1 / 10 / 20", _live),
    ("entries released", lambda r: r["released"]),
    ("==eager", lambda r: "yes" if r["equal"] else "NO"),
)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=HERE / "out")
    args = parser.parse_args(argv)
    rows = [{"flag": "off", **run(False)}, {"flag": "on", **run(True)}]
    print(f"Adam over 4 params, rebuilt {REBUILDS} times under one compiled train step (eager backend)\n")
    print(aligned(COLUMNS, rows))
    print(f"rows: {report.write(args.out, 'optimizer_rebuild', rows, argv)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
