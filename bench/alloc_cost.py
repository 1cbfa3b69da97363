"""Cost of one symbol id: torch's ShapeEnv._generate_unique_id vs stableguards', same run.

    python bench/alloc_cost.py

Each round allocates N source names into a fresh ShapeEnv through the hooked
method, once with the flag off (torch's sha256 % 100 allocator) and once with it
on (xxh64 + the symbol table's bookkeeping).  Rounds alternate to share the noise.
Columns: median ns per symbol, flag off and on, and on/off.

Writes bench/out/alloc_cost.json.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch._dynamo.config as dynamo_config
from torch.fx.experimental.symbolic_shapes import ShapeEnv

import report
import stableguards  # noqa: F401 - registers the flag and hooks
from columns import aligned

HERE = Path(__file__).resolve().parent
ROUNDS = 15

COLUMNS = (
    ("symbols", lambda r: r["symbols"]),
    ("upstream ns", lambda r: f"{r['off_ns']:.0f}"),
    ("stable ns", lambda r: f"{r['on_ns']:.0f}"),
    ("on/off", lambda r: f"{r['on_ns'] / r['off_ns']:.2f}"),
)


def ns_per_symbol(names: list[str], flag: bool) -> float:
    with dynamo_config.patch(stable_guards=flag):
        shape_env = ShapeEnv()
        start = time.perf_counter_ns()
        for name in names:
            shape_env._generate_unique_id(name)
        return (time.perf_counter_ns() - start) / len(names)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=HERE / "out")
    args = parser.parse_args(argv)
    rows = []
    for n in (10, 100, 1000):
        names = [f"L['xs'][{i}].size()[0]" for i in range(n)]
        off, on = [], []
        for _ in range(ROUNDS):
            off.append(ns_per_symbol(names, False))
            on.append(ns_per_symbol(names, True))
        rows.append({"symbols": n, "off_ns": statistics.median(off), "on_ns": statistics.median(on)})
    print(aligned(COLUMNS, rows))
    print(f"rows: {report.write(args.out, 'alloc_cost', rows, argv)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
