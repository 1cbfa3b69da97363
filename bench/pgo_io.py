"""Read and write time of a 1,000-source profile, local directory and Redis.

    python bench/pgo_io.py [--redis URL]

The profile has 10 frames of 100 two-dimensional tensor sources.  Rows compare
with upstream's format (a pickle of torch's FrameStateSizeEntry objects, what
torch 2.13 writes and reads) on the same state, in the same run.  Cells: the
median of 21 rounds.

Writes bench/out/pgo_io.json.
"""

from __future__ import annotations

import argparse
import pickle
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import report
from columns import aligned
from stableguards.profiles.profile import DYNAMIC, CodeKey, Profile, SourceEntry, specialized, static
from stableguards.profiles.store import EngineStore, decode, encode
from stableguards.storage.engines import DirectoryEngine

HERE = Path(__file__).resolve().parent
ROUNDS = 21
COLUMNS = (("operation", lambda r: r["operation"]), ("median ms", lambda r: f"{r['ms']:.2f}"))


def make_profile(frames: int = 10, per_frame: int = 100) -> Profile:
    return Profile({
        CodeKey(f"{f:08x}", 10 + f, f"step_{f}", None, "train.py"): {
            f"L['batch'][{i}]": SourceEntry(
                DYNAMIC,
                (DYNAMIC if i % 3 else specialized("range_refined_to_singleton"), static(64)),
                (static("S(1)"), static(1)),
            )
            for i in range(per_frame)
        }
        for f in range(frames)
    })


def median_ms(fn: Callable[[], object]) -> float:
    times = []
    for _ in range(ROUNDS):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--redis", metavar="URL", help="also time a Redis store")
    parser.add_argument("--out", type=Path, default=HERE / "out")
    args = parser.parse_args(argv)

    import stableguards.profiles.hooks as integration  # the converters to torch's objects

    profile = make_profile()
    raw = encode(profile)
    upstream = {code: {n: integration._to_frame_state(e) for n, e in sources.items()}
                for code, sources in profile.frames.items()}
    pickled = pickle.dumps(upstream)
    rows = [
        ("encode (JSON)", median_ms(lambda: encode(profile))),
        ("decode + schema check", median_ms(lambda: decode(raw))),
        ("upstream pickle.dumps", median_ms(lambda: pickle.dumps(upstream))),
        ("upstream pickle.loads", median_ms(lambda: pickle.loads(pickled))),
    ]
    with tempfile.TemporaryDirectory() as d:
        store = EngineStore(DirectoryEngine(d))
        store.merge_write("job", profile)
        rows += [
            ("local read", median_ms(lambda: store.read("job"))),
            ("local merge_write (read, join, swap under lock)", median_ms(lambda: store.merge_write("job", profile))),
        ]
    if args.redis:
        from stableguards.storage import redis_engine

        redis_store = EngineStore(redis_engine(args.redis))
        redis_store.merge_write("bench", profile)
        rows += [
            ("redis read", median_ms(lambda: redis_store.read("bench"))),
            ("redis merge_write (read, join, swap script)",
             median_ms(lambda: redis_store.merge_write("bench", profile))),
        ]
        redis_store.clear("bench")
    print(f"profile: {len(profile)} sources in {len(profile.frames)} frames, "
          f"{len(raw) / 1024:.0f} KiB JSON ({len(pickled) / 1024:.0f} KiB as upstream's pickle)")
    rows = [{"operation": name, "ms": ms} for name, ms in rows]
    print(aligned(COLUMNS, rows))
    print(f"rows: {report.write(args.out, 'pgo_io', rows, argv)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
