"""No rank is served another rank's code: a generated campaign over programs that fold a rank's
place in its job into their graphs.

Hypothesis draws functions from a small grammar: a value Dynamo folds into the graph without a
guard (``get_rank()``, ``get_world_size()``, ``is_initialized()``, a process group's ranks and
its ``rank()``, a device mesh's rank, local rank, coordinate and size, whether CUDA is there; or
a plain constant), one or two of them summed, computed in the frame
or in a helper Dynamo inlines, and used to scale, shift, branch or slice.  Two gloo ranks
(CPU), each with an empty cache dir of its own, share one store: cold, then warm, then warm
again after every per-rank entry in the store was replaced by rank 0's (a store that lies).
Checked in every run: each result equals eager on its rank; the rank-dependent programs do
differ between the ranks (so serving rank 0's code to rank 1 would show); warm, every frame
starts warm or was left out of warm start with a reason.

Size: STABLEGUARDS_RANK_CAMPAIGN_CASES cases per batch (CI: 8), STABLEGUARDS_RANK_CAMPAIGN_BATCHES
batches (CI: 1, the same cases each run; with more, each from a random seed, printed).
"""

from __future__ import annotations

import dataclasses
import os
import random
from pathlib import Path

import pytest
from _children import gloo_job, requires_warm_start
import torch
from _drawing import draw
from hypothesis import strategies as st

CHILD = Path(__file__).with_name("_rank_campaign_child.py")
CASES = int(os.environ.get("STABLEGUARDS_RANK_CAMPAIGN_CASES", "8"))
BATCHES = int(os.environ.get("STABLEGUARDS_RANK_CAMPAIGN_BATCHES", "1"))
WORLD = 2

# name: (expression, whether its value differs between the ranks)
FOLDS = {
    "rank": ("dist.get_rank()", True),
    "rank_parity": ("dist.get_rank() % 2", True),
    "world": ("dist.get_world_size()", False),
    "initialized": ("int(dist.is_initialized())", False),
    "group_size": ("len(dist.get_process_group_ranks(dist.group.WORLD))", False),
    "place_in_group": ("dist.get_process_group_ranks(dist.group.WORLD).index(dist.get_rank())", True),
    "group_rank": ("dist.group.WORLD.rank()", True),  # a member Dynamo folds on the real group
    "cuda": ("int(torch.cuda.is_available())", False),
    # A device mesh over the world (MESH, made by the child): members torch evaluates on the real
    # mesh and folds without a guard.
    "mesh_rank": ("MESH.get_rank()", True),
    "mesh_local_rank": ("MESH.get_local_rank()", True),
    "mesh_coordinate": ("MESH.get_coordinate()[0]", True),
    "mesh_size": ("MESH.size()", False),
    "constant": ("1", False),
}
USES = {
    "scale": "x * ({v} + 1)",
    "shift": "x + {v}",
    "branch": "(x.sin() if {v} == 0 else x.cos())",
    "slice": "x[: {v} + 1].sum() * x",
}


@dataclasses.dataclass(frozen=True)
class Case:
    name: str
    folds: tuple[str, ...]
    use: str
    helper: bool  # the value computed in a function Dynamo inlines

    def rank_dependent(self) -> bool:
        return any(FOLDS[f][1] for f in self.folds)

    def source(self) -> str:
        value = " + ".join(FOLDS[f][0] for f in self.folds)
        use = USES[self.use].format(v="v")
        if self.helper:
            return (f"def _value_{self.name}():\n    return {value}\n\n\n"
                    f"def {self.name}(x):\n    v = _value_{self.name}()\n    return {use}\n")
        return f"def {self.name}(x):\n    v = {value}\n    return {use}\n"


def cases() -> st.SearchStrategy[Case]:
    return st.builds(Case, name=st.just("case"), folds=st.lists(st.sampled_from(sorted(FOLDS)), min_size=1,
                                                                 max_size=2).map(tuple),
                     use=st.sampled_from(sorted(USES)), helper=st.booleans())



def _ranks(root: Path, run: str, names: list[str]) -> list[dict]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("STABLEGUARDS_")}
    env.update(TORCHDYNAMO_STABLE_GUARDS="1", STABLEGUARDS_STORE=str(root / "store"), PYTHONHASHSEED="random",
               PYTHONDONTWRITEBYTECODE="1", WORLD_SIZE=str(WORLD), MASTER_ADDR="127.0.0.1")
    return gloo_job([CHILD, root / "src", *names], lambda rank, port: {
        **env, "MASTER_PORT": port, "RANK": str(rank), "TORCHINDUCTOR_CACHE_DIR": str(root / f"{run}-{rank}")},
        ranks=WORLD)


def _lie(store: Path) -> int:
    """Every per-rank entry (``<key>.<variant>``) replaced by the first variant of its key."""
    refs = sorted((store / "refs" / "warm_start").glob("*.*"))
    by_key: dict[str, list[Path]] = {}
    for ref in refs:
        by_key.setdefault(ref.name.split(".")[0], []).append(ref)
    replaced = 0
    for first, *others in by_key.values():
        for other in others:
            other.write_bytes(first.read_bytes())
            replaced += 1
    return replaced


@requires_warm_start
@pytest.mark.skipif(not torch.distributed.is_available(), reason="torch.distributed is not built")
@pytest.mark.parametrize("batch_index", range(BATCHES))
def test_no_rank_is_served_another_ranks_code(batch_index, tmp_path_factory):
    seed = 3 if BATCHES == 1 else random.randrange(2**32)  # 3: a mix of every kind of fold and use
    batch = draw(cases(), CASES, seed, tries=6)
    # Always one case that folds a group's rank() alone: nothing else keeps its entry per rank.
    batch.append(Case(name=f"case{len(batch)}", folds=("group_rank",), use="scale", helper=False))
    # And one that reads a device mesh's coordinate alone: torch folds the mesh's members unguarded.
    batch.append(Case(name=f"case{len(batch)}", folds=("mesh_coordinate",), use="shift", helper=False))
    root = tmp_path_factory.mktemp("ranks")
    (root / "src").mkdir()
    (root / "src" / "rank_cases.py").write_text("import torch\nimport torch.distributed as dist\n\nMESH = None\n\n\n"
                                                + "\n\n".join(c.source() for c in batch))
    names = [c.name for c in batch]
    print(f"seed {seed}: {batch}")  # shown if anything below fails
    cold = _ranks(root, "cold", names)
    warm = _ranks(root, "warm", names)
    replaced = _lie(root / "store")
    lied = _ranks(root, "lied", names)
    for label, run in (("cold", cold), ("warm", warm), ("lied", lied)):
        for rank, result in enumerate(run):
            wrong = [n for n, r in result["cases"].items() if not r["matches"]]
            assert not wrong, (label, rank, wrong, result["explain"])
    differ = [c for c in batch if len({r["cases"][c.name]["eager"] for r in cold}) > 1]
    assert all(c.rank_dependent() for c in differ), differ  # only a rank makes the ranks differ
    # Where the ranks' answers differ, rank 0's code would give rank 1 a wrong one: the lie bites.
    # (A branch on ``v == 0`` may take one side on both ranks; the other uses always differ.)
    assert all(c in differ for c in batch if c.rank_dependent() and c.use != "branch"), (batch, differ)
    for case in batch:
        for rank, result in enumerate(warm):
            if result["cases"][case.name]["traced"]:  # only a frame left out of warm start, with its reason
                left_out = [line for line in cold[rank]["explain"].splitlines()
                            if f"{case.name} (rank_cases.py" in line and "left out" in line]
                assert left_out, (case, rank, cold[rank]["explain"])
    print(f"cases whose ranks differ: {[c.name for c in differ]}; per-rank entries replaced: {replaced}")
