"""One rank of the fleet bench: a gloo process group on CPU, a 4-layer transformer encoder
compiled and run (no grad), and a function that folds the rank into its graph.

    RANK=r WORLD_SIZE=n MASTER_ADDR=127.0.0.1 MASTER_PORT=p python bench/_fleet_child.py

The environment (cache dir, flag, store) is set by bench/fleet.py.  Prints one JSON line:
compile seconds (torch.compile() and the first calls, minus steady calls), frames Dynamo traced, whether outputs
equalled eager.
"""

from __future__ import annotations

import json
import time

import torch
import torch.distributed as dist

import stableguards  # noqa: F401 - installs the flag's machinery
from _traced import names as traced


def per_rank(x):
    return x.sin() * (dist.get_rank() + 1)


def main() -> dict:
    from torch._inductor import compile_fx  # noqa: F401 - importing inductor is left out of the timings

    dist.init_process_group("gloo")
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(64, 4, 128, dropout=0.0, batch_first=True)
    # train(): the eval fast path is one fused op (nothing to compile); dropout is 0.
    model = torch.nn.TransformerEncoder(layer, 4, enable_nested_tensor=False).train()
    x = torch.randn(2, 16, 64, generator=torch.Generator().manual_seed(1))

    def run(m, f):
        return [m(x), f(x)]

    with torch.no_grad():
        # torch.compile() is timed too: with the flag it is where a rank waits for the entry
        # another one is compiling.
        start = time.perf_counter()
        compiled_model, compiled_rank = torch.compile(model), torch.compile(per_rank)
        got = run(compiled_model, compiled_rank)
        first = time.perf_counter() - start
        start = time.perf_counter()
        run(compiled_model, compiled_rank)
        steady = time.perf_counter() - start
        ok = all(torch.allclose(a, b, rtol=1e-4, atol=1e-5) for a, b in zip(got, run(model, per_rank), strict=True))
    dist.barrier()
    dist.destroy_process_group()
    return {"compile_s": first - steady, "frames": len(traced()), "ok": ok}


if __name__ == "__main__":
    print(json.dumps(main()))
