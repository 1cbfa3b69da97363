"""Time to first step, as a user waits for it: process start to the first finished step, flag off vs on.

For each workload and flag, fresh processes (bench/_first_step_child.py), inductor on CPU:

* cold: an empty cache dir (TORCHINDUCTOR_CACHE_DIR) and temporary dir, and an empty store;
* warm: a restart on the same machine: the cold process's dirs and store;
* new machine: empty dirs of its own, the cold process's store (STABLEGUARDS_STORE, a
  directory, or with ``--redis`` a redis-server started here, as a fleet shares one).  Flag
  off, torch has nothing to share: it starts cold.

Every figure is a wall clock: "wall s" from the spawn of the process to its first step done, and
its split, which adds up to it: start and import (the interpreter, torch, transformers,
stableguards), build (the model and its inputs), Dynamo's trace, AOTAutograd and inductor's
compile, the C++ build of kernels (and of inductor's CPU checks), kernel binaries fetched from the
store and published to it, warm start's guards (saved with their proof, cold), key, load, install,
proof and save, the step itself (the same call again, compiled), and what none of these timers
saw ("other": guards, Python's garbage collections, torch.compile()'s own work).  Also: frames
Dynamo traced, FX and AOTAutograd cache hits/misses/bypasses, and whether the step equalled eager.

    python bench/first_step.py                          # every workload
    python bench/first_step.py --workloads mlp_train gpt2 --runs cold warm
    python bench/first_step.py --workloads gpt2 --runs cold "new machine" --redis

Writes bench/out/first_step.json (and first_step.png with matplotlib).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import report
from columns import aligned, markdown as markdown_table
from fleet import fresh_store, redis_store

HERE = Path(__file__).resolve().parent
WORKLOADS = ("mlp_train", "gpt2", "llama", "gpt2_train")
RUNS = ("cold", "warm", "new machine")
FLAGS = ("off", "on")
# The split's parts, in the order a process meets them; the child names torch's and ours.
COMPILE_PARTS = ("Dynamo trace", "AOT/inductor compile", "C++ build", "kernel binary fetch", "kernel binary publish")
WARM_PARTS = ("warm start guards", "warm start key", "warm start load", "warm start install", "warm start proof",
              "warm start save")
STEP = "the step itself"


def run_child(workload: str, flag: str, machine: Path, store: str, steady_calls: int = 0) -> dict:
    """One process on ``machine``: its cache dir, and its temporary dir, where inductor keeps
    precompiled headers whatever the cache dir (``default_cache_dir()``)."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("TORCH_COMPILE_JOB_ID", "STABLEGUARDS_DISABLE") and not k.startswith("STABLEGUARDS_STORE")}
    (machine / "tmp").mkdir(parents=True, exist_ok=True)
    env.update(TORCHINDUCTOR_CACHE_DIR=str(machine / "cache"), TMPDIR=str(machine / "tmp"),
               STABLEGUARDS_STORE=store, PYTHONHASHSEED="random",
               TORCHDYNAMO_STABLE_GUARDS="1" if flag == "on" else "0", HF_HUB_OFFLINE="1")
    env.update(SG_STEADY_CALLS=str(steady_calls), SG_SPAWNED_AT=repr(time.time()))
    proc = subprocess.run([sys.executable, str(HERE / "_first_step_child.py"), workload], env=env,
                          capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"{workload} child failed:\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def measure(workload: str, flag: str, runs: list[str], tmp: Path, steady_calls: int = 0,
            redis_url: str | None = None) -> list[dict]:
    """The runs of one workload and flag, in order: cold first, on the dirs the others reuse,
    with a store of their own (a directory, or the Redis at ``redis_url`` emptied first)."""
    work = Path(tempfile.mkdtemp(prefix=f"{workload}-{flag}-", dir=tmp))
    # Named flag off too (torch ignores it), so that both flags run in the same environment.
    store = fresh_store("1", redis_url, work / "store")
    rows = []
    for run in ("cold", *[r for r in runs if r != "cold"]):
        machine = work / ("new-machine" if run == "new machine" else "machine")
        child = run_child(workload, flag, machine, store, steady_calls)
        if run in runs:
            rows.append({"workload": workload, "flag": flag, "run": run, **child})
    return rows


def split(row: dict) -> dict[str, float]:
    """The row's wall time by part: phases before compiling, then each named part of the two
    compiling phases, summed, and what is left of those phases as "other"."""
    phases, parts = row["phases"], row["parts"]
    out = {"start+import": phases["start"] + phases["import"], "build": phases["build"]}
    for name in (*COMPILE_PARTS, *WARM_PARTS, STEP):
        out[name] = sum(p.get(name, 0.0) for p in parts.values())
    named = sum(sum(p.values()) for p in parts.values())
    out["other"] = phases["torch.compile()"] + phases["first step"] - named
    return out


def _cold(rows: list[dict], row: dict) -> dict:
    return next(r for r in rows if r["workload"] == row["workload"] and r["flag"] == row["flag"]
                and r["run"] == "cold" and r.get("repeat", 0) == row.get("repeat", 0))


def _median(values: list[float]) -> float:
    return statistics.median(values)


def columns(rows: list[dict]) -> tuple:
    def part(name: str, label: str | None = None, digits: int = 2):
        return label or name, lambda r: f"{split(r)[name]:.{digits}f}"

    return (
        ("workload", lambda r: r["workload"]),
        ("flag", lambda r: r["flag"]),
        ("run", lambda r: r["run"]),
        ("store", lambda r: r.get("store", "directory")),
        ("wall s", lambda r: f"{r['wall_s']:.2f}"),
        ("/cold", lambda r: f"{r['wall_s'] / _cold(rows, r)['wall_s']:.3f}"),
        part("start+import"), part("build"),
        part("Dynamo trace"), part("AOT/inductor compile"), part("C++ build"),
        part("kernel binary fetch", "bin fetch"), part("kernel binary publish", "bin publish"),
        *(part(name, "ws " + name.removeprefix("warm start "), 3 if name.endswith("proof") else 2)
          for name in WARM_PARTS),
        part(STEP, "step"), part("other"),
        ("frames", lambda r: r["frames"]),
        ("fx h/m/b", lambda r: "/".join(map(str, r["fx"]))),
        ("aot h/m/b", lambda r: "/".join(map(str, r["aot"]))),
        ("ok", lambda r: "yes" if r["ok"] else "NO"),
    )


def ratios(rows: list[dict]) -> list[str]:
    """Flag on against off, cold; and each restart against its own cold run: medians over the
    repeats (``--repeat``), each of which ran flag off and on in turn."""
    lines = []
    for workload in dict.fromkeys(r["workload"] for r in rows):
        walls: dict[tuple[str, str], list[float]] = {}
        for r in rows:
            if r["workload"] == workload:
                walls.setdefault((r["flag"], r["run"]), []).append(r["wall_s"])
        wall = {k: _median(v) for k, v in walls.items()}
        if ("off", "cold") in wall and ("on", "cold") in wall:
            lines.append(f"{workload}: cold, flag on / off = {wall['on', 'cold'] / wall['off', 'cold']:.3f}"
                         + (f" (medians of {len(walls['on', 'cold'])})" if len(walls["on", "cold"]) > 1 else ""))
        for flag in FLAGS:
            for run in RUNS[1:]:
                if (flag, run) in wall:
                    lines.append(f"{workload}: flag {flag}, {run} / cold = "
                                 f"{wall[flag, run] / wall[flag, 'cold']:.3f}")
    return lines


def steady(rows: list[dict]) -> list[str]:
    """Per call once compiled (``--steady-calls``): a restart's loaded entry (flag on) against
    torch's traced one (flag off), and each against its own cold run."""
    lines = []
    for workload in dict.fromkeys(r["workload"] for r in rows):
        us = {(r["flag"], r["run"]): r["per_call_us"] for r in rows
              if r["workload"] == workload and r.get("per_call_us")}
        if ("on", "warm") in us and ("off", "warm") in us:
            lines.append(f"{workload}: us per call, warm: flag on (loaded) {us['on', 'warm']:.0f} / flag off "
                         f"(traced) {us['off', 'warm']:.0f} = {us['on', 'warm'] / us['off', 'warm']:.3f}; "
                         f"cold (traced): on {us.get(('on', 'cold'), float('nan')):.0f}, "
                         f"off {us.get(('off', 'cold'), float('nan')):.0f}")
    return lines


def markdown(rows: list[dict]) -> str:
    """docs/benchmarks.md's table (``bench/report.py``)."""
    return markdown_table(columns(rows), rows) + "\n\n" + "\n".join(f"- {line}"
                                                                   for line in ratios(rows) + steady(rows))


def draw_chart(rows: list[dict], path: Path) -> bool:
    """Each run's wall time to first step, split; False if matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    groups = {"start, import, build": ("start+import", "build"), "compile": COMPILE_PARTS,
              "warm start": WARM_PARTS, "step and other": (STEP, "other")}
    colours = ("#b0b0b0", "#d9822b", "#2a7ab9", "#6a9a3a")
    labels = [f"{r['workload']}\n{r['run']}, {r['flag']}" for r in rows]
    fig, ax = plt.subplots(figsize=(2 + 0.75 * len(rows), 4.2))
    bottom = [0.0] * len(rows)
    for (group, names), colour in zip(groups.items(), colours, strict=True):
        heights = [sum(split(r)[n] for n in names) for r in rows]
        ax.bar(range(len(rows)), heights, bottom=bottom, color=colour, label=group)
        bottom = [b + h for b, h in zip(bottom, heights, strict=True)]
    ax.set_xticks(list(range(len(rows))), labels, fontsize=7)
    ax.set_ylabel("wall seconds, process start to first step done")
    ax.set_title("stableguards: time to first step, flag off vs on")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", nargs="+", default=list(WORKLOADS), choices=WORKLOADS)
    parser.add_argument("--runs", nargs="+", default=list(RUNS), choices=RUNS)
    parser.add_argument("--flags", nargs="+", default=list(FLAGS), choices=FLAGS)
    parser.add_argument("--repeat", type=int, default=1,
                        help="run each workload's processes this many times, flag off and on in turn; "
                             "ratios of medians")
    parser.add_argument("--steady-calls", type=int, default=0,
                        help="also time this many calls once compiled, per process (per call: the fastest fifth)")
    parser.add_argument("--redis", action="store_true", help="the shared store in a redis-server started here")
    parser.add_argument("--out", type=Path, default=HERE / "out")
    args = parser.parse_args(argv)
    import torch

    print(f"torch {torch.__version__}, inductor on CPU, {os.cpu_count()} cores; wall seconds from process "
          f"start to the first step done", flush=True)
    rows: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="sg-first-step-") as tmp, \
            redis_store(Path(tmp), required=args.redis) as url:
        for workload in args.workloads:
            for repeat, flag in itertools.product(range(args.repeat), args.flags):
                new = [{**row, "repeat": repeat, "store": "redis" if args.redis else "directory"}
                       for row in measure(workload, flag, args.runs, Path(tmp), args.steady_calls,
                                          url if args.redis else None)]
                rows += new
                print("\n".join(aligned(columns(rows), rows).splitlines()[-len(new):]), flush=True)
    print()
    print(aligned(columns(rows), rows))
    print("\n".join(ratios(rows) + steady(rows)))
    path = report.write(args.out, "first_step", rows, argv)
    charted = draw_chart(rows, args.out / "first_step.png")
    print(f"rows: {path}" + (f", chart: {args.out / 'first_step.png'}" if charted else " (no matplotlib: no chart)"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
