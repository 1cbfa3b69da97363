"""What explaining an FX-graph cache miss costs: reading the ledger and finding the closest key.

    python bench/key_ledger.py

Fills a ledger with N recorded keys of realistic size (about 200 components,
a 2 KB graph) and times one miss explanation: read the most recent keys,
pick the closest, diff it.  This runs once per local cache miss, that is,
once per graph that inductor then compiles for seconds.
"""

from __future__ import annotations

import statistics
import tempfile
import time

from stableguards.keys.ledger import KeyLedger, KeyRecord, differences, nearest


def make_record(i: int) -> KeyRecord:
    lines = [f"[g{i % 50}] gm: " + "\n".join(f"    op_{j} = torch.ops.aten.mul.Tensor(x, {j})"
                                              for j in range(40))]
    lines += [f"[e{i}] example_inputs[0]: ('s{i}',)"]
    lines += [f"[c{j}] inductor_config[option_{j}]: value {j}" for j in range(200)]
    return KeyRecord.from_debug_lines(f"key{i:05d}", lines)


def main() -> None:
    print(f"{'recorded keys':>13} {'explain a miss, ms':>19} {'record a key, ms':>17}")
    for n in (10, 100, 500):
        with tempfile.TemporaryDirectory() as d:
            ledger = KeyLedger(d)
            for i in range(n):
                ledger.record(make_record(i))
            new = make_record(n + 1)
            explain = []
            for _ in range(5):
                start = time.perf_counter()
                closest = nearest(new, ledger.recent())
                differences(new, closest)
                explain.append((time.perf_counter() - start) * 1000)
            start = time.perf_counter()
            ledger.record(new)
            record_ms = (time.perf_counter() - start) * 1000
        print(f"{n:>13} {statistics.median(explain):>19.1f} {record_ms:>17.1f}")


if __name__ == "__main__":
    main()
