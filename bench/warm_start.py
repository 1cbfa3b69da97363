"""Warm start: what a restarted process pays before its compiled code runs, flag off vs on.

For each workload and flag setting, two fresh processes share one new cache
directory (TORCHINDUCTOR_CACHE_DIR), inductor on CPU: a cold one, then a warm
one, each running the same calls.  Columns:

* frames: frames Dynamo traced in the warm process (0: every frame installed
  from its saved entry);
* graphs, fx miss: graphs the warm process built, and how many of them missed
  the FX-graph cache (a graph the cold process never built);
* cold s, warm s: what the first calls cost beyond running them (compiling,
  tracing, loading), and warm/cold; importing inductor (2-3 s here, paid by
  every process that compiles for it) is done before the clock starts;
* us/call: a call of the compiled code after everything is compiled, in the
  warm process (guard checks and launch; the fastest of 9 batches of 300):
  a loaded entry against a traced one; on the last input, and on the first
  (1st: for chunk_ff the oldest of its entries);
* ok: every output equalled eager.

    python bench/warm_start.py                       # all workloads
    python bench/warm_start.py --workloads transformer train_step
    python bench/warm_start.py --job-id bench     # with a job id: torch's PGO profiles on

Writes bench/out/warm_start.json (warm_start_job.json with a job id).
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
WORKLOADS = ("transformer", "train_step", "chunk_ff", "gan_step", "parametrized", "seed", "dict_collide",
             "list_overmarked", "closure")
FLAGS = {"off": "0", "on": "1"}


def run_child(workload: str, cache_dir: str, flag: str, job_id: str | None) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("TORCH_COMPILE_JOB_ID", "STABLEGUARDS_DISABLE")}
    env.update(TORCHINDUCTOR_CACHE_DIR=cache_dir, TORCHDYNAMO_STABLE_GUARDS=FLAGS[flag], PYTHONHASHSEED="random")
    if job_id:
        env["TORCH_COMPILE_JOB_ID"] = job_id
    proc = subprocess.run([sys.executable, str(HERE / "_warm_start_child.py"), workload], env=env,
                          capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"{workload} child failed:\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def measure(workload: str, flag: str, job_id: str | None) -> dict:
    with tempfile.TemporaryDirectory(prefix="sg-warm-") as cache_dir:
        cold = run_child(workload, cache_dir, flag, job_id)
        warm = run_child(workload, cache_dir, flag, job_id)
    return {"workload": workload, "flag": flag, "cold": cold, "warm": warm}


COLUMNS = (
    ("workload", lambda r: r["workload"]),
    ("flag", lambda r: r["flag"]),
    ("frames", lambda r: r["warm"]["frames"]),
    ("graphs", lambda r: r["warm"]["graphs"]),
    ("fx miss", lambda r: r["warm"]["fx_misses"]),
    ("cold s", lambda r: f"{r['cold']['compile_s']:.2f}"),
    ("warm s", lambda r: f"{r['warm']['compile_s']:.2f}"),
    ("warm/cold", lambda r: f"{r['warm']['compile_s'] / r['cold']['compile_s']:.3f}"),
    ("us/call", lambda r: f"{r['warm']['per_call_us']:.0f}"),
    ("us/call 1st", lambda r: f"{r['warm']['per_call_first_us']:.0f}"),
    ("ok", lambda r: "yes" if r["cold"]["matches_eager"] and r["warm"]["matches_eager"] else "NO"),
)


def format_table(rows: list[dict]) -> str:
    return aligned(COLUMNS, rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", nargs="+", default=list(WORKLOADS), choices=list(WORKLOADS))
    parser.add_argument("--job-id", help="TORCH_COMPILE_JOB_ID for both processes (torch's PGO on)")
    parser.add_argument("--out", type=Path, default=HERE / "out")
    args = parser.parse_args(argv)
    import torch

    print(f"torch {torch.__version__}, inductor on CPU; warm = a fresh process on the cold one's cache dir; "
          f"job id: {args.job_id or 'none'}", flush=True)
    rows = []
    for workload in args.workloads:
        for flag in FLAGS:
            rows.append(measure(workload, flag, args.job_id))
            print(format_table(rows[-1:]).splitlines()[-1], flush=True)
    print()
    print(format_table(rows))
    name = "warm_start_job" if args.job_id else "warm_start"
    print(f"rows: {report.write(args.out, name, rows, argv)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
