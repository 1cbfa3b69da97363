"""One rank of the shared-store rank tests: a gloo process group on CPU, a function whose
graph bakes in the rank and world size, and one that does not.

    RANK=r WORLD_SIZE=n MASTER_ADDR=127.0.0.1 MASTER_PORT=p python tests/_rank_child.py

Prints one JSON line: whether outputs equalled eager, the frames Dynamo traced (by code
name), explain().
"""

from __future__ import annotations

import json

import torch
import torch.distributed as dist

import stableguards
from _traced import names as traced


def per_rank(x):
    return x * (dist.get_rank() + 1) + dist.get_world_size()


def shared(x):
    return (x.sin() * 2 + 1).cos()


def main() -> dict:
    dist.init_process_group("gloo")
    x = torch.randn(8, generator=torch.Generator().manual_seed(0))
    ok = True
    with torch.no_grad():
        for fn in (per_rank, shared):
            ok &= bool(torch.allclose(torch.compile(fn)(x), fn(x)))
    dist.barrier()
    dist.destroy_process_group()
    return {"ok": ok, "traced": traced(), "explain": stableguards.explain()}


if __name__ == "__main__":
    print(json.dumps(main()))
