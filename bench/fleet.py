"""A job's ranks across a restart, with and without one shared store: total compile seconds
across N ranks, cold and warm, flag off vs on.

Each rank is a process of a gloo process group (CPU) with its own empty local cache dir, as
on its own machine (bench/_fleet_child.py: a 4-layer transformer encoder, no grad, and a
function that folds the rank into its graph).  "cold": N ranks start together; "warm": all N
restart, each on its own cache dir from the cold run.  Flag off is torch: every rank
compiles.  Flag on, the ranks share one store (STABLEGUARDS_STORE: a redis-server started
here on a free loopback port, else a directory): no rank waits on another's lease (a rank's
compiles run between collectives); what one rank saved first the others load, and each
keeps its own entry for what folds its rank.
Columns: compile s (torch.compile() and first calls, waits included) summed over ranks and of
the slowest rank (when the job is ready), frames traced (sum), store bytes per entry.

    python bench/fleet.py                 # N = 1, 2, 4
    python bench/fleet.py --ranks 1 2

Writes bench/out/fleet.json.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import report
from columns import aligned

HERE = Path(__file__).resolve().parent


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def redis_store(workdir: Path, required: bool = False) -> Iterator[str | None]:
    """A redis-server on a free loopback port for this bench, or None without one (an exit
    when the bench was asked for one: ``required``)."""
    server = shutil.which("redis-server")
    if server is None:
        if required:
            raise SystemExit("--redis: no redis-server on PATH")
        yield None
        return
    port = _free_port()
    proc = subprocess.Popen([server, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly",
                             "no", "--dir", str(workdir)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError):
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            time.sleep(0.05)
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def fresh_store(flag: str, redis_url: str | None, directory: Path) -> str | None:
    """The store a job uses: none flag off; flag on the Redis (emptied first), else ``directory``."""
    if flag != "1":
        return None
    if redis_url:
        import redis

        redis.Redis.from_url(redis_url).flushdb()
    return redis_url or str(directory)


def run_ranks(n: int, flag: str, store: str | None, dirs: list[Path], child: str = "_fleet_child.py",
              args: tuple[str, ...] = (), extra: dict[str, str] | None = None) -> list[dict]:
    """``child`` (in bench/) run as the ``n`` ranks of one gloo job, each on its cache dir in
    ``dirs``, with the flag and the store given and ``extra`` in its environment: what each
    printed last, as JSON."""
    port = _free_port()
    procs = []
    for rank in range(n):
        env = {k: v for k, v in os.environ.items() if not k.startswith(("STABLEGUARDS_", "TORCH_COMPILE_JOB_ID"))}
        env.update(TORCHINDUCTOR_CACHE_DIR=str(dirs[rank]), TORCHDYNAMO_STABLE_GUARDS=flag, RANK=str(rank),
                   WORLD_SIZE=str(n), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), PYTHONHASHSEED="random",
                   **(extra or {}))
        if store:
            env["STABLEGUARDS_STORE"] = store
        procs.append(subprocess.Popen([sys.executable, str(HERE / child), *args], env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    results = []
    for proc in procs:
        out, err = proc.communicate()
        if proc.returncode != 0:
            raise RuntimeError(f"a rank failed:\n{err[-4000:]}")
        results.append(json.loads(out.strip().splitlines()[-1]))
    return results


def store_bytes(store: str) -> tuple[int, int]:
    """(bytes of entry blobs, entries) in the store."""
    if store.startswith("redis://"):
        import redis

        client = redis.Redis.from_url(store)
        prefix = "stableguards:store:"
        blobs = sum(client.strlen(k) for k in client.scan_iter(prefix + "blobs/*"))
        entries = sum(1 for _ in client.scan_iter(prefix + "refs/warm_start/*"))
        return blobs, entries
    root = Path(store)
    return (sum(p.stat().st_size for p in (root / "blobs").glob("*")),
            sum(1 for _ in (root / "refs" / "warm_start").glob("*")))


def measure(n: int, flag: str, workdir: Path, redis_url: str | None) -> dict:
    dirs = [workdir / f"n{n}-flag{flag}-rank{r}" for r in range(n)]
    store = fresh_store(flag, redis_url, workdir / f"n{n}-store")
    cold = run_ranks(n, flag, store, dirs)
    warm = run_ranks(n, flag, store, dirs)
    blobs, entries = store_bytes(store) if store else (0, 0)
    return {"ranks": n, "flag": "on" if flag == "1" else "off", "store": "redis" if redis_url and store else
            ("directory" if store else "-"), "cold": cold, "warm": warm, "store_bytes": blobs, "entries": entries}


COLUMNS = (
    ("N", lambda r: r["ranks"]),
    ("flag", lambda r: r["flag"]),
    ("store", lambda r: r["store"]),
    ("cold s (sum)", lambda r: f"{sum(x['compile_s'] for x in r['cold']):.2f}"),
    ("cold s (slowest)", lambda r: f"{max(x['compile_s'] for x in r['cold']):.2f}"),
    ("warm s (sum)", lambda r: f"{sum(x['compile_s'] for x in r['warm']):.2f}"),
    ("warm s (slowest)", lambda r: f"{max(x['compile_s'] for x in r['warm']):.2f}"),
    ("cold frames", lambda r: sum(x["frames"] for x in r["cold"])),
    ("warm frames", lambda r: sum(x["frames"] for x in r["warm"])),
    ("entries", lambda r: r["entries"] or "-"),
    ("KB/entry", lambda r: f"{r['store_bytes'] / r['entries'] / 1024:.0f}" if r["entries"] else "-"),
    ("ok", lambda r: "yes" if all(x["ok"] for x in r["cold"] + r["warm"]) else "NO"),
)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", nargs="+", type=int, default=[1, 2, 4])
    parser.add_argument("--out", type=Path, default=HERE / "out")
    args = parser.parse_args(argv)
    import torch

    print(f"torch {torch.__version__}, gloo on CPU, {os.cpu_count()} cores; each rank its own local cache dir",
          flush=True)
    rows = []
    with tempfile.TemporaryDirectory(prefix="sg-fleet-") as tmp, redis_store(Path(tmp)) as redis_url:
        for n in args.ranks:
            for flag in ("0", "1"):
                rows.append(measure(n, flag, Path(tmp), redis_url))
                print(aligned(COLUMNS, rows[-1:]).splitlines()[-1], flush=True)
    print()
    print(aligned(COLUMNS, rows))
    print(f"rows: {report.write(args.out, 'fleet', rows, argv)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
