"""bench/first_step.py, the demo's table: every figure a wall clock, and its split adds up to it."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from _children import warm_start_available

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "bench"


@pytest.fixture(scope="module")
def bench_run(tmp_path_factory) -> tuple[str, list[dict]]:
    """A cold and a warm process of the MLP training step, flag on: the table printed, the rows."""
    out = tmp_path_factory.mktemp("first-step")
    proc = subprocess.run([sys.executable, str(BENCH / "first_step.py"), "--workloads", "mlp_train",
                           "--flags", "on", "--runs", "cold", "warm", "--out", str(out)],
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-4000:]
    data = json.loads((out / "first_step.json").read_text())
    assert set(data["header"]) == {"command", "commit", "torch", "cpu", "date", "bench"}
    return proc.stdout, data["rows"]


def test_the_split_adds_up_to_the_wall_clock_within_a_tenth(bench_run):
    _, rows = bench_run
    assert [r["run"] for r in rows] == ["cold", "warm"]
    for row in rows:
        phases, parts = row["phases"], row["parts"]
        # The phases are stamps of one clock from the spawn on: they are the wall figure.
        assert sum(phases.values()) == pytest.approx(row["wall_s"], rel=1e-6)
        assert all(seconds >= 0 for seconds in phases.values())
        # The named parts of the compiling phases leave at most a tenth of the wall unnamed.
        named = phases["start"] + phases["import"] + phases["build"] + sum(sum(p.values()) for p in parts.values())
        assert named <= row["wall_s"] * 1.001
        assert named >= 0.9 * row["wall_s"], (row["phases"], row["parts"])
        assert row["ok"]
    cold, warm = rows
    assert cold["frames"] > 0 and cold["parts"]["first step"].get("Dynamo trace", 0) > 0
    if warm_start_available():
        assert warm["frames"] == 0 and "warm start install" in warm["parts"]["torch.compile()"]


def test_every_time_the_demo_prints_is_a_wall_clock(bench_run):
    stdout, _ = bench_run
    demo = re.search(r"^    demo\)\n(.*?);;", (ROOT / "dev.sh").read_text(), re.S | re.M).group(1)
    assert re.findall(r"bench/(\w+)\.py", demo) == ["first_step"]
    # Its seconds come from stamps and wall timers, never from torch's compile-time metrics,
    # which leave out what a warm start does (the load, the proof, the kernels' builds).
    for script in ("first_step.py", "_first_step_child.py"):
        source = (BENCH / script).read_text()
        for metric in ("compilation_time_metrics", "get_compilation_metrics", "entire_frame_compile", "compile_s"):
            assert metric not in source, (script, metric)
    header = next(line for line in stdout.splitlines() if line.lstrip().startswith("workload"))
    assert "wall s" in header and "other" in header and "step" in header
