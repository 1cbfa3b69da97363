"""Distributed training across a restart, flag off vs on: frames each rank traces again, cache
hits, and the first step's wall seconds, cold and warm.

Each rank is a process of a gloo process group (CPU) with its own empty local cache dir, as on
its own machine; flag on, the ranks share one store (STABLEGUARDS_STORE: a directory, or with
``--redis`` a redis-server started here on a free loopback port).  bench/_distributed_child.py
runs each setting in a job of its own: a 4-block transformer stack trained a few SGD steps
as is (single), under DDP without and with DDPOptimizer and with a compiled optimizer step,
under FSDP2 (resharding after forward or not, bf16 mixed precision, activation checkpointing),
tensor parallel and both on a 2-D mesh, and a function with collectives.  "cold": the ranks start on empty dirs; "warm": all restart.
Each row's jobs run apart, as a restarted job's do: a process serves one code object the
entries of one key only, so a second setting compiling the same code there would compile.
Columns per setting and flag: frames traced per rank (max over ranks), FX/AOT cache hits,
misses and bypasses in the warm run (summed over ranks), first-step wall seconds (slowest rank:
``torch.compile()`` to the first finished optimizer step), warm/cold, and whether every rank
equalled its uncompiled run.

    python bench/distributed.py                       # every setting, 2 ranks, inductor
    python bench/distributed.py --settings ddp fsdp2 --redis   # the store in Redis

Writes bench/out/distributed.json.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

import report
from columns import aligned
from fleet import fresh_store, redis_store, run_ranks

HERE = Path(__file__).resolve().parent
SETTINGS = ("single", "ddp_plain", "ddp", "ddp_optim", "fsdp2", "fsdp2_keep", "fsdp2_mp", "fsdp2_ac", "tp",
            "fsdp2_tp", "collectives")


def run_job(ranks: int, flag: str, store: str | None, dirs: list[Path], backend: str,
            settings: list[str]) -> list[dict]:
    # One thread per rank: the ranks share the machine's cores.
    return run_ranks(ranks, flag, store, dirs, "_distributed_child.py", (backend, *settings), {"OMP_NUM_THREADS": "1"})


def measure(ranks: int, flag: str, workdir: Path, redis_url: str | None, backend: str, setting: str) -> dict:
    """One setting, flag off or on: a cold job, then a restart, each its own processes (a
    process that compiled one setting's code would serve it to the next: one job, one setting)."""
    dirs = [workdir / f"{setting}-flag{flag}-rank{r}" for r in range(ranks)]
    store = fresh_store(flag, redis_url, workdir / f"{setting}-store")
    cold = run_job(ranks, flag, store, dirs, backend, [setting])
    warm = run_job(ranks, flag, store, dirs, backend, [setting])
    return {"setting": setting, "flag": "on" if flag == "1" else "off",
            "store": ("redis" if redis_url else "directory") if store else "-", "ranks": ranks,
            "cold": [r["settings"][setting] for r in cold], "warm": [r["settings"][setting] for r in warm],
            "explain": [r["explain"] for r in warm]}


def _count(row: dict, kind: str) -> int:
    return sum(n for r in row["warm"] for k, n in r["counters"].items() if k.endswith(kind))


def _first(run: list[dict]) -> float:
    return max(r["first_step_s"] for r in run)


COLUMNS = (
    ("setting", lambda r: r["setting"]),
    ("flag", lambda r: r["flag"]),
    ("store", lambda r: r["store"]),
    ("cold frames", lambda r: max(len(x["traced"]) for x in r["cold"])),
    ("warm frames", lambda r: max(len(x["traced"]) for x in r["warm"])),
    ("warm hits", lambda r: _count(r, "_hit")),
    ("warm misses", lambda r: _count(r, "_miss")),
    ("warm bypasses", lambda r: _count(r, "_bypass")),
    ("cold first step s", lambda r: f"{_first(r['cold']):.2f}"),
    ("warm first step s", lambda r: f"{_first(r['warm']):.2f}"),
    ("warm/cold", lambda r: f"{_first(r['warm']) / _first(r['cold']):.3f}"),
    ("ok", lambda r: "yes" if all(x["ok"] for x in r["cold"] + r["warm"]) else "NO"),
)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--settings", nargs="+", choices=SETTINGS, default=list(SETTINGS))
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--backend", default="inductor")
    parser.add_argument("--flags", nargs="+", choices=("off", "on"), default=["off", "on"])
    parser.add_argument("--redis", action="store_true", help="the shared store in a redis-server started here")
    parser.add_argument("--out", type=Path, default=HERE / "out")
    args = parser.parse_args(argv)
    import torch

    print(f"torch {torch.__version__}, {args.ranks} gloo ranks on CPU, backend {args.backend}, "
          f"{os.cpu_count()} cores; each rank its own local cache dir", flush=True)
    rows: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="sg-dist-") as tmp:
        with redis_store(Path(tmp), required=args.redis) as url:
            for setting in args.settings:
                for flag in ("1" if f == "on" else "0" for f in args.flags):
                    rows.append(measure(args.ranks, flag, Path(tmp), url if args.redis else None, args.backend,
                                        setting))
                    print(aligned(COLUMNS, rows[-1:]).splitlines()[-1], flush=True)
    rows.sort(key=lambda r: (SETTINGS.index(r["setting"]), r["flag"]))
    print(aligned(COLUMNS, rows))
    for row in rows:
        if row["flag"] == "on" and any(x["traced"] for x in row["warm"]):
            print(f"\n{row['setting']}, flag on, traced warm: {[x['traced'] for x in row['warm']]}")
    print(f"rows: {report.write(args.out, 'distributed', rows, argv)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
