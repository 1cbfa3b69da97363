"""One rank of the generated rank campaign (tests/test_rank_campaign.py): a gloo process group
on CPU; compiles every case of the generated module ``rank_cases`` and compares it with eager.

    RANK=r WORLD_SIZE=n MASTER_ADDR=127.0.0.1 MASTER_PORT=p python tests/_rank_campaign_child.py SRC NAMES...

Prints one JSON line: per case, whether the compiled result equalled eager, eager's result
(a number) and whether Dynamo traced the case's frame; and explain().
"""

from __future__ import annotations

import importlib
import json
import sys

import torch
import torch.distributed as dist

import stableguards
from _traced import names as traced


def main(src: str, names: list[str]) -> dict:
    sys.path.insert(0, src)
    cases = importlib.import_module("rank_cases")
    dist.init_process_group("gloo")
    from torch.distributed.device_mesh import init_device_mesh

    cases.MESH = init_device_mesh("cpu", (dist.get_world_size(),))
    x = torch.randn(8, generator=torch.Generator().manual_seed(0))
    results = {}
    with torch.no_grad():
        for name in names:
            fn = getattr(cases, name)
            expected = fn(x)
            before = len(traced())
            got = torch.compile(fn)(x)
            results[name] = {"matches": bool(torch.allclose(got, expected)), "eager": float(expected.sum()),
                             "traced": len(traced()) > before}
    dist.barrier()
    dist.destroy_process_group()
    return {"cases": results, "explain": stableguards.explain()}


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1], sys.argv[2:])))
