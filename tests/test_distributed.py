"""Distributed training across a restart, flag on: two gloo ranks on CPU, each with its own empty
cache dir, sharing one store, run one job with several settings (bench/_distributed_child.py
--small: a 2-block transformer stack trained three SGD steps, compared with the same wrapped
model uncompiled).  Cold, then a restart: every rank equals its uncompiled run; FSDP2 and tensor
parallel trace nothing in the restart, compiled collectives nothing or say why; a frame DDP's graph split
compiles is traced again and named in explain() with why; DDP with a compiled optimizer step
finishes (no rank waits on a lease another rank holds across a collective) and is right.
(bench/distributed.py measures every setting, flag off beside on.)"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from _children import child_env, gloo_job, requires_warm_start

CHILD = Path(__file__).parents[1] / "bench" / "_distributed_child.py"
# One job per model wrapping: a process serves a code object the entries of one key, so tensor
# parallel compiling Stack.forward after FSDP2 in the same process would compile it again.
# ddp_optim after tensor parallel (it traces Stack.forward again): rank 0 holds its entry's lease
# until its backward compiles, whose all-reduce needs rank 1; rank 1 must not wait on that lease.
JOBS = (("collectives", "fsdp2", "ddp"), ("tp", "ddp_optim"))


def _job(root: Path, run: str) -> list[dict]:
    """Each of JOBS, merged per rank."""
    ranks = [_one(root, run, settings) for settings in JOBS]
    return [{"settings": {k: v for job in jobs for k, v in job["settings"].items()},
             "explain": "\n".join(job["explain"] for job in jobs)} for jobs in zip(*ranks, strict=True)]


def _one(root: Path, run: str, settings: tuple[str, ...]) -> list[dict]:
    return gloo_job([CHILD, "--small", "inductor", *settings], lambda rank, port: child_env(
        root / f"{run}-{settings[0]}-{rank}", drop=("STABLEGUARDS_",), TORCHDYNAMO_STABLE_GUARDS="1",
        STABLEGUARDS_STORE=str(root / "store"), RANK=str(rank), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1",
        MASTER_PORT=port, OMP_NUM_THREADS="1"), cwd=CHILD.parent)


@requires_warm_start
@pytest.mark.skipif(not torch.distributed.is_available(), reason="torch.distributed is not built")
def test_a_restarted_distributed_job_starts_warm_on_every_rank(tmp_path):
    cold = _job(tmp_path, "cold")
    warm = _job(tmp_path, "warm")
    for label, job in (("cold", cold), ("warm", warm)):
        for rank, result in enumerate(job):
            wrong = [s for s, r in result["settings"].items() if not r["ok"]]
            assert not wrong, (label, rank, wrong, result["explain"])
    for rank, result in enumerate(warm):
        settings = result["settings"]
        assert settings["fsdp2"]["traced"] == [] and settings["tp"]["traced"] == [], (rank, result)
        # DDPOptimizer's frames are traced again, each named with why.
        left_out = result["explain"].count("compiled under DDP's graph split (DDPOptimizer)")
        assert settings["ddp"]["traced"] and left_out >= len(settings["ddp"]["traced"]), (rank, result["explain"])
        # Compiled collectives start warm, unless torch.compiler.config's compile_on_one_rank was set
        # (to its default) in one process and not in the other: Dynamo guards the type of what the
        # variable holds, and the entry is not used, with that guard named.
        if settings["collectives"]["traced"]:
            assert "compile_on_one_rank'].user_override" in result["explain"], (rank, result["explain"])
