"""Warm start at real sizes: how time to first step, guards, proof and load grow with the model, flag on.

For each model and size, a cold process and a restart on the same machine
(bench/first_step.py's processes and wall clocks), inference on 8 tokens, inductor on CPU.
Columns: cold and warm wall seconds from process start to the first step done, warm/cold;
what the restart spent in warm start's load, install and proof; the facts its proof checked
(one per guard it proves: the entry's guards), microseconds per fact; the entry's bytes loaded;
frames traced in the restart.

    python bench/scaling.py                                 # GPT-2 and Llama, 2 to 24 layers
    python bench/scaling.py --sizes gpt2:12:768             # GPT-2 small

Writes bench/out/scaling.json.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

import report
from columns import aligned
from first_step import measure, split

HERE = Path(__file__).resolve().parent
SIZES = ("gpt2:2:128", "gpt2:6:128", "gpt2:12:128", "gpt2:24:128", "gpt2:12:768",
         "llama:2:128", "llama:6:128", "llama:12:128", "llama:24:128")


def _warm(row: dict, name: str) -> float:
    return split(row["warm"])[name]


def _facts(row: dict) -> int:
    return row["warm"]["counters"].get("warm_start_facts_checked", 0)


COLUMNS = (
    ("model", lambda r: r["size"].split(":")[0]),
    ("layers", lambda r: r["size"].split(":")[1]),
    ("hidden", lambda r: r["size"].split(":")[2]),
    ("cold s", lambda r: f"{r['cold']['wall_s']:.1f}"),
    ("warm s", lambda r: f"{r['warm']['wall_s']:.2f}"),
    ("warm/cold", lambda r: f"{r['warm']['wall_s'] / r['cold']['wall_s']:.3f}"),
    ("load s", lambda r: f"{_warm(r, 'warm start load'):.3f}"),
    ("install s", lambda r: f"{_warm(r, 'warm start install'):.3f}"),
    ("proof s", lambda r: f"{_warm(r, 'warm start proof'):.3f}"),
    ("facts", _facts),
    ("us/fact", lambda r: f"{_warm(r, 'warm start proof') / max(1, _facts(r)) * 1e6:.1f}"),
    ("load MB", lambda r: f"{r['warm']['counters'].get('warm_start_loaded_bytes', 0) / 1e6:.2f}"),
    ("warm frames", lambda r: r["warm"]["frames"]),
    ("ok", lambda r: "yes" if r["cold"]["ok"] and r["warm"]["ok"] else "NO"),
)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", nargs="+", default=list(SIZES), help="MODEL:LAYERS:HIDDEN")
    parser.add_argument("--out", type=Path, default=HERE / "out")
    args = parser.parse_args(argv)
    import torch

    print(f"torch {torch.__version__}, inductor on CPU, {os.cpu_count()} cores, flag on", flush=True)
    rows = []
    with tempfile.TemporaryDirectory(prefix="sg-scaling-") as tmp:
        for size in args.sizes:
            cold, warm = measure(size, "on", ["cold", "warm"], Path(tmp))
            rows.append({"size": size, "cold": cold, "warm": warm})
            print(aligned(COLUMNS, rows).splitlines()[-1], flush=True)
    print()
    print(aligned(COLUMNS, rows))
    path = report.write(args.out, "scaling", rows, argv)
    print(f"rows: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
