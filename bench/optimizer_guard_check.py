"""The guards of a compiled optimizer step, in C++: how many of each kind, and one check's cost.

For SGD (momentum 0.9) and Adam over N parameters, a fresh process per
configuration compiles ``opt.step()`` (eager backend), steps it three times,
then walks the C++ guard tree of the step frame's live cache entry (leaf
guards by kind, dict key/value managers included) and times
``guard_manager.check(f_locals)`` directly: best of 20 batches of 500 calls,
so the number is the check's cost, not the machine's noise.  Flag off and on
run back to back.

    .venv/bin/python bench/optimizer_guard_check.py
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

CHILD = r"""
import json, sys, timeit
import torch
import stableguards
import torch._C._dynamo.eval_frame as c_eval_frame
from torch._dynamo.convert_frame import input_codes
from stableguards.hooks.guard_tree import leaf_guard_kinds

name, n = sys.argv[1], int(sys.argv[2])
params = [torch.nn.Parameter(torch.randn(8)) for _ in range(n)]
for p in params:
    p.grad = torch.randn(8)
opt = getattr(torch.optim, name)(params, lr=0.01, **({"momentum": 0.9} if name == "SGD" else {}))
step = torch.compile(lambda: opt.step(), backend="eager")
for _ in range(3):
    step()

f_locals = {"self": opt, "closure": None}
for ref in list(input_codes.seen):
    code = ref()
    if code is None or code.co_name != "step" or "optim" not in code.co_filename:
        continue
    for entry in c_eval_frame._debug_get_cache_entry_list(code):
        with torch.no_grad():  # step runs with grad off, and its guards check that
            if entry.code is None or not entry.guard_manager.check(f_locals):
                continue
            kinds = leaf_guard_kinds(entry.guard_manager.root)
            best = min(timeit.repeat(lambda: entry.guard_manager.check(f_locals), number=500, repeat=20))
        print(json.dumps({"kinds": kinds, "check_us": best / 500 * 1e6}))
        sys.exit(0)
sys.exit("no passing cache entry for the step frame")
"""


def run(name: str, n: int, flag: bool) -> dict:
    env = dict(os.environ, TORCHDYNAMO_STABLE_GUARDS="1" if flag else "0",
               PYTHONPATH=os.pathsep.join([str(Path(__file__).resolve().parent),
                                           os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, "-c", CHILD, name, str(n)], env=env, capture_output=True,
                          text=True, timeout=1200, check=True)
    return json.loads(proc.stdout.strip().splitlines()[-1])


def per_param(kinds: dict, n: int) -> str:
    return ", ".join(f"{kind} {count / n:.2g}" for kind, count in sorted(kinds.items()) if count >= n)


def main() -> None:
    print("| optimizer | N | flag | C++ leaf guards | per parameter (kinds with ≥ 1) | check µs |")
    print("|---|---:|---|---:|---|---:|")
    for name in ("SGD", "Adam"):
        for n in (10, 100, 1000):
            for flag in (False, True):
                r = run(name, n, flag)
                print(f"| {name} | {n} | {'on' if flag else 'off'} | {sum(r['kinds'].values())} "
                      f"| {per_param(r['kinds'], n)} | {r['check_us']:.1f} |", flush=True)


if __name__ == "__main__":
    main()
