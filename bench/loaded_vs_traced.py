"""Per-call cost of a loaded warm-start entry against a traced one, in the same process.

Two identical functions, ``loaded`` and ``traced``; the cold process compiles
only ``loaded``.  The warm process (a fresh one on the same cache dir) installs
``loaded``'s saved entry and traces ``traced``: the two then differ only in how
their entry got there.  A second pair of processes does the same with the flag
off (both traced, from torch's caches in the warm one).  Cells: microseconds per
call, the fastest of 9 batches of 2000 calls; the warm process's loaded/traced; its guard
check alone (the entry's C++ guard tree on the frame's locals, µs, the fastest of 9 batches of
20000: a call's noise left out), loaded against traced; the entries it installed.

    python bench/loaded_vs_traced.py

Writes bench/out/loaded_vs_traced.json.
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
import json, os, sys, time
import torch, torch._dynamo
import torch._inductor.compile_fx
torch._dynamo.config.stable_guards = os.environ["FLAG"] == "1"
import stableguards

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

def guard_check(fn, x):
    # The guard check alone: the C++ guard tree of fn's one cache entry on its frame's locals,
    # the fastest of 9 batches of 20000 (a call's noise left out).
    import timeit
    from torch._C._dynamo.eval_frame import _debug_get_cache_entry_list

    entry, = [e for e in _debug_get_cache_entry_list(fn.__code__) if e.code is not None]
    assert entry.guard_manager.check({"x": x})
    return min(timeit.repeat(lambda: entry.guard_manager.check({"x": x}), number=20000, repeat=9)) / 20000 * 1e6

x = torch.randn(4)
a = torch.compile(loaded)
a(x)
out = {"installed": stableguards.EVENTS.counters["warm_start_loaded"]}
if sys.argv[1] == "warm":
    b = torch.compile(traced)
    b(x)
    out["traced"] = per_call(b, x)
    out["traced_check"] = guard_check(traced, x)
out["loaded"] = per_call(a, x)
out["loaded_check"] = guard_check(loaded, x)
print(json.dumps(out))
"""


def run(stage: str, flag: str, cache_dir: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("TORCH_COMPILE_JOB_ID", "STABLEGUARDS_DISABLE")}
    env.update(TORCHINDUCTOR_CACHE_DIR=cache_dir, FLAG=flag)
    proc = subprocess.run([sys.executable, "-c", CHILD, stage], env=env, capture_output=True, text=True, check=True)
    return json.loads(proc.stdout.strip().splitlines()[-1])


COLUMNS = (
    ("flag", lambda r: r["flag"]),
    ("cold: loaded fn", lambda r: f"{r['cold']['loaded']:.2f}"),
    ("warm: loaded fn", lambda r: f"{r['warm']['loaded']:.2f}"),
    ("warm: traced fn", lambda r: f"{r['warm']['traced']:.2f}"),
    ("loaded/traced", lambda r: f"{r['warm']['loaded'] / r['warm']['traced']:.3f}"),
    ("guards: loaded", lambda r: f"{r['warm']['loaded_check']:.3f}"),
    ("guards: traced", lambda r: f"{r['warm']['traced_check']:.3f}"),
    ("guards loaded/traced", lambda r: f"{r['warm']['loaded_check'] / r['warm']['traced_check']:.3f}"),
    ("installed", lambda r: r["warm"]["installed"]),
)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=HERE / "out")
    args = parser.parse_args(argv)
    import torch

    print(f"torch {torch.__version__}, inductor on CPU; us per call", flush=True)
    rows = []
    for flag in ("0", "1"):
        with tempfile.TemporaryDirectory(prefix="sg-lvt-") as cache_dir:
            rows.append({"flag": "on" if flag == "1" else "off", "cold": run("cold", flag, cache_dir),
                         "warm": run("warm", flag, cache_dir)})
    print(aligned(COLUMNS, rows))
    print(f"rows: {report.write(args.out, 'loaded_vs_traced', rows, argv)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
