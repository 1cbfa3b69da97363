"""The guards of a compiled optimizer step, in C++: how many of each kind, and one check's cost.

For SGD (momentum 0.9) and Adam over N parameters, a fresh process per
configuration compiles ``opt.step()`` (eager backend), steps it three times,
then walks the C++ guard tree of the step frame's live cache entry (leaf
guards by kind, dict key/value managers included) and times
``guard_manager.check(f_locals)`` directly: best of 20 batches of 500 calls,
so the number is the check's cost, not the machine's noise.  Flag off and on
run back to back.  Columns, flag off and on: the leaf guards, the kinds with at
least one per parameter (count per parameter), the check's microseconds, on/off.

    python bench/optimizer_guard_check.py
    python bench/optimizer_guard_check.py --optimizers SGD --sizes 10

Writes bench/out/optimizer_guard_check.json.
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
               PYTHONPATH=os.pathsep.join([str(HERE),
                                           os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, "-c", CHILD, name, str(n)], env=env, capture_output=True,
                          text=True, timeout=1200, check=True)
    return json.loads(proc.stdout.strip().splitlines()[-1])


def per_param(r: dict, flag: str) -> str:
    kinds, n = r[flag]["kinds"], r["n"]
    return ", ".join(f"{kind} {count / n:.2g}" for kind, count in sorted(kinds.items()) if count >= n)


COLUMNS = (
    ("optimizer", lambda r: r["optimizer"]),
    ("N", lambda r: r["n"]),
    ("leaf guards off", lambda r: sum(r["off"]["kinds"].values())),
    ("leaf guards on", lambda r: sum(r["on"]["kinds"].values())),
    ("per parameter off", lambda r: per_param(r, "off")),
    ("per parameter on", lambda r: per_param(r, "on")),
    ("check us off", lambda r: f"{r['off']['check_us']:.1f}"),
    ("check us on", lambda r: f"{r['on']['check_us']:.1f}"),
    ("check on/off", lambda r: f"{r['on']['check_us'] / r['off']['check_us']:.2f}"),
)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--optimizers", nargs="+", default=["SGD", "Adam"], choices=["SGD", "Adam"])
    parser.add_argument("--sizes", nargs="+", type=int, default=[10, 100, 1000])
    parser.add_argument("--out", type=Path, default=HERE / "out")
    args = parser.parse_args(argv)
    rows = []
    for name in args.optimizers:
        for n in args.sizes:
            rows.append({"optimizer": name, "n": n, "off": run(name, n, False), "on": run(name, n, True)})
            print(aligned(COLUMNS, rows).splitlines()[-1], flush=True)
    print()
    print(aligned(COLUMNS, rows))
    print(f"rows: {report.write(args.out, 'optimizer_guard_check', rows, argv)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
