"""Per-call cost of BACKEND_MATCH on a warm call: flag off vs on, same run.

    python bench/backend_call_cost.py

A tiny compiled function (eager backend, so the call is mostly Dynamo's own
overhead) is called in rounds that alternate the flag; the table gives the
median nanoseconds per call.  With the flag on, cache entries hold an interned
key, so the C++ lookup still matches by pointer and no Python runs per call.
"""

from __future__ import annotations

import statistics
import time

import torch
import torch._dynamo

import stableguards  # noqa: F401 - registers the flag

CALLS = 20_000
ROUNDS = 15


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


def main() -> None:
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
    off_ns, on_ns = statistics.median(off), statistics.median(on)
    print(f"{'warm call':<10} {'median ns':>10}")
    print(f"{'flag off':<10} {off_ns:>10.0f}")
    print(f"{'flag on':<10} {on_ns:>10.0f}")
    print(f"difference {on_ns - off_ns:>+10.0f} ns  (ratio {on_ns / off_ns:.3f})")


if __name__ == "__main__":
    main()
