"""What the tests' child processes share: the environment a child is given, one runner that
reads what the child printed last as JSON, and the marker for tests that need warm start."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

# What a child never inherits from the caller: a job id or a disable switch of the developer's
# would change what the child's compiles find.
_NOT_INHERITED = ("TORCH_COMPILE_JOB_ID", "STABLEGUARDS_DISABLE")


def child_env(cache: Path | None, *, drop: tuple[str, ...] = (), **extra: str) -> dict[str, str]:
    """This process's environment for a child compiling in ``cache`` (None: the test's own),
    without the variables whose names start with one of ``drop``, with ``extra`` on top."""
    env = {k: v for k, v in os.environ.items() if k not in _NOT_INHERITED and not k.startswith(drop)}
    if cache is not None:
        env["TORCHINDUCTOR_CACHE_DIR"] = str(cache)
    env.update(PYTHONDONTWRITEBYTECODE="1", **extra)
    return env


def run_child(args: list, env: dict[str, str], **kwargs) -> dict:
    """``python *args`` in ``env``, which must exit 0 (its stderr's end is the message if not):
    the last line it printed, as JSON.  ``kwargs`` go to ``subprocess.run`` (cwd, timeout)."""
    proc = subprocess.run([sys.executable, *map(str, args)], env=env, capture_output=True, text=True, **kwargs)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return last_json(proc.stdout)


def gloo_job(args: list, env_of: Callable[[int, str], dict[str, str]], ranks: int = 2, **kwargs) -> list[dict]:
    """``python *args`` once per rank of a job on a free loopback port, with ``env_of(rank,
    port)`` as each rank's environment: what each rank printed last, as JSON, in rank order.
    Each must exit 0.  ``kwargs`` go to ``subprocess.Popen`` (cwd)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = str(s.getsockname()[1])
    procs = [subprocess.Popen([sys.executable, *map(str, args)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, env=env_of(rank, port), **kwargs) for rank in range(ranks)]
    results = []
    for proc in procs:
        out, err = proc.communicate(timeout=900)
        assert proc.returncode == 0, err[-4000:]
        results.append(last_json(out))
    return results


def last_json(stdout: str) -> dict:
    """What a child reports: the last line it printed, as JSON (torch may print before it)."""
    return json.loads(stdout.strip().splitlines()[-1])


def warm_start_available() -> bool:
    """Whether warm start's hooks are installed (torch's per-compile package bypass: 2.15)."""
    import torch._dynamo  # noqa: F401 - installs the hooks

    from stableguards.hooks import STATE

    return "warm_start" in STATE.installed


requires_warm_start = pytest.mark.skipif(not warm_start_available(),
                                         reason="warm start needs torch's per-compile package bypass (torch 2.15)")
