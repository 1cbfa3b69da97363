"""Cost of one symbol id: torch's ShapeEnv._generate_unique_id vs stableguards', same run.

    python bench/alloc_cost.py

Each round allocates N source names into a fresh ShapeEnv through the hooked
method, once with the flag off (torch's sha256 % 100 allocator) and once with it
on (xxh64 + the symbol table's bookkeeping).  Rounds alternate to share the noise.
"""

from __future__ import annotations

import statistics
import time

import torch._dynamo.config as dynamo_config
from torch.fx.experimental.symbolic_shapes import ShapeEnv

import stableguards  # noqa: F401 - registers the flag and hooks

ROUNDS = 15


def ns_per_symbol(names: list[str], flag: bool) -> float:
    with dynamo_config.patch(stable_guards=flag):
        shape_env = ShapeEnv()
        start = time.perf_counter_ns()
        for name in names:
            shape_env._generate_unique_id(name)
        return (time.perf_counter_ns() - start) / len(names)


def main() -> None:
    print(f"{'symbols':>8} {'upstream ns':>12} {'stable ns':>10} {'ratio':>6}")
    for n in (10, 100, 1000):
        names = [f"L['xs'][{i}].size()[0]" for i in range(n)]
        off, on = [], []
        for _ in range(ROUNDS):
            off.append(ns_per_symbol(names, False))
            on.append(ns_per_symbol(names, True))
        off_ns, on_ns = statistics.median(off), statistics.median(on)
        print(f"{n:>8} {off_ns:>12.0f} {on_ns:>10.0f} {on_ns / off_ns:>6.2f}")


if __name__ == "__main__":
    main()
