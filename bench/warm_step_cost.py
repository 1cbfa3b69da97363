"""What a warm-started optimizer step costs per call: the step a cold process compiled (torch's
C++ id checks on each parameter) against the same step loaded by a warm one (each id check
bound on the first call, a Python check), flag off beside.

    python bench/warm_step_cost.py [--params 150] [--calls 2000]

Each setting runs a cold process and then a warm one on one new cache dir; each process
compiles ``opt.step()`` of SGD over ``--params`` small parameters, runs it 50 times, then
times ``--calls`` calls (median of 5 rounds).  Columns: microseconds per call, cold and
warm, and warm/cold.

Writes bench/out/warm_step_cost.json.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import report
from columns import aligned

HERE = Path(__file__).resolve().parent

CHILD = """
import json, os, sys, time, statistics
import torch
torch._dynamo.config.stable_guards = os.environ["FLAG"] == "1"
params = [torch.nn.Parameter(torch.ones(4)) for _ in range(int(os.environ["PARAMS"]))]
for p in params:
    p.grad = torch.full((4,), 1e-3)
opt = torch.optim.SGD(params, lr=1e-3)
step = torch.compile(opt.step)
for _ in range(50):
    step()
calls, rounds = int(os.environ["CALLS"]), []
for _ in range(5):
    start = time.perf_counter()
    for _ in range(calls):
        step()
    rounds.append((time.perf_counter() - start) / calls * 1e6)
print(json.dumps({"us": statistics.median(rounds)}))
"""


def _run(cache: str, flag: bool, params: int, calls: int) -> float:
    env = {k: v for k, v in os.environ.items() if k != "TORCH_COMPILE_JOB_ID"}
    env.update(TORCHINDUCTOR_CACHE_DIR=cache, FLAG="1" if flag else "0", PARAMS=str(params), CALLS=str(calls))
    proc = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True, text=True, check=True)
    return json.loads(proc.stdout.strip().splitlines()[-1])["us"]


COLUMNS = (
    ("flag", lambda r: r["flag"]),
    ("cold us/call", lambda r: f"{r['cold_us']:.1f}"),
    ("warm us/call", lambda r: f"{r['warm_us']:.1f}"),
    ("warm/cold", lambda r: f"{r['warm_us'] / r['cold_us']:.3f}"),
)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--params", type=int, default=150)
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--out", type=Path, default=HERE / "out")
    args = parser.parse_args(argv)
    rows = []
    for flag in (False, True):
        with tempfile.TemporaryDirectory() as cache:
            rows.append({"flag": "on" if flag else "off", "cold_us": _run(cache, flag, args.params, args.calls),
                         "warm_us": _run(cache, flag, args.params, args.calls)})
    print(aligned(COLUMNS, rows))
    print(f"rows: {report.write(args.out, 'warm_step_cost', rows, argv)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
