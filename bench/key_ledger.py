"""What explaining an FX-graph cache miss costs: reading the ledger and finding the closest key.

    python bench/key_ledger.py

Fills a ledger with N recorded keys of realistic size (about 200 components,
a 2 KB graph) and times one miss explanation (read the most recent keys,
pick the closest, diff it; median of 5) and the recording of one more key.  An
explanation runs once per local cache miss, that is, once per graph that
inductor then compiles for seconds.

Writes bench/out/key_ledger.json.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import report
from columns import aligned
from stableguards.keys.ledger import KeyLedger, KeyRecord, differences, nearest

HERE = Path(__file__).resolve().parent

COLUMNS = (
    ("recorded keys", lambda r: r["keys"]),
    ("explain a miss, ms", lambda r: f"{r['explain_ms']:.1f}"),
    ("record a key, ms", lambda r: f"{r['record_ms']:.1f}"),
)


def make_record(i: int) -> KeyRecord:
    lines = [f"[g{i % 50}] gm: " + "\n".join(f"    op_{j} = torch.ops.aten.mul.Tensor(x, {j})"
                                              for j in range(40))]
    lines += [f"[e{i}] example_inputs[0]: ('s{i}',)"]
    lines += [f"[c{j}] inductor_config[option_{j}]: value {j}" for j in range(200)]
    return KeyRecord.from_debug_lines(f"key{i:05d}", lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=HERE / "out")
    args = parser.parse_args(argv)
    rows = []
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
        rows.append({"keys": n, "explain_ms": statistics.median(explain), "record_ms": record_ms})
    print(aligned(COLUMNS, rows))
    print(f"rows: {report.write(args.out, 'key_ledger', rows, argv)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
