"""Cross-restart A/B: does a restarted process find its compiled graphs in the caches?

For each workload and each configuration (flag off or on, with or without a
job id; optionally flag on with the stable symbol allocator left to torch), two
fresh processes share one new cache directory (TORCHINDUCTOR_CACHE_DIR): a cold
one, then a warm one, each making the same calls.  The warm process's counters say whether the restart reused the
cold work.  All configurations run in the same invocation, so the ratios compare
like with like on a noisy machine.

    python bench/restart_ab.py                # all workloads, inductor
    python bench/restart_ab.py --workloads seed --backend aot_eager
    python bench/restart_ab.py --configs off on "on, symbols off" --job-id set

It counts; it does not time: what a restart costs a user is bench/first_step.py's wall clock.

Writes bench/out/restart_ab.json.
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
from columns import aligned, markdown as markdown_table

HERE = Path(__file__).resolve().parent
DEFAULT_OUT = HERE / "out"
# Upstream PGO reads and writes profiles only when a job id is set (the
# open-source default has none); stableguards keys its profile by the entry point.
JOB_ID = "stableguards-restart-ab"
CONFIGS = {
    "off": {"TORCHDYNAMO_STABLE_GUARDS": "0"},
    "on": {"TORCHDYNAMO_STABLE_GUARDS": "1"},
    "on, symbols off": {"TORCHDYNAMO_STABLE_GUARDS": "1", "STABLEGUARDS_DISABLE": "symbols"},
}
JOB_IDS = {"set": {"TORCH_COMPILE_JOB_ID": JOB_ID}, "unset": {}}


def run_child(workload: str, backend: str, cache_dir: str, env_overrides: dict) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "TORCH_COMPILE_JOB_ID"}
    env.update(TORCHINDUCTOR_CACHE_DIR=cache_dir, PYTHONHASHSEED="random")
    env.update(env_overrides)
    proc = subprocess.run(
        [sys.executable, str(HERE / "_restart_child.py"), workload, backend],
        env=env,
        capture_output=True,
        text=True,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"{workload} child failed:\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def measure(workload: str, backend: str, config: str, job_id: str, extra_env: dict | None = None) -> dict:
    env = {**CONFIGS[config], **JOB_IDS[job_id], **(extra_env or {})}
    with tempfile.TemporaryDirectory(prefix="sg-ab-") as cache_dir:
        cold = run_child(workload, backend, cache_dir, env)
        warm = run_child(workload, backend, cache_dir, env)
    return {"workload": workload, "config": config, "job_id": job_id, "cold": cold, "warm": warm}


COLUMNS = (
    ("config", lambda r: r["config"]),
    ("job id", lambda r: r["job_id"]),
    ("fx hit", lambda r: r["warm"]["fxgraph_cache_hit"]),
    ("fx miss", lambda r: r["warm"]["fxgraph_cache_miss"]),
    ("aot hit", lambda r: r["warm"]["autograd_cache_hit"]),
    ("aot miss", lambda r: r["warm"]["autograd_cache_miss"]),
    ("compiles", lambda r: r["warm"]["compiles"]),
    ("recompiles", lambda r: r["warm"]["recompiles"]),
    ("warm==eager", lambda r: "yes" if r["warm"]["matches_eager"] else "NO"),
)


def format_table(workload: str, rows: list[dict]) -> str:
    return f"== {workload} (the warm run's caches)\n" + aligned(COLUMNS, rows)


def markdown(rows: list[dict]) -> str:
    """docs/benchmarks.md's table (``bench/report.py``)."""
    return markdown_table((("workload", lambda r: r["workload"]), *COLUMNS), rows)


def main(argv: list[str] | None = None) -> int:
    from workloads import WORKLOADS

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", nargs="+", default=list(WORKLOADS), choices=list(WORKLOADS))
    parser.add_argument("--configs", nargs="+", default=["off", "on"], choices=list(CONFIGS))
    parser.add_argument("--job-id", choices=["set", "unset", "both"], default="both")
    parser.add_argument("--backend", default="inductor")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--env", action="append", default=[], metavar="NAME=VALUE",
                        help="extra environment for the child processes (every configuration)")
    args = parser.parse_args(argv)
    extra_env = dict(item.split("=", 1) for item in args.env)

    rows = []
    job_ids = list(JOB_IDS) if args.job_id == "both" else [args.job_id]
    import torch

    print(f"torch {torch.__version__}, backend {args.backend}", flush=True)
    for workload in args.workloads:
        group = [measure(workload, args.backend, config, job_id, extra_env)
                 for job_id in job_ids for config in args.configs]
        print(format_table(workload, group), flush=True)
        print(flush=True)
        rows += group
    print(f"rows: {report.write(args.out, 'restart_ab', rows, argv)}")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(HERE))
    sys.exit(main())
