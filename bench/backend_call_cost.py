"""Per-call cost of BACKEND_MATCH on a warm call: flag off vs on, same run.

    python bench/backend_call_cost.py

A tiny compiled function (eager backend, so the call is mostly Dynamo's own
overhead) is called in rounds that alternate the flag; the table gives the
median nanoseconds per call.  With the flag on, cache entries hold an interned
key, so the C++ lookup still matches by pointer and no Python runs per call.

Writes bench/out/backend_call_cost.json.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
import torch._dynamo

import report
import stableguards  # noqa: F401 - registers the flag
from columns import aligned

HERE = Path(__file__).resolve().parent
CALLS = 20_000
ROUNDS = 15

COLUMNS = (
    ("flag off ns", lambda r: f"{r['off_ns']:.0f}"),
    ("flag on ns", lambda r: f"{r['on_ns']:.0f}"),
    ("difference ns", lambda r: f"{r['on_ns'] - r['off_ns']:+.0f}"),
    ("on/off", lambda r: f"{r['on_ns'] / r['off_ns']:.3f}"),
)


# One function per flag setting, so each has its own cache entries.
def add_one_flag_off(x):
    return x + 1


def add_one_flag_on(x):
    return x + 1


def ns_per_call(compiled, x) -> float:
    start = time.perf_counter_ns()
    for _ in range(CALLS):
        compiled(x)
    return (time.perf_counter_ns() - start) / CALLS


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=HERE / "out")
    args = parser.parse_args(argv)
    x = torch.ones(1)
    timings = {}
    for flag, fn in ((False, add_one_flag_off), (True, add_one_flag_on)):
        with torch._dynamo.config.patch(stable_guards=flag):
            compiled = torch.compile(fn, backend="eager")
            compiled(x)  # compile now
            timings[flag] = compiled
    off, on = [], []
    for _ in range(ROUNDS):
        with torch._dynamo.config.patch(stable_guards=False):
            off.append(ns_per_call(timings[False], x))
        with torch._dynamo.config.patch(stable_guards=True):
            on.append(ns_per_call(timings[True], x))
    rows = [{"off_ns": statistics.median(off), "on_ns": statistics.median(on)}]
    print(aligned(COLUMNS, rows))
    print(f"rows: {report.write(args.out, 'backend_call_cost', rows, argv)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
