"""Compiled optimizer steps: Dynamo's compile, guard and per-step cost, flag off vs on.

For each optimizer (SGD with momentum=0.9, Adam, AdamW) and each N, N small
parameters (``Parameter(randn(8))`` with a grad) are stepped by
a compiled function that calls ``OPT.step()`` on a global; backend "eager" by default, so the
cost measured is Dynamo's, not a backend's.  Every (optimizer, N, flag) runs in
a fresh process (bench/_optimizer_child.py) with its own cache dir, so flag off
and on share no Dynamo state.  Off and on run back to back for each row, in
alternating order, so the on/off ratios compare like with like on a noisy,
shared machine.

    python bench/optimizer_table.py                       # everything (slow at N=2000)
    python bench/optimizer_table.py --optimizers Adam --sizes 10,100
    python bench/optimizer_table.py --timeout 3600 --reps 100

Where each number comes from (torch 2.13):

* compile: the steady-state ``step`` frame, i.e. the last compile of the frame
  named "step" in the 3 warm-up steps (SGD compiles it twice: its momentum
  buffers appear after the first step).  "trace s" and "guards s" are the
  ``dynamo_timed`` keys "bytecode_tracing" and "build_guards" of
  ``torch._dynamo.utils.compilation_time_metrics``, attributed to that compile
  by start/end callbacks of ``torch._dynamo.callback_handler``; "frame s" is
  ``CompilationMetrics.entire_frame_compile_time_s`` (the "_compile.compile_inner"
  / "entire_frame_compile" timer).  "guards" is ``CompilationMetrics.guard_count``.
* runtime: "check us" times ``guard_manager.check({"self": opt, "closure": None})``
  of the cache entry that passes (``_debug_get_cache_entry_list(code)``, code
  from ``torch._dynamo.convert_frame.input_codes``), under no_grad as inside
  ``step``; median per call.  ``CompilationMetrics.guard_latency_us`` (one cold
  check at compile time) is kept in the JSON only.  "ovh us" is the median
  compiled step minus the median eager ``opt.step()`` of an identical eager copy,
  interleaved in the same process after warm-up; "step/eager" is their ratio.
* schedule (``--schedules onecycle,plateau``): 100 steps of
  ``OneCycleLR(opt, max_lr=0.1, total_steps=100)``, which changes lr and
  momentum/betas every step, or of ``ReduceLROnPlateau(factor=0.5,
  patience=2)`` fed a constant metric (lr halves every 3 steps), with fresh
  grads each step.  "graphs" counts ``stats.unique_graphs`` built during the
  schedule, "recompiles" installed compiles of the "step" frame
  (``get_compilation_metrics()``, has_guarded_code); "limit" says whether torch
  warned "hit config.recompile_limit" (default limit 8) or a compile failed on
  it; "step/eager" is the median compiled step over the median eager step of
  the schedule; "==eager" is ``torch.allclose(rtol=1e-4, atol=1e-5)`` of every
  parameter against the eager copy, which took the same grads and schedule.
  With ``--backend inductor`` this is the run of issue 13:
  ``python bench/optimizer_table.py --backend inductor --schedules onecycle,plateau --sizes 10,100``.

Writes bench/out/optimizer_table.json (one row per child, errors included).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import report
from columns import aligned, markdown as markdown_table

HERE = Path(__file__).resolve().parent
DEFAULT_OUT = HERE / "out"
OPTIMIZERS = ("SGD", "Adam", "AdamW")
SIZES = (10, 100, 500, 2000)
FLAGS = {"off": "0", "on": "1"}

# Per table: (column, getter, numeric).  Numeric columns get off, on and on/off.
Getter = Callable[[dict], object]
Column = tuple[str, Getter, bool]
TABLES: dict[str, tuple[Column, ...]] = {
    "compile of the steady-state step frame": (
        ("trace s", lambda r: r["tracing_s"], True),
        ("guards s", lambda r: r["build_guards_s"], True),
        ("frame s", lambda r: r["entire_frame_compile_s"], True),
        ("guards", lambda r: r["guard_count"], True),
    ),
    "per step, after warm-up": (
        ("check us", lambda r: r["guard_check_us"], True),
        ("ovh us", lambda r: r["overhead_us"], True),
        ("step/eager", lambda r: r["overhead_ratio"], True),
    ),
    "100-step schedule": (
        ("graphs", lambda r: r["schedule_graphs"], True),
        ("recompiles", lambda r: r["schedule_step_compiles"], True),
        ("limit", lambda r: "HIT" if r["schedule_limit_hit"] else "no", False),
        ("step/eager", lambda r: r["schedule_step_ratio"], True),
        ("==eager", lambda r: "yes" if r["matches_eager"] else "NO", False),
    ),
}


def run_child(optimizer: str, n: int, backend: str, flag: str, reps: int, timeout: float,
              schedule: str) -> dict:
    """One fresh process; a crash or timeout comes back as {"error": ...}."""
    base = {"optimizer": optimizer, "n": n, "config": flag, "schedule": schedule}
    with tempfile.TemporaryDirectory(prefix="sg-opt-") as cache_dir:
        env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=cache_dir,
                   TORCHDYNAMO_STABLE_GUARDS=FLAGS[flag])
        try:
            proc = subprocess.run(
                [sys.executable, str(HERE / "_optimizer_child.py"), optimizer, str(n), backend,
                 str(reps), schedule],
                env=env, capture_output=True, text=True, timeout=timeout, check=False,
            )
        except subprocess.TimeoutExpired:
            return {**base, "error": f"timeout after {timeout:g} s"}
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["no stderr"])[-1]
        return {**base, "error": f"exit {proc.returncode}: {last[:200]}",
                "stderr": proc.stderr[-4000:]}
    try:
        return {**base, **json.loads(proc.stdout.strip().splitlines()[-1])}
    except (json.JSONDecodeError, IndexError):
        return {**base, "error": "no JSON on stdout", "stdout": proc.stdout[-2000:]}


def fmt(value: object) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.3g}" if abs(value) < 1000 else f"{value:.0f}"
    return str(value)


def cell(result: dict, get: Getter) -> object:
    if "error" in result:
        return "ERR"
    try:
        return get(result)
    except (KeyError, TypeError):
        return None


def ratio(off: object, on: object) -> str:
    if isinstance(off, (int, float)) and isinstance(on, (int, float)) and off:
        return f"{on / off:.2f}"
    return "-"


def pair_columns(columns: tuple[Column, ...], errors: bool) -> list[tuple[str, Callable]]:
    """The columns of a table over (off, on) pairs: optimizer, N; off, on (and on/off) per column."""
    out = [("optimizer", lambda p: p[0]["optimizer"]), ("N", lambda p: p[0]["n"])]
    for name, get, numeric in columns:
        out += [(f"{name} off", lambda p, get=get: fmt(cell(p[0], get))),
                (f"{name} on", lambda p, get=get: fmt(cell(p[1], get)))]
        if numeric:
            out.append((f"{name} on/off", lambda p, get=get: ratio(cell(p[0], get), cell(p[1], get))))
    if errors:
        out.append(("errors", lambda p: "; ".join(f"{r['config']}: {r['error']}" for r in p if "error" in r)))
    return out


def tables(rows: list[dict], table: Callable) -> str:
    """Every table of TABLES for each schedule in ``rows``, made by ``table(columns, pairs)``."""
    out = []
    for schedule in dict.fromkeys(r["schedule"] for r in rows):
        pairs: dict[tuple, dict] = {}
        for r in rows:
            if r["schedule"] == schedule:
                pairs.setdefault((r["optimizer"], r["n"]), {})[r["config"]] = r
        for i, (title, columns) in enumerate(TABLES.items()):
            body = table(pair_columns(columns, errors=i == 0), [(p["off"], p["on"]) for p in pairs.values()])
            out.append(f"### {title} ({schedule})\n\n{body}")
    return "\n\n".join(out)


def markdown(rows: list[dict]) -> str:
    """docs/benchmarks.md's tables (``bench/report.py``)."""
    return tables(rows, markdown_table)


def measure_row(optimizer: str, n: int, backend: str, reps: int, timeout: float,
                on_first: bool, schedule: str) -> tuple[dict, dict]:
    order = ("on", "off") if on_first else ("off", "on")
    results = {flag: run_child(optimizer, n, backend, flag, reps, timeout, schedule) for flag in order}
    for flag in order:
        r = results[flag]
        status = r.get("error") or f"frame {fmt(r.get('entire_frame_compile_s'))} s"
        print(f"  {optimizer} N={n} flag {flag}: {status}", file=sys.stderr, flush=True)
    return results["off"], results["on"]


def csv(kind: type) -> Callable[[str], list]:
    return lambda text: [kind(item) for item in text.split(",") if item]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--optimizers", type=csv(str), default=list(OPTIMIZERS))
    parser.add_argument("--sizes", type=csv(int), default=list(SIZES))
    parser.add_argument("--backend", default="eager")
    parser.add_argument("--reps", type=int, default=50, help="timed steps per configuration")
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds per child process")
    parser.add_argument("--schedules", type=csv(str), default=["onecycle"],
                        help="onecycle (lr, momentum/betas every step), plateau (ReduceLROnPlateau)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args(argv)
    unknown = set(args.optimizers) - set(OPTIMIZERS)
    if unknown:
        parser.error(f"unknown optimizers {sorted(unknown)}; choose from {', '.join(OPTIMIZERS)}")

    rows = []
    for schedule in args.schedules:
        pairs = []
        for optimizer in args.optimizers:
            for n in args.sizes:
                pairs.append(measure_row(optimizer, n, args.backend, args.reps, args.timeout,
                                         on_first=len(pairs) % 2 == 1, schedule=schedule))
        measured = [r for pair in pairs for r in pair]
        print(f"backend={args.backend}, schedule={schedule}, {args.reps} timed steps; "
              f"on/off = flag on / flag off\n")
        print(tables(measured, aligned), end="\n\n", flush=True)
        rows += measured
    print(f"rows: {report.write(args.out, 'optimizer_table', rows, argv)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
