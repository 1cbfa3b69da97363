"""The demo's programs, run as a user runs them: fresh processes, results read as JSON.

Tests use bench/ only through its command lines, never by importing it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from _children import last_json

BENCH = Path(__file__).resolve().parent.parent / "bench"
# The demo's workloads (bench/workloads.py), named here so tests can be parametrized.
WORKLOADS = ("closure", "dict_collide", "list_overmarked", "seed")


def restart_ab(workload: str, backend: str, config: str, job_id: str,
               extra_env: dict[str, str] | None = None) -> dict:
    """One row of bench/restart_ab.py, through its command line: a cold and a warm process
    sharing a cache dir it makes."""
    with tempfile.TemporaryDirectory(prefix="sg-test-ab-") as out:
        command = [sys.executable, str(BENCH / "restart_ab.py"), "--workloads", workload, "--configs", config,
                   "--job-id", job_id, "--backend", backend, "--out", out]
        for name, value in (extra_env or {}).items():
            command += ["--env", f"{name}={value}"]
        _run(command, os.environ)
        (row,) = json.loads((Path(out) / "restart_ab.json").read_text())["rows"]
    return row


# bench/restart_ab.py's configurations and job ids, as the environment each sets.
CONFIGS = {"off": {"TORCHDYNAMO_STABLE_GUARDS": "0"}, "on": {"TORCHDYNAMO_STABLE_GUARDS": "1"},
           "on, symbols off": {"TORCHDYNAMO_STABLE_GUARDS": "1", "STABLEGUARDS_DISABLE": "symbols"}}
JOB_IDS = {"set": {"TORCH_COMPILE_JOB_ID": "stableguards-restart-ab"}, "unset": {}}


def cold_and_warm(workload: str, backend: str, config: str, job_id: str,
                  extra_env: dict[str, str] | None = None) -> dict:
    """The same row as ``restart_ab``, its two processes started from here: their cache dir
    starts with the CPU probe the test process made (tests/conftest.py), where one that
    bench/restart_ab.py makes probes again (about 2.5 s of C++ builds a row)."""
    env = {**CONFIGS[config], **JOB_IDS[job_id], **(extra_env or {})}
    with tempfile.TemporaryDirectory(prefix="sg-test-ab-") as cache_dir:
        return {"cold": restart_child(workload, backend, cache_dir, env),
                "warm": restart_child(workload, backend, cache_dir, env)}


def restart_child(workload: str, backend: str, cache_dir: str | Path, env: dict[str, str]) -> dict:
    """One process of the demo (bench/_restart_child.py) with this cache dir and environment;
    ``workload`` may name several, joined by commas (then the result is keyed by workload)."""
    full = {k: v for k, v in os.environ.items()
            if k not in ("TORCH_COMPILE_JOB_ID", "STABLEGUARDS_DISABLE", "STABLEGUARDS_PGO_REDIS_URL")}
    full.update(TORCHINDUCTOR_CACHE_DIR=str(cache_dir), PYTHONHASHSEED="random")
    full.update(env)
    proc = _run([sys.executable, str(BENCH / "_restart_child.py"), workload, backend], full)
    result = last_json(proc.stdout)
    result["stderr"] = proc.stderr
    return result


def _run(command: list[str], env: os._Environ | dict[str, str]) -> subprocess.CompletedProcess:
    proc = subprocess.run(command, env=dict(env), capture_output=True, text=True)
    assert proc.returncode == 0, f"{' '.join(command[1:3])} failed:\n{proc.stderr[-4000:]}"
    return proc
