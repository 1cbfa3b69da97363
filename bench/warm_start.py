"""Warm start: what a restarted process pays before its compiled code runs, flag off vs on.

For each workload and flag setting, two fresh processes share one new cache
directory (TORCHINDUCTOR_CACHE_DIR), inductor on CPU: a cold one, then a warm
one, each running the same calls.  Columns:

* frames: frames Dynamo traced in the warm process (0: every frame installed
  from its saved entry);
* cold s, warm s: what the first calls cost beyond running them (compiling,
  tracing, loading), and warm/cold; importing inductor (2-3 s here, paid by
  every process that compiles for it) is done before the clock starts;
* us/call: a call of the compiled code after everything is compiled, in the
  warm process (guard checks and launch; the fastest of 9 batches of 300):
  a loaded entry against a traced one;
* ok: every output equalled eager.

    python bench/warm_start.py                       # all workloads
    python bench/warm_start.py --workloads transformer train_step

Writes bench/out/warm_start.json.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
WORKLOADS = ("transformer", "train_step", "seed", "dict_collide", "list_overmarked", "closure")
FLAGS = {"off": "0", "on": "1"}


def run_child(workload: str, cache_dir: str, flag: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("TORCH_COMPILE_JOB_ID", "STABLEGUARDS_DISABLE")}
    env.update(TORCHINDUCTOR_CACHE_DIR=cache_dir, TORCHDYNAMO_STABLE_GUARDS=FLAGS[flag], PYTHONHASHSEED="random")
    proc = subprocess.run([sys.executable, str(HERE / "_warm_start_child.py"), workload], env=env,
                          capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"{workload} child failed:\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def measure(workload: str, flag: str) -> dict:
    with tempfile.TemporaryDirectory(prefix="sg-warm-") as cache_dir:
        cold = run_child(workload, cache_dir, flag)
        warm = run_child(workload, cache_dir, flag)
    return {"workload": workload, "flag": flag, "cold": cold, "warm": warm}


COLUMNS = (
    ("workload", lambda r: r["workload"]),
    ("flag", lambda r: r["flag"]),
    ("frames", lambda r: r["warm"]["frames"]),
    ("cold s", lambda r: f"{r['cold']['compile_s']:.2f}"),
    ("warm s", lambda r: f"{r['warm']['compile_s']:.2f}"),
    ("warm/cold", lambda r: f"{r['warm']['compile_s'] / r['cold']['compile_s']:.3f}"),
    ("us/call", lambda r: f"{r['warm']['per_call_us']:.0f}"),
    ("ok", lambda r: "yes" if r["cold"]["matches_eager"] and r["warm"]["matches_eager"] else "NO"),
)


def format_table(rows: list[dict]) -> str:
    cells = [[name for name, _ in COLUMNS]] + [[str(get(r)) for _, get in COLUMNS] for r in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(COLUMNS))]
    return "\n".join("  ".join(c.rjust(w) for c, w in zip(row, widths, strict=True)) for row in cells)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", nargs="+", default=list(WORKLOADS), choices=list(WORKLOADS))
    parser.add_argument("--out", type=Path, default=HERE / "out")
    args = parser.parse_args(argv)
    import torch

    print(f"torch {torch.__version__}, inductor on CPU; warm = a fresh process on the cold one's cache dir",
          flush=True)
    rows = []
    for workload in args.workloads:
        for flag in FLAGS:
            rows.append(measure(workload, flag))
            print(format_table(rows[-1:]).splitlines()[-1], flush=True)
    print()
    print(format_table(rows))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "warm_start.json").write_text(json.dumps(rows, indent=2))
    print(f"rows: {args.out / 'warm_start.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
