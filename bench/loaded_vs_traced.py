"""Per-call cost of a loaded warm-start entry against a traced one, in the same process.

Two identical functions, ``loaded`` and ``traced``; the cold process compiles
only ``loaded``.  The warm process (a fresh one on the same cache dir) installs
``loaded``'s saved entry and traces ``traced``: the two then differ only in how
their entry got there.  A second pair of processes does the same with the flag
off (both traced, from torch's caches in the warm one).  Cells: microseconds per
call, the fastest of 9 batches of 2000 calls.

    python bench/loaded_vs_traced.py
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile

CHILD = """
import json, os, sys, time
import torch, torch._dynamo
import torch._inductor.compile_fx
torch._dynamo.config.stable_guards = os.environ["FLAG"] == "1"
import stableguards
from torch._dynamo.utils import counters

def loaded(x):
    return x * 2 + 1

def traced(x):
    return x * 2 + 1

def per_call(fn, x):
    for _ in range(200):
        fn(x)
    best = []
    for _ in range(9):
        start = time.perf_counter()
        for _ in range(2000):
            fn(x)
        best.append((time.perf_counter() - start) / 2000 * 1e6)
    return min(best)

x = torch.randn(4)
a = torch.compile(loaded)
a(x)
out = {"installed": counters["dynamo_cache"]["dynamo_cache_hit"]}
if sys.argv[1] == "warm":
    b = torch.compile(traced)
    b(x)
    out["traced"] = per_call(b, x)
out["loaded"] = per_call(a, x)
print(json.dumps(out))
"""


def run(stage: str, flag: str, cache_dir: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("TORCH_COMPILE_JOB_ID", "STABLEGUARDS_DISABLE")}
    env.update(TORCHINDUCTOR_CACHE_DIR=cache_dir, FLAG=flag)
    proc = subprocess.run([sys.executable, "-c", CHILD, stage], env=env, capture_output=True, text=True, check=True)
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> int:
    import torch

    print(f"torch {torch.__version__}, inductor on CPU; us per call")
    print(f"{'flag':>4} {'cold: loaded fn':>16} {'warm: loaded fn':>16} {'warm: traced fn':>16} {'installed':>9}")
    for flag in ("0", "1"):
        with tempfile.TemporaryDirectory(prefix="sg-lvt-") as cache_dir:
            cold = run("cold", flag, cache_dir)
            warm = run("warm", flag, cache_dir)
        print(f"{'on' if flag == '1' else 'off':>4} {cold['loaded']:16.2f} {warm['loaded']:16.2f} "
              f"{warm['traced']:16.2f} {warm['installed']:9d}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
