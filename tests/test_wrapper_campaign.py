"""A restarted distributed job whose wrapping changed is never served the cold job's code: a
generated campaign over the changes a restarted job could see.

Hypothesis draws a cold setting and what changed in the restart from a small grammar over
bench/_distributed_child.py's settings (--small: a 2-block transformer stack trained three
SGD steps): FSDP2 resharding after forward or not, its mixed-precision policy, activation
checkpointing under it, DDP's bucket cap, tensor parallel against FSDP2 + tensor parallel
(mesh and placements), the 2-D mesh's shape, the wrapper itself (DDP, FSDP2, none), and the
world size (2 ranks, restarted as 1).  Each case runs a cold job and a restarted job on one
store (each rank its own local cache dir, kept), flag on and flag off; every rank of both
equals the same wrapped model run uncompiled.  A change a restart must not be served the
cold code for shows as a wrong result on some rank if it were.

Size: STABLEGUARDS_WRAPPER_CAMPAIGN_CASES cases (CI: 1, the same case each run; with more,
from a random seed, printed).
"""

from __future__ import annotations

import dataclasses
import os
import random
from pathlib import Path

import pytest
import torch
from _children import child_env, gloo_job, requires_warm_start
from _drawing import draw
from hypothesis import strategies as st

CHILD = Path(__file__).parents[1] / "bench" / "_distributed_child.py"
CASES = int(os.environ.get("STABLEGUARDS_WRAPPER_CAMPAIGN_CASES", "1"))

# A setting and the knobs it is run with (environment), by name.
SETTINGS = {
    "single": ("single", {}),
    "ddp": ("ddp_plain", {}),
    "ddp_big_buckets": ("ddp_plain", {"SG_BUCKET_MB": "25"}),
    "fsdp2": ("fsdp2", {}),
    "fsdp2_keep": ("fsdp2_keep", {}),
    "fsdp2_mp": ("fsdp2_mp", {}),
    "fsdp2_ac": ("fsdp2_ac", {}),
    "tp": ("tp", {}),
    "fsdp2_tp": ("fsdp2_tp", {}),
    "fsdp2_tp_2x1": ("fsdp2_tp", {"SG_MESH_DP": "2"}),
}
# What a restart may change, from each cold setting.
CHANGES = {
    "single": ("ddp", "fsdp2", "tp"),
    "ddp": ("ddp_big_buckets", "fsdp2", "single"),
    "ddp_big_buckets": ("ddp",),
    "fsdp2": ("fsdp2_keep", "fsdp2_mp", "fsdp2_ac", "ddp"),
    "fsdp2_keep": ("fsdp2",),
    "fsdp2_mp": ("fsdp2",),
    "fsdp2_ac": ("fsdp2",),
    "tp": ("fsdp2_tp", "single"),
    "fsdp2_tp": ("tp", "fsdp2_tp_2x1"),
    "fsdp2_tp_2x1": ("fsdp2_tp",),
}
WORLD_CHANGES = ("single", "ddp", "fsdp2", "fsdp2_keep", "fsdp2_mp", "fsdp2_ac", "tp")


@dataclasses.dataclass(frozen=True)
class Case:
    name: str
    cold: str
    warm: str
    warm_world: int  # 2, or 1: the job restarted on one rank


def cases() -> st.SearchStrategy[Case]:
    def restart(cold: str) -> st.SearchStrategy[Case]:
        worlds = st.sampled_from((2, 1)) if cold in WORLD_CHANGES else st.just(2)
        return st.builds(Case, st.just("case"), st.just(cold), st.sampled_from((cold, *CHANGES[cold])), worlds)
    return st.sampled_from(sorted(SETTINGS)).flatmap(restart)


def _job(root: Path, run: str, flag: str, name: str, world: int) -> list[dict]:
    setting, knobs = SETTINGS[name]
    return gloo_job([CHILD, "--small", "inductor", setting], lambda rank, port: child_env(
        root / f"flag{flag}-rank{rank}", drop=("STABLEGUARDS_", "SG_"), TORCHDYNAMO_STABLE_GUARDS=flag,
        STABLEGUARDS_STORE=str(root / f"store-flag{flag}"), RANK=str(rank), WORLD_SIZE=str(world),
        MASTER_ADDR="127.0.0.1", MASTER_PORT=port, OMP_NUM_THREADS="1", **knobs), ranks=world, cwd=CHILD.parent)


@requires_warm_start
@pytest.mark.skipif(not torch.distributed.is_available(), reason="torch.distributed is not built")
def test_a_restart_whose_wrapping_changed_is_right_on_every_rank(tmp_path_factory):
    # 10: a 2 x 1 mesh restarted as 1 x 2 (FSDP2 + tensor parallel: mesh, placements and groups change).
    seed = 10 if CASES == 1 else random.randrange(2**32)
    batch = draw(cases(), CASES, seed, tries=6)
    print(f"seed {seed}: {batch}")  # shown if anything below fails
    for case in batch:
        root = tmp_path_factory.mktemp("wrapping")
        for flag in ("1", "0"):
            cold = _job(root, "cold", flag, case.cold, 2)
            warm = _job(root, "warm", flag, case.warm, case.warm_world)
            for label, job, name in (("cold", cold, case.cold), ("warm", warm, case.warm)):
                for rank, result in enumerate(job):
                    outcome = result["settings"][SETTINGS[name][0]]
                    assert outcome["ok"], (case, flag, label, rank, result["explain"])
